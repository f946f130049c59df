"""Driver-free helpers shared by the adapters: row shaping, event building, projection deltas."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any

from workledger import failpoints
from workledger.core import writes
from workledger.core.states import IllegalTransition, ItemState
from workledger.core.status import CLOSE_STAGE, count_differences
from workledger.core.text import read_json, reason_text, storable_json
from workledger.core.writes import Unit, Write
from workledger.storage.port import (
    ClaimedItem,
    Finish,
    FinishParams,
    ItemRow,
    NewEvent,
    NewItem,
    NewRun,
    Outlook,
    Projection,
    ReclaimParams,
    RunRow,
    Settle,
    SettleParams,
    StageLimit,
)

failpoint = failpoints.hit
_HELD = ItemState.CLAIMED.value  # what a finish and a reclaim move items out of


def loads(text: Any) -> Any:
    """A JSON column's text as Python; a value no reader could handle (nested too deep,
    written by something else) becomes an ``Undecodable`` marker instead of an error."""
    if text is None or not isinstance(text, str | bytes):
        return text
    return read_json(text)


def kind_of(value: object) -> str:
    """A value's type as a person would look it up: ``sqlite3.Connection``."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"


def split_statements(sql: str) -> list[str]:
    """Split a migration into statements (our migrations keep ';' out of literals)."""
    lines = [ln.split("--", 1)[0] for ln in sql.splitlines()]  # no '--' inside our literals
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def finish_rows(finishes: Sequence[Finish]) -> list[list[Any]]:
    return [
        [f.id, f.lease_token, f.write.state, f.result, f.error, f.delay, f.charge]
        for f in finishes
    ]


def checked_finishes(params: FinishParams) -> None:
    """Refuse (:class:`IllegalTransition`) a finish whose write no constructor of core/writes.py
    made from a row of MOVES: nothing is written."""
    # a chunk's finishes share a few writes: each distinct one checked once
    for write in {id(f.write): f.write for f in params.finishes}.values():
        writes.check(write, "items_finish_if_leased")


def checked_settles(params: SettleParams) -> None:
    """Refuse a settle whose write is not a row of MOVES, or moves out of another state than
    the one the update is guarded by."""
    for s in params.settles:
        w = writes.check(s.write, "items_settle")
        if w.move.source != params.from_state:
            raise IllegalTransition(f"{w.move.name} moves {w.move.source} items, "
                                    f"not {params.from_state} ones")


class Tally:
    """Moves between (stage, state) counts inside one transaction, for ``wl_stage_counts``.

    The adapters add one entry per row a statement actually changed (from its RETURNING), and
    write the sum as the transaction's last statement, sorted, so that two transactions take
    the counter rows in the same order.
    """

    __slots__ = ("delta",)

    def __init__(self) -> None:
        self.delta: dict[tuple[str, str], int] = {}

    def add(self, stage: str, state: str, n: int = 1) -> None:
        key = (stage, state)
        self.delta[key] = self.delta.get(key, 0) + n

    def move(self, stage: str, old: str, new: str, n: int = 1) -> None:
        if old != new and n:
            self.add(stage, old, -n)
            self.add(stage, new, n)

    def merge(self, other: Tally) -> None:
        for (stage, state), n in other.delta.items():
            self.add(stage, state, n)

    def rows(self, run_id: int) -> list[tuple[int, str, str, int]]:
        return [(run_id, stage, state, n) for (stage, state), n in sorted(self.delta.items())
                if n]

    @classmethod
    def moves(cls, stages: Iterable[str], old: str, new: str) -> Tally:
        """One item moved ``old -> new`` per stage given (one stage per changed row)."""
        tally = cls()
        for stage, n in Counter(stages).items():  # counted in C: one stage per item
            tally.move(stage, old, new, n)
        return tally

    @classmethod
    def of_moves(cls, changed: Iterable[Any], to_state: dict[int, str], from_state: str) -> Tally:
        """Rows ``(id, stage)`` a guarded update changed from ``from_state`` to ``to_state[id]``."""
        tally = cls()
        for item_id, stage in changed:
            tally.move(stage, from_state, to_state[int(item_id)])
        return tally


# A chunk's outcomes usually share one shape (same state, result, error, delay): then a guarded
# UPDATE per shape with an id list is about three times cheaper than one UPDATE joined to a row
# set with a value per column per row.
GroupKey = tuple[int, Write, str | None, str | None, float | None, int, str | None]


def finish_groups(finishes: Sequence[Finish], most: int) -> dict[GroupKey, list[int]] | None:
    """``{shape: [ids]}`` for up to ``most`` shapes, or None (more shapes, or any event)."""
    groups: dict[GroupKey, list[int]] = {}
    for f in finishes:
        if f.write.event is not None:
            return None
        key = f[1:8]  # lease_token, write, result, error, delay, charge, next_stage
        ids = groups.get(key)
        if ids is None:
            if len(groups) == most:
                return None
            groups[key] = ids = []
        ids.append(f.id)
    return groups


RunPlans = dict[int, "tuple[FinishPlan, Tally]"]  # run id -> what a write does in that run


def by_run(params: FinishParams, found: Sequence[Any]
           ) -> list[tuple[FinishParams, Sequence[Any]]]:
    """A finish's outcomes and the ``(id, stage)`` rows its guarded update changed, run by run
    (``run_of``: a chunk claimed across runs), in run order; one run: as they are."""
    run_of = params.run_of
    if not run_of or len(set(run_of.values())) < 2:
        return [(params, found)]
    finishes: dict[int, list[Finish]] = {}
    for f in params.finishes:
        finishes.setdefault(run_of[f.id], []).append(f)
    rows = _bucket(found, run_of)
    return [(replace(params, run_id=run_id, finishes=mine), rows.get(run_id, []))
            for run_id, mine in sorted(finishes.items())]


def _bucket(rows: Iterable[Any], run_of: Mapping[int, int]) -> dict[int, list[Any]]:
    """Rows whose first column is an item id, by the item's run (one pass)."""
    out: dict[int, list[Any]] = {}
    for r in rows:
        out.setdefault(run_of[int(r[0])], []).append(r)
    return out


def plans_after_groups(params: FinishParams, groups: dict[GroupKey, list[int]],
                       found: dict[GroupKey, list[Any]]) -> RunPlans:
    """``plan_after_groups`` for a chunk claimed across runs (``params.run_of``): each run's
    units, hand-offs, stale results and count moves, in one pass over the changed rows."""
    run_of = params.run_of
    if not run_of or len(set(run_of.values())) < 2:
        return {params.run_id: plan_after_groups(params, groups, found)}
    plans: RunPlans = {}

    def plan_of(run_id: int) -> tuple[FinishPlan, Tally]:
        got = plans.get(run_id)
        if got is None:
            got = plans[run_id] = (FinishPlan(), Tally())
        return got

    for key, ids in groups.items():
        rows = found[key]
        write, next_stage = key[1], key[6]
        state, unit = write.state, write.unit
        if len(rows) != len(ids):
            done = {r[0] for r in rows}
            for i in ids:
                if i not in done:
                    plan = plan_of(run_of[i])[0]
                    plan.stale.append(i)
                    plan.events.append(NewEvent(
                        run_id=run_of[i], item_id=i, kind="stale_result", lease_token=key[0],
                        actor=params.actor,
                        detail=json.dumps({"discarded_state": state, "error": key[3]})))
        for item_id, stage in rows:
            plan, tally = plan_of(run_of[item_id])
            if unit:
                plan.units[unit] += 1
            if next_stage:
                plan.handoffs.append([item_id, next_stage])
            tally.move(stage, _HELD, state)
    return plans


def tallies_of_claim(rows: Sequence[Any], old: str, new: str) -> dict[int, Tally]:
    """The count moves of a claim's rows (ClaimedItem's order: run_id second, stage third),
    per run."""
    stages: dict[int, list[str]] = {}
    for r in rows:
        stages.setdefault(r[1], []).append(r[2])
    return {run_id: Tally.moves(s, old, new) for run_id, s in stages.items()}


def plan_after_groups(params: FinishParams, groups: dict[GroupKey, list[int]],
                      found: dict[GroupKey, list[tuple[int, str]]]) -> tuple[FinishPlan, Tally]:
    """``plan_after_finish`` for grouped outcomes: per shape, not per item, when all applied.
    ``found`` holds the (id, stage) rows each shape's guarded update changed."""
    plan = FinishPlan()
    tally = Tally()
    for key, ids in groups.items():
        rows = found[key]
        write, next_stage = key[1], key[6]
        state, unit = write.state, write.unit
        if len(rows) != len(ids):
            done = {r[0] for r in rows}
            for i in ids:
                if i not in done:
                    plan.stale.append(i)
                    plan.events.append(NewEvent(
                        run_id=params.run_id, item_id=i, kind="stale_result", lease_token=key[0],
                        actor=params.actor,
                        detail=json.dumps({"discarded_state": state, "error": key[3]})))
        if unit:
            plan.units[unit] += len(rows)
        if next_stage:
            plan.handoffs.extend([r[0], next_stage] for r in rows)
        for stage, n in Counter(map(itemgetter(1), rows)).items():
            tally.move(stage, _HELD, state, n)
    return plan, tally


def seq_range(items: Sequence[NewItem]) -> dict[str, int]:
    """``lo``/``hi`` (exclusive) around a batch's seqs, for ``items_keys``."""
    seqs = [i.seq for i in items]
    return {"lo": min(seqs), "hi": max(seqs) + 1}


def inserted_tally(stage: str, items: Sequence[NewItem], present: set[int]) -> Tally:
    """The rows an ``ON CONFLICT DO NOTHING`` insert of ``items`` added: each seq not already
    ``present``, once (the first row of a seq given twice is the one inserted)."""
    tally = Tally()
    seen = set(present)
    for i in items:
        if i.seq not in seen:
            seen.add(i.seq)
            tally.add(stage, i.state)
    return tally


def inserted_units(stage: str, tally: Tally) -> dict[str, int]:
    """What newly written rows add to the run's unit counters: every first-stage row to
    ``total``, the decomposer's skips to ``skipped`` (the closing entry is no unit). The mark
    recounts both from the rows; these keep them right until then, and for a run that is
    never marked (cancelled while its decomposition was cut short)."""
    if stage == CLOSE_STAGE:
        return {}
    return {"total": sum(tally.delta.values()),
            "skipped": tally.delta.get((stage, "skipped"), 0)}


def reclaim_tallies(items: Iterable[ItemRow]) -> dict[int, Tally]:
    """Expired leases moved ``claimed ->`` the state each row now has, per run (a reclaim
    spans runs)."""
    tallies: dict[int, Tally] = {}
    for i in items:
        tallies.setdefault(i.run_id, Tally()).move(i.stage, _HELD, i.state)
    return tallies


def compared_counts(rows: Iterable[Any]) -> tuple[dict[str, dict[str, int]],
                                                   dict[str, dict[str, int]]]:
    """``run_counts_compare`` rows to (the items' counts, the stored counts)."""
    rows = [tuple(r) for r in rows]
    ledger = counts_of(r[1:4] for r in rows if r[0] == "ledger")
    stored = counts_of(r[1:4] for r in rows if r[0] == "stored")
    return ledger, stored


def count_repairs(run_id: int, stored: dict[str, dict[str, int]],
                  ledger: dict[str, dict[str, int]]) -> list[tuple[int, str, str, int]]:
    """``counts_add`` rows that move the stored counts onto the items' counts, sorted like
    every other writer's (differences only: rows no writer holds stay untouched)."""
    tally = Tally()
    for stage in stored.keys() | ledger.keys():
        mine, truth = stored.get(stage, {}), ledger.get(stage, {})
        for state in mine.keys() | truth.keys():
            tally.add(stage, state, truth.get(state, 0) - mine.get(state, 0))
    return tally.rows(run_id)  # zero moves dropped, the rest sorted


def reconcile_event(run_id: int, actor: str, stored: Projection, derived: Projection,
                    stored_counts: dict[str, dict[str, int]],
                    counts: dict[str, dict[str, int]]) -> dict[str, Any]:
    detail: dict[str, Any] = {"stored": vars(stored), "derived": vars(derived)}
    diff = count_differences(stored_counts, counts)
    if diff:
        detail["counts"] = {k: {"stored": a, "ledger": b} for k, (a, b) in diff.items()}
    return run_event(run_id, "reconciled", actor, **detail)


def counts_of(rows: Iterable[Any]) -> dict[str, dict[str, int]]:
    """``(stage, state, n)`` rows to ``{stage: {state: n}}``, keeping the rows' stage order."""
    counts: dict[str, dict[str, int]] = {}
    for stage, state, n in rows:
        counts.setdefault(stage, {})[state] = int(n)
    return counts


def no_units() -> dict[str, int]:
    """``run_add_units`` parameters that add nothing: one per unit counter, and ``total``
    (which only a decomposition batch adds to: :func:`inserted_units`)."""
    return dict(_NO_UNITS)  # a copy: a chunk across runs makes one per run


_NO_UNITS = {"total": 0, **{u.value: 0 for u in Unit}}


@dataclass
class FinishPlan:
    units: dict[str, int] = field(default_factory=lambda: no_units())
    handoffs: list[list[Any]] = field(default_factory=list)
    events: list[NewEvent] = field(default_factory=list)
    stale: list[int] = field(default_factory=list)
    moved: dict[int, str] = field(default_factory=dict)  # applied id -> the state it moved to


def settle_rows(settles: Sequence[Settle]) -> list[list[Any]]:
    # an operator's note becomes the reason of a failure: stored like every reason
    return [[s.id, s.state, s.result, None if s.error is None else reason_text(s.error),
             s.delay, s.reset_attempts] for s in settles]


def plan_after_settle(params: SettleParams, applied: set[int]) -> FinishPlan:
    """What else a state-guarded move writes: counters both ways, hand-offs, audit events."""
    plan = FinishPlan()
    for s in params.settles:
        if s.id not in applied:
            plan.stale.append(s.id)
            continue
        plan.moved[s.id] = s.state
        if s.unit:
            plan.units[s.unit] += 1
        if s.unit_removed:
            plan.units[s.unit_removed] -= 1
        if s.next_stage:
            plan.handoffs.append([s.id, s.next_stage])
        if s.event:
            plan.events.append(NewEvent(run_id=params.run_id, item_id=s.id, kind=s.event,
                                        lease_token=s.lease_token, actor=params.actor,
                                        detail=s.detail))
    return plan


def run_params(new: NewRun) -> dict[str, Any]:
    """The parameters of run_insert and run_insert_deferred (and run_by_key's) for ``new``."""
    return {"job": new.job, "key": new.idempotency_key, "payload": new.payload,
            "tolerate": new.tolerate, "closing": new.closing, "priority": new.priority,
            "tenant": new.tenant}


def run_event(run_id: int, kind: str, actor: str | None, **detail: Any) -> dict[str, Any]:
    return event_params(NewEvent(run_id=run_id, kind=kind, actor=actor,
                                 detail=json.dumps(detail) if detail else None))


def plan_after_finish(params: FinishParams, applied: set[int]) -> FinishPlan:
    """What else the finish transaction writes, given which rows the fenced update changed."""
    plan = FinishPlan()
    for f in params.finishes:
        if f.id not in applied:
            plan.stale.append(f.id)
            plan.events.append(NewEvent(
                run_id=params.run_id, item_id=f.id, kind="stale_result",
                lease_token=f.lease_token, actor=params.actor,
                detail=json.dumps({"discarded_state": f.state, "error": f.error}),
            ))
            continue
        plan.moved[f.id] = f.state
        if f.unit:
            plan.units[f.unit] += 1
        if f.next_stage:
            plan.handoffs.append([f.id, f.next_stage])
        if f.event:
            plan.events.append(NewEvent(
                run_id=params.run_id, item_id=f.id, kind=f.event, lease_token=f.lease_token,
                actor=params.actor, detail=f.detail,
            ))
    return plan


def event_params(e: NewEvent) -> dict[str, Any]:
    return {"run_id": e.run_id, "item_id": e.item_id, "kind": e.kind,
            "lease_token": e.lease_token, "actor": e.actor,
            "detail": None if e.detail is None else storable_json(e.detail)}


def claimed_items(rows: Sequence[Any], decode: bool) -> list[ClaimedItem]:
    """Claim rows (plain tuples in ClaimedItem's order) to ClaimedItems sorted by id;
    ``decode``: ``data`` arrives as JSON text (SQLite), not already decoded (PostgreSQL)."""
    make = ClaimedItem._make
    if decode:
        items = [make(r) if r[5] is None else make(r[:5] + (read_json(r[5]),) + r[6:])
                 for r in rows]
    else:
        items = list(map(make, rows))
    items.sort(key=itemgetter(0))
    return items


def limit_params(job: str, limit: StageLimit) -> dict[str, Any]:
    """The parameters naming a limited stage's bucket and what is declared for it."""
    return {"job": job, "stage": limit.stage, "rate": limit.rate, "burst": limit.burst,
            "max_in_flight": limit.max_in_flight}


def claim_events(items: Iterable[ClaimedItem], actor: str) -> list[dict[str, Any]]:
    return [event_params(NewEvent(run_id=i.run_id, item_id=i.id, kind="claimed",
                                  lease_token=i.lease_token, actor=actor)) for i in items]


def cancel_events(run_id: int, kept: Iterable[Any], actor: str) -> list[dict[str, Any]]:
    """``skipped`` events keeping the reason and attempts of items a cancel overwrote:
    ``items_pending_history`` rows ``(id, stage, error, attempts)``."""
    return [event_params(NewEvent(
        run_id=run_id, item_id=int(r[0]), kind="skipped", actor=actor,
        detail=json.dumps({"reason": "cancelled", "previous_error": r[2],
                           "previous_attempts": int(r[3])})))
        for r in kept]


def reclaim_events(items: Iterable[ItemRow], params: ReclaimParams) -> list[NewEvent]:
    return [
        NewEvent(run_id=i.run_id, item_id=i.id,
                 kind="lease_expired" if i.state == ItemState.PENDING else i.state,
                 lease_token=i.lease_token, actor=params.actor,
                 detail=json.dumps({"reason": i.error, "to": i.state,
                                    "started": i.started_at is not None}))
        for i in items
    ]


def projection_of(run: RunRow) -> Projection:
    return Projection(total=run.total, processed=run.processed, failed=run.failed,
                      skipped=run.skipped, complete=run.completed_at is not None)


def outlook_from_row(row: tuple[Any, ...]) -> Outlook:
    ready, waiting, next_in, leased, ends_in, expired = row
    return Outlook(
        ready=int(ready or 0), waiting=int(waiting or 0),
        next_ready_in=None if next_in is None else float(next_in),
        leased=int(leased or 0), lease_ends_in=None if ends_in is None else float(ends_in),
        expired=int(expired or 0),
    )
