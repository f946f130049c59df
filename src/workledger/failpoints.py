"""Named failpoints at durable boundaries, inert unless ``WORKLEDGER_FAILPOINTS`` names them.

``WORKLEDGER_FAILPOINTS="name:n:action,..."`` makes the n-th hit of ``name`` in this process
``exit`` (``os._exit(137)``), ``raise`` (:class:`FailpointHit`) or ``sleep:SECONDS``. ``n`` may be
``*`` for every hit. The names are listed in ``POINTS`` and in ``docs/failpoints.md``.
"""

from __future__ import annotations

import os
import threading
import time

POINTS = (
    "submit.after_commit",  # the run row is durable, nothing decomposed yet
    "decompose.after_batch",  # a batch of item rows is durable, the run is not marked
    "decompose.before_mark",  # every row is durable, the run is not marked decomposed
    "decompose.after_mark",  # the run is marked decomposed, the submitter has not returned
    "claim.after_commit",  # a chunk is claimed under a lease, no handler has run
    "complete.before_commit",  # a chunk's outcomes are written, not committed
    "handoff.before_commit",  # next-stage rows written with the outcomes, not committed
    "complete.after_commit",  # a chunk's outcomes are committed
    "reclaim.before_commit",  # expired leases moved, not committed
    "reclaim.after_commit",  # expired leases moved and committed
    "closing.after_hook",  # the closing hook ran, its completion is not recorded
    "reconcile.before_commit",  # a repaired projection written, not committed
    "dispatch.before_publish",  # items committed and owed a message, the broker not told yet
)


class FailpointHit(RuntimeError):
    pass


_lock = threading.Lock()
_hits: dict[str, int] = {}
_spec_cache: tuple[str, dict[str, list[tuple[str, str]]]] | None = None


def _parse(spec: str) -> dict[str, list[tuple[str, str]]]:
    table: dict[str, list[tuple[str, str]]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, rest = part.partition(":")
        nth, _, action = rest.partition(":")
        if name not in POINTS or not nth or not action:
            raise ValueError(f"bad failpoint {part!r}: want name:n:action with a name in {POINTS}")
        table.setdefault(name, []).append((nth, action))
    return table


def hit(name: str) -> None:
    """Count a pass through ``name``; act if the environment asks for it."""
    spec = os.environ.get("WORKLEDGER_FAILPOINTS")
    if not spec:
        return
    global _spec_cache
    if _spec_cache is None or _spec_cache[0] != spec:
        _spec_cache = (spec, _parse(spec))
    rules = _spec_cache[1].get(name)
    if not rules:
        return
    with _lock:
        _hits[name] = count = _hits.get(name, 0) + 1
    for nth, action in rules:
        if nth == "*" or int(nth) == count:
            _act(name, action)


def _act(name: str, action: str) -> None:
    if action == "exit":
        os._exit(137)
    if action == "raise":
        raise FailpointHit(f"failpoint {name}")
    if action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
        return
    raise ValueError(f"unknown failpoint action {action!r}")
