"""Operator actions: redrive, resolve, pause, resume, cancel, history. Each is audited in
``wl_events`` with who did it and why, and each is guarded by the state it moves from, so two
operators (or an operator and the sweeper) racing move every item at most once."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from workledger.core.states import Actor, ItemState, move
from workledger.core.status import CLOSE_STAGE
from workledger.errors import UsageError
from workledger.runtime.jobs import Job
from workledger.storage.port import (
    EventRow,
    ItemRow,
    ItemsQuery,
    Settle,
    SettleParams,
    Store,
)

PAGE = 1000
_REDRIVE = move("redrive", Actor.OPERATOR)


def _items(store: Store, run_id: int, stage: str | None, state: str) -> list[ItemRow]:
    found: list[ItemRow] = []
    after = 0
    while page := store.items_list(ItemsQuery(run_id, stage, state, PAGE, after)):
        found.extend(page)
        after = page[-1].id
    return found


def retry(
    store: Store, run_id: int, *, stage: str | None = None, seqs: Sequence[int] | None = None,
    actor: str = "operator", note: str | None = None,
) -> int:
    """Redrive failed items back to pending with fresh attempts; return how many moved."""
    failed = _items(store, run_id, stage, _REDRIVE.from_state)
    if seqs is not None:
        wanted = set(seqs)
        failed = [i for i in failed if i.seq in wanted]
    settles = [
        # the closing entry is not a unit: its failure was never on the run's counter
        Settle(i.id, _REDRIVE.target, reset_attempts=True,
               unit_removed=None if i.stage == CLOSE_STAGE else "failed",
               event="redriven",
               detail=json.dumps({"previous_attempts": i.attempts, "previous_error": i.error,
                                  "note": note}))
        for i in failed
    ]
    moved = 0
    for start in range(0, len(settles), PAGE):
        result = store.items_settle(SettleParams(run_id, _REDRIVE.from_state,
                                                 settles[start:start + PAGE], actor))
        moved += len(result.applied)
    return moved


RESOLVE_TARGETS = tuple(m.target.value for m in
                        (move("resolve", Actor.OPERATOR, ItemState(s))
                         for s in ("processed", "failed", "pending")))


def resolve(
    store: Store, job: Job | None, run_id: int, stage: str, seq: int, as_state: str, *,
    actor: str = "operator", note: str | None = None,
) -> bool:
    """Settle an ``unknown`` item by a person's decision; False if it was not unknown."""
    if as_state not in RESOLVE_TARGETS:
        raise UsageError(f"--as must be one of {', '.join(RESOLVE_TARGETS)}")
    rows = store.items_list(ItemsQuery(run_id, stage, None, 1, 0, seq))
    if not rows:
        raise UsageError(f"run {run_id} has no item {seq} in stage {stage!r}")
    item = rows[0]
    if item.state != "unknown":
        raise UsageError(f"item {seq} of stage {stage!r} is {item.state}, not unknown")
    nxt = job.next_stage(stage) if job and as_state == "processed" else None
    unit = {"processed": None if nxt else "processed", "failed": "failed"}.get(as_state)
    if as_state == "processed" and job is None:
        unit = "processed"  # without the job's stages, treat it as the unit's last stage
    target = move("resolve", Actor.OPERATOR, ItemState(as_state)).target
    settle = Settle(item.id, target, error=note if as_state == "failed" else None, unit=unit,
                    next_stage=nxt, event="resolved",
                    detail=json.dumps({"as": as_state, "note": note}))
    return bool(store.items_settle(SettleParams(run_id, "unknown", [settle], actor)).applied)


def pause(store: Store, run_id: int, *, actor: str = "operator", note: str | None = None) -> bool:
    return store.run_set_paused(run_id, True, actor, note)


def resume(store: Store, run_id: int, *, actor: str = "operator", note: str | None = None) -> bool:
    return store.run_set_paused(run_id, False, actor, note)


def cancel(store: Store, run_id: int, *, actor: str = "operator", note: str | None = None) -> int:
    """Cancel a run: its pending items become ``skipped`` (reason ``cancelled``)."""
    return store.run_cancel(run_id, actor, note)


@dataclass(frozen=True)
class History:
    item: ItemRow
    events: list[EventRow]


def history(store: Store, run_id: int, stage: str, seq: int) -> History:
    rows = store.items_list(ItemsQuery(run_id, stage, None, 1, 0, seq))
    if not rows:
        raise UsageError(f"run {run_id} has no item {seq} in stage {stage!r}")
    return History(rows[0], store.events_list(run_id, rows[0].id))
