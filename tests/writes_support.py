"""Outcome writes for tests that drive the port by hand: the constructor of core/writes.py for a
state word, as a worker's finish would make it (the port refuses any other write)."""

from __future__ import annotations

from workledger.core import writes
from workledger.core.states import Actor
from workledger.core.writes import Write

_BY_STATE = {"processed": writes.completed, "failed": writes.failed,
             "skipped": writes.skipped, "pending": writes.retried,
             "unknown": writes.left_unknown}


def write_of(state: str, last: bool = True, record: bool = False, stage: str = "s") -> Write:
    """A worker's write into ``state``; ``last``: of the unit's last stage (a processed item
    of another stage is handed on and adds no unit)."""
    return _BY_STATE[state](Actor.WORKER, stage, last, record)
