"""The model's moves out of ``unknown`` and ``failed`` (verify, resolve, redrive), the run's
markers (pause, resume, cancel), the closing entry and the projection: the rest of
tests/model/ledger.py, in the same style (immutable values in, new values out)."""

from __future__ import annotations

from typing import NamedTuple

from .ledger import (
    CLOSE,
    TERMINAL,
    Item,
    Job,
    Ledger,
    Moves,
    _cancel_pending,
    _cancel_wins,
    _inserted,
    _moved,
    _run,
    _write_plan,
    find,
)


class Settle(NamedTuple):
    idx: int
    target: str
    move: str
    reason: str = ""
    unit: str | None = None
    unit_removed: str | None = None
    next_stage: str | None = None
    reset: bool = False


def settle(ledger: Ledger, run: int, from_state: str, settles: list[Settle], actor: str
           ) -> tuple[Ledger, list[int], Moves]:
    """``items_settle``: a move guarded by the state it is made from."""
    items, moves = list(ledger.items), []
    applied, handoffs = [], []
    units = {"processed": 0, "failed": 0, "skipped": 0}
    for s in settles:
        it = items[s.idx]
        if it.run != run or it.state != from_state:
            continue
        _moved(items, moves, s.idx, s.move, actor, s.target, reason=s.reason, live=False,
               attempts=0 if s.reset else it.attempts,
               flagged=it.flagged or s.target == "unknown")
        applied.append(s.idx)
        if s.unit:
            units[s.unit] += 1
        if s.unit_removed:
            units[s.unit_removed] -= 1
        if s.next_stage:
            handoffs.append((s.idx, s.next_stage))
    ledger, more = _write_plan(ledger._replace(items=tuple(items)), run, handoffs, units, actor)
    return ledger, applied, moves + more


def verify(ledger: Ledger, jobs: dict[str, Job], idx: int, verdict: str
           ) -> tuple[Ledger, Moves]:
    """The sweeper's settle of an item awaiting verify: ``done``, ``not_done`` or anything
    else (``unsure``), as ``sweeper.verdict_settle`` writes it."""
    it = ledger.items[idx]
    job = jobs[ledger.runs[it.run].job]
    if verdict == "done":
        nxt = job.next_stage(it.stage)
        s = Settle(idx, "processed", "verify_done", unit=None if nxt else "processed",
                   next_stage=nxt)
    elif verdict == "not_done":
        s = Settle(idx, "pending", "verify_not_done", reason="verify_not_done")
    else:
        s = Settle(idx, "unknown", "verify_unsure", reason="verify_unsure")
    ledger, _, moves = settle(ledger, it.run, "unknown", [s], "sweeper")
    return ledger, moves


def resolve(ledger: Ledger, jobs: dict[str, Job], idx: int, as_state: str
            ) -> tuple[Ledger, Moves]:
    it = ledger.items[idx]
    job = jobs[ledger.runs[it.run].job]
    nxt = job.next_stage(it.stage) if as_state == "processed" else None
    unit = {"processed": None if nxt else "processed", "failed": "failed"}.get(as_state)
    if it.stage == CLOSE:  # the closing entry is no unit (core/writes.py unit_of)
        unit = None
    s = Settle(idx, as_state, "resolve", unit=unit, next_stage=nxt)
    ledger, _, moves = settle(ledger, it.run, "unknown", [s], "operator")
    return ledger, moves


def retry(ledger: Ledger, run: int) -> tuple[Ledger, Moves]:
    """The operator's redrive of every failed item of ``run`` (``operations.retry``)."""
    settles = [Settle(i, "pending", "redrive", reset=True,
                      unit_removed=None if it.stage == CLOSE else "failed")
               for i, it in enumerate(ledger.items) if it.run == run and it.state == "failed"]
    ledger, _, moves = settle(ledger, run, "failed", settles, "operator")
    return ledger, moves


# -- run markers ------------------------------------------------------------------------------


def pause(ledger: Ledger, run: int) -> Ledger:
    r = ledger.runs[run]
    return ledger if r.paused or r.cancelled else _run(ledger, run, r._replace(paused=True))


def resume(ledger: Ledger, run: int) -> Ledger:
    return _run(ledger, run, ledger.runs[run]._replace(paused=False))


def cancel(ledger: Ledger, run: int) -> tuple[Ledger, Moves]:
    r = ledger.runs[run]
    if r.cancelled:
        return ledger, []
    return _cancel_pending(_run(ledger, run, r._replace(cancelled=True)), run, "cancel",
                           "operator")


# -- the closing entry ---------------------------------------------------------------------------


def to_close(ledger: Ledger, jobs: dict[str, Job], run: int) -> bool:
    """``runs_to_close``: complete by the stored marker, not cancelled, and no closing entry
    that is terminal or unknown."""
    r = ledger.runs[run]
    if not (jobs[r.job].closing and r.completed and not r.cancelled):
        return False
    i = find(ledger, run, CLOSE, 0)
    return i is None or ledger.items[i].state not in TERMINAL | {"unknown"}


def close_insert(ledger: Ledger, run: int) -> tuple[Ledger, Moves]:
    if find(ledger, run, CLOSE, 0) is not None:
        return ledger, []
    items, moves = list(ledger.items), []
    _inserted(items, moves, Item(run, CLOSE, 0), "insert_close", "sweeper")
    return _cancel_wins(ledger._replace(items=tuple(items)), run, "sweeper", moves)


# -- the projection -------------------------------------------------------------------------------


def derived(ledger: Ledger, jobs: dict[str, Job], run: int) -> tuple[int, int, int, int, bool]:
    """``(total, processed, failed, skipped, complete)`` from the items (core/status.py)."""
    r = ledger.runs[run]
    stages = jobs[r.job].stages
    mine = [it for it in ledger.items if it.run == run and it.stage != CLOSE]
    total = sum(it.stage == stages[0] for it in mine)
    processed = sum(it.stage == stages[-1] and it.state == "processed" for it in mine)
    failed = sum(it.state == "failed" for it in mine)
    skipped = sum(it.state == "skipped" for it in mine)
    open_items = sum(it.state not in TERMINAL for it in mine)
    complete = r.decomposed and not open_items and processed + failed + skipped >= total
    return total, processed, failed, skipped, complete


def stored(ledger: Ledger, run: int) -> tuple[int, int, int, int, bool]:
    r = ledger.runs[run]
    return r.total, r.processed, r.failed, r.skipped, r.completed


def reconcile(ledger: Ledger, jobs: dict[str, Job], run: int) -> Ledger:
    total, processed, failed, skipped, complete = derived(ledger, jobs, run)
    return _run(ledger, run, ledger.runs[run]._replace(
        total=total, processed=processed, failed=failed, skipped=skipped, completed=complete))
