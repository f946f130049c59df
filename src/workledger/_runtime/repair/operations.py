"""Operator actions: redrive, resolve, acknowledge, pause, resume, cancel, history.

Each is audited in ``wl_events`` with who did it and why, and each is guarded twice: by the
run's state (a finished run is not cancelled, a cancelled run's failures are not redriven:
:class:`~workledger.errors.Refused`, nothing changed) and, in the database, by the state each
item is moved from, so two operators (or an operator and the sweeper) racing move every item
at most once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from workledger._runtime.status import status_of
from workledger.core import writes
from workledger.core.states import Actor, ItemState, move
from workledger.core.status import CLOSE_STAGE
from workledger.errors import Refused, UsageError
from workledger.jobs import Job
from workledger.storage.port import (
    EventRow,
    ItemRow,
    ItemsQuery,
    NewEvent,
    RunRow,
    Settle,
    SettleParams,
    Store,
)

PAGE = 1000
_REDRIVE = move("redrive", Actor.OPERATOR)
_UNKNOWN = ItemState.UNKNOWN  # what a resolve moves items out of
RESOLVE_TARGETS = tuple(s.value for s in writes.RESOLVE_TARGETS)
ACKNOWLEDGED = "acknowledged"  # the wl_events kind of an operator's review of failures


def pages(store: Store, run_id: int, stage: str | None, state: str | None,
          seq: int | None = None) -> Iterator[ItemRow]:
    """The run's items (of a stage, in a state), a page at a time, in id order."""
    after = 0
    while page := store.items_list(ItemsQuery(run_id, stage, state, PAGE, after, seq)):
        yield from page
        after = page[-1].id


# -- guards ------------------------------------------------------------------------------------


def refuse_if_cancelled(run: RunRow, verb: str) -> None:
    if run.cancelled_at is not None:
        raise Refused(f"run {run.id} is cancelled: its items are not {verb} any more; "
                      "nothing changed")


def refuse_if_finished(store: Store, run: RunRow, job: Job | None, verb: str) -> None:
    """A cancelled or complete run is finished: pausing, resuming or cancelling it would only
    relabel its history."""
    if run.cancelled_at is not None:
        raise Refused(f"run {run.id} is cancelled: a finished run is not {verb}; "
                      "nothing changed")
    status = status_of(store, run, job)
    if status.complete:
        raise Refused(f"run {run.id} is {status.state}: a finished run is not {verb}; "
                      "nothing changed")


def stages_of(store: Store, run: RunRow, job: Job | None) -> list[str]:
    """The stages the run has: its job's, and any its rows name (the closing entry too)."""
    known = [s.name for s in job.stages] if job else []
    if job is not None and job.closing is not None:
        known.append(CLOSE_STAGE)
    return known + [s for s in store.run_counts(run.id) if s not in known]


def check_stage(store: Store, run: RunRow, job: Job | None, stage: str | None) -> None:
    if stage is not None and stage not in stages_of(store, run, job):
        have = ", ".join(stages_of(store, run, job)) or "none"
        raise UsageError(f"run {run.id} has no stage {stage!r} (its stages: {have})")


# -- redrive -----------------------------------------------------------------------------------


def retry(
    store: Store, run: RunRow, job: Job | None, *, stage: str | None = None,
    seqs: Sequence[int] | None = None, actor: str = "operator", note: str | None = None,
) -> int:
    """Redrive failed items back to pending with fresh attempts; return how many moved.

    Refused in a cancelled run (its pending items would only be skipped again, losing the
    failure). An unknown stage, or a seq that names no item or no failed item, is refused.
    """
    refuse_if_cancelled(run, "redriven")
    check_stage(store, run, job, stage)
    failed = _chosen(store, run, stage, seqs)
    settles = [
        Settle(i.id, writes.redriven(i.stage), reset_attempts=True,
               detail=json.dumps({"previous_attempts": i.attempts, "previous_error": i.error,
                                  "note": note}))
        for i in failed
    ]
    moved = 0
    for start in range(0, len(settles), PAGE):
        result = store.items_settle(SettleParams(run.id, _REDRIVE.from_state,
                                                 settles[start:start + PAGE], actor))
        moved += len(result.applied)
    return moved


def _chosen(store: Store, run: RunRow, stage: str | None,
            seqs: Sequence[int] | None) -> list[ItemRow]:
    if not seqs:
        return list(pages(store, run.id, stage, _REDRIVE.from_state))
    found: list[ItemRow] = []
    for seq in dict.fromkeys(seqs):
        rows = list(pages(store, run.id, stage, None, seq))
        where = f" in stage {stage!r}" if stage else ""
        if not rows:
            raise UsageError(f"run {run.id} has no item {seq}{where}")
        failed = [r for r in rows if r.state == _REDRIVE.from_state]
        if not failed:
            states = ", ".join(f"{r.stage}/{r.seq} is {r.state}" for r in rows)
            raise UsageError(f"item {seq}{where} is not failed ({states}); nothing changed"
                             if len(rows) > 1 else
                             f"item {rows[0].stage}/{seq} is {rows[0].state}, not failed; "
                             "nothing changed")
        found.extend(failed)
    return found


# -- resolve -----------------------------------------------------------------------------------


def resolve(
    store: Store, job: Job | None, run: RunRow, stage: str, seq: int, as_state: str, *,
    actor: str = "operator", note: str | None = None,
) -> bool:
    """Settle an ``unknown`` item by a person's decision; False if it was not unknown."""
    _check_resolve(run, as_state)
    rows = store.items_list(ItemsQuery(run.id, stage, None, 1, 0, seq))
    if not rows:
        raise UsageError(f"run {run.id} has no item {seq} in stage {stage!r}")
    item = rows[0]
    if item.state != _UNKNOWN:
        raise UsageError(f"item {seq} of stage {stage!r} is {item.state}, not unknown")
    settle = _resolution(job, item, as_state, note)
    return bool(store.items_settle(SettleParams(run.id, _UNKNOWN, [settle], actor)).applied)


def resolve_many(
    store: Store, job: Job | None, run: RunRow, stage: str, as_state: str, *,
    seqs: Sequence[int] | None = None, actor: str = "operator", note: str | None = None,
) -> tuple[int, int]:
    """Settle many ``unknown`` items of a stage by one decision: the seqs given, or (None)
    every unknown item of the stage, a page at a time. Each item is still moved by its own
    guarded transition and audited with its own ``resolved`` event. A seq that names no item,
    or an item that is not unknown, is refused before anything changes. Returns (resolved,
    settled by someone else meanwhile)."""
    _check_resolve(run, as_state)
    check_stage(store, run, job, stage)
    if seqs:
        chosen: Iterator[ItemRow] = iter(_unknown_seqs(store, run, stage, seqs))
    else:
        chosen = pages(store, run.id, stage, _UNKNOWN)
    done = lost = 0
    batch: list[Settle] = []
    for item in chosen:
        batch.append(_resolution(job, item, as_state, note))
        if len(batch) == PAGE:
            applied = len(store.items_settle(SettleParams(run.id, _UNKNOWN, batch, actor)).applied)
            done, lost, batch = done + applied, lost + len(batch) - applied, []
    if batch:
        applied = len(store.items_settle(SettleParams(run.id, _UNKNOWN, batch, actor)).applied)
        done, lost = done + applied, lost + len(batch) - applied
    return done, lost


def _check_resolve(run: RunRow, as_state: str) -> None:
    if as_state not in RESOLVE_TARGETS:
        raise UsageError(f"--as must be one of {', '.join(RESOLVE_TARGETS)}")
    refuse_if_cancelled(run, "resolved")


def _unknown_seqs(store: Store, run: RunRow, stage: str, seqs: Sequence[int]) -> list[ItemRow]:
    found = []
    for seq in dict.fromkeys(seqs):
        rows = store.items_list(ItemsQuery(run.id, stage, None, 1, 0, seq))
        if not rows:
            raise UsageError(f"run {run.id} has no item {seq} in stage {stage!r}; "
                             "nothing changed")
        if rows[0].state != _UNKNOWN:
            raise UsageError(f"item {stage}/{seq} is {rows[0].state}, not unknown; "
                             "nothing changed")
        found.append(rows[0])
    return found


def _resolution(job: Job | None, item: ItemRow, as_state: str, note: str | None) -> Settle:
    """The guarded move of one unknown item to what a person says happened. Without the job's
    stages, a processed item is taken for the unit's last stage."""
    target = ItemState(as_state)
    nxt = job.next_stage(item.stage) if job and target is ItemState.PROCESSED else None
    return Settle(item.id, writes.resolved(target, item.stage, nxt is None),
                  error=note if target is ItemState.FAILED else None, next_stage=nxt,
                  detail=json.dumps({"as": as_state, "note": note}))


# -- acknowledge -------------------------------------------------------------------------------


def ack(store: Store, run: RunRow, job: Job | None, *, stage: str | None = None,
        seq: int | None = None, note: str, actor: str = "operator") -> int:
    """Record that a person reviewed the run's failed items (of a stage, or one item): an event,
    not a state change. ``audit`` then lists them as reviewed and no longer exits 1 for them;
    an item that fails again after this (a redrive that failed) alerts again. Returns how many
    failed items the acknowledgement covers."""
    if not note or not note.strip():
        raise UsageError("say why with --note: it is what the next person reads")
    check_stage(store, run, job, stage)
    covered = list(pages(store, run.id, stage, ItemState.FAILED, seq))
    if not covered:
        where = f" {stage}/{seq}" if seq is not None and stage else (
            f" of stage {stage!r}" if stage else (f" {seq}" if seq is not None else ""))
        raise UsageError(f"run {run.id} has no failed item{where}: nothing to acknowledge")
    item_id = covered[0].id if seq is not None and len(covered) == 1 else None
    detail = {"stage": stage, "seq": seq, "note": note, "items": len(covered)}
    store.events_add([NewEvent(run_id=run.id, kind=ACKNOWLEDGED, item_id=item_id, actor=actor,
                               detail=json.dumps(detail))])
    return len(covered)


# -- pause, resume, cancel -----------------------------------------------------------------------


def pause(store: Store, run: RunRow, job: Job | None, *, actor: str = "operator",
          note: str | None = None) -> bool:
    """Stop claiming the run's items; False when it was paused already."""
    refuse_if_finished(store, run, job, "paused")
    return store.run_set_paused(run.id, True, actor, note)


def set_priority(store: Store, run: RunRow, job: Job | None, priority: int, *,
                 actor: str = "operator", note: str | None = None) -> bool:
    """Move an open run in the claim order; False when it had ``priority`` already."""
    refuse_if_finished(store, run, job, "given a new priority")
    return store.run_set_priority(run.id, priority, actor, note)


def resume(store: Store, run: RunRow, job: Job | None, *, actor: str = "operator",
           note: str | None = None) -> bool:
    """Let workers claim the run's items again; False when it was not paused. A paused run
    is resumed even once its units are all done (its last items finished in flight while it
    was paused): its closing hook waits for the resume, and refusing would strand it."""
    if run.paused_at is None:
        refuse_if_finished(store, run, job, "resumed")
    refuse_if_cancelled(run, "resumed")
    return store.run_set_paused(run.id, False, actor, note)


def cancel(store: Store, run: RunRow, job: Job | None, *, actor: str = "operator",
           note: str | None = None) -> int:
    """Cancel a run: its pending items become ``skipped`` (reason ``cancelled``); -1 when it
    was cancelled already. A finished run is refused: cancelling would relabel its history."""
    if run.cancelled_at is not None:
        return -1
    refuse_if_finished(store, run, job, "cancelled")
    return store.run_cancel(run.id, actor, note)


@dataclass(frozen=True)
class History:
    item: ItemRow
    events: list[EventRow]


def history(store: Store, run_id: int, stage: str, seq: int) -> History:
    rows = store.items_list(ItemsQuery(run_id, stage, None, 1, 0, seq))
    if not rows:
        raise UsageError(f"run {run_id} has no item {seq} in stage {stage!r}")
    return History(rows[0], store.events_list(run_id, rows[0].id))
