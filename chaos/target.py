"""What a fault is done to: the parts of a round (rounds.py) that faults.py reaches.

faults.py takes a :class:`Target`, the round hands itself in; so the round imports the faults
and the faults import only this, never the round back.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from plan import RoundPlan, RunPlan
from processes import Proc


@dataclass
class Slot:
    """A process a supervisor keeps running: restarted after it exits, with backoff."""

    role: str
    args: list[str]
    proc: Proc | None = None
    start_at: float = 0.0
    backoff: float = 0.2
    failpoint: str | None = None
    proxied: bool = False  # through the lost-acknowledgement proxy, when the round has one
    broker: bool = False  # an ``rq worker`` of the round's queue (broker.py)


class Target(Protocol):
    """A round as a fault sees it: its processes, its server, its control folder, its log."""

    plan: RoundPlan
    backend: Any  # backend.py's SqliteBackend or PostgresBackend: up, terminate, restart
    url: str
    control: Path  # files the chaos app reads: refuse_until, hang.N
    sink: Path  # the effects sink (sink.py): where a fault that cuts sessions is recorded
    hang_seconds: float
    sweeper_slot: Slot
    armed: int  # failpoints carried by processes started for them
    threads: list[threading.Thread]  # joined when the round stops
    proxy: Any  # proxy.py's CommitCutter, in a round that loses acknowledgements; else None
    broker: Any  # broker.py's RQBroker, in a round through a broker; else None
    refuse_for: Any

    def live(self, role: str) -> list[Proc]: ...

    def counted(self, kind: str, end: float, role: str | None = None,
                count: bool = True) -> None: ...

    def start_worker(self, failpoint: str | None = None, skew: str | None = None,
                     partitioned: bool = False) -> Proc: ...

    def submit(self, run: RunPlan, key: str, variant: int,
               failpoint: str | None = None) -> None: ...

    def log(self, line: str) -> None: ...
