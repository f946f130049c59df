"""Driver-free helpers shared by the adapters: row shaping, event building, projection deltas."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workledger import failpoints
from workledger.storage.port import (
    ClaimedItem,
    FinishParams,
    ItemRow,
    NewEvent,
    Outlook,
    Projection,
    ReclaimParams,
    RunRow,
    Settle,
    SettleParams,
)

failpoint = failpoints.hit


def loads(text: Any) -> Any:
    if text is None or not isinstance(text, str | bytes):
        return text
    return json.loads(text)


def split_statements(sql: str) -> list[str]:
    """Split a migration into statements (our migrations keep ';' out of literals)."""
    lines = [ln.split("--", 1)[0] for ln in sql.splitlines()]  # no '--' inside our literals
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def finish_rows(finishes: Sequence[Any]) -> list[list[Any]]:
    return [
        [f.id, f.lease_token, f.state, f.result, f.error, f.delay, f.charge] for f in finishes
    ]


@dataclass
class FinishPlan:
    units: dict[str, int] = field(default_factory=lambda: {"processed": 0, "failed": 0,
                                                            "skipped": 0})
    handoffs: list[list[Any]] = field(default_factory=list)
    events: list[NewEvent] = field(default_factory=list)
    stale: list[int] = field(default_factory=list)


def settle_rows(settles: Sequence[Settle]) -> list[list[Any]]:
    return [[s.id, s.state, s.result, s.error, s.delay, s.reset_attempts] for s in settles]


def plan_after_settle(params: SettleParams, applied: set[int]) -> FinishPlan:
    """What else a state-guarded move writes: counters both ways, hand-offs, audit events."""
    plan = FinishPlan()
    for s in params.settles:
        if s.id not in applied:
            plan.stale.append(s.id)
            continue
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
            "lease_token": e.lease_token, "actor": e.actor, "detail": e.detail}


def claim_events(items: Iterable[ClaimedItem], actor: str) -> list[dict[str, Any]]:
    return [event_params(NewEvent(run_id=i.run_id, item_id=i.id, kind="claimed",
                                  lease_token=i.lease_token, actor=actor)) for i in items]


def reclaim_events(items: Iterable[ItemRow], params: ReclaimParams) -> list[NewEvent]:
    kind = "lease_expired" if params.to_state == "pending" else params.to_state
    return [
        NewEvent(run_id=i.run_id, item_id=i.id, kind=kind, lease_token=i.lease_token,
                 actor=params.actor, detail=json.dumps({"reason": params.reason,
                                                        "to": params.to_state}))
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
