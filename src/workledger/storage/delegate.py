"""One explicit delegating store: every method of the port (storage/port.py), written out, each
handing its call to the store it wraps through :meth:`DelegatingStore._call`.

The runtime's store wrappers (_runtime/patience.py ``PatientStore``, _runtime/broker/dispatch.py
``DispatchingStore``, _runtime/broker/delivery.py ``FollowUps``) derive from it and override only
what they change: ``_call`` for one that changes every call (waiting out an outage), a method for
one that changes that method. So go-to-definition reaches a body, mypy checks each wrapper
against the port (this class subclasses the ``Store`` protocol: to mypy a port method missing
here makes every wrapper abstract, and making one an error; at run time it would silently
answer None, so tests/test_store_wrappers.py checks that every one is written out), and no
``cast`` or ``__getattr__`` hides a method. A new port method is one more method here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from workledger.storage.port import (
    Attention,
    AuditItems,
    ClaimableRun,
    ClaimedItem,
    ClaimParams,
    DeadlineRow,
    DispatchMark,
    EventRow,
    FinishedRuns,
    FinishParams,
    FinishResult,
    Fired,
    Firing,
    FiringRow,
    Hold,
    HoldBack,
    IdentityClaim,
    ItemRow,
    ItemsInsert,
    ItemsQuery,
    LeaseParams,
    NewEvent,
    NewRun,
    NewRunItems,
    Outlook,
    Projection,
    ReasonGroup,
    ReclaimParams,
    Reconciled,
    RunRow,
    RunsQuery,
    ScheduleDecl,
    ScheduleRow,
    SettleParams,
    Store,
    TenantRow,
)

P = ParamSpec("P")
R = TypeVar("R")


class DelegatingStore(Store):
    """``inner``'s methods, one by one; ``close`` is the inner store's own, never retried."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.dialect = inner.dialect
        self.wakes_other_processes = inner.wakes_other_processes

    def innermost(self) -> Store:
        """The adapter under every wrapper."""
        store: Store = self.inner
        while isinstance(store, DelegatingStore):
            store = store.inner
        return store

    def _call(self, method: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Every delegated call passes here: a wrapper that changes every call overrides it."""
        return method(*args, **kwargs)

    def migrate(self) -> list[int]:
        return self._call(self.inner.migrate)

    def lead(self, scope: str = "") -> bool:
        return self._call(self.inner.lead, scope)

    def wait_for_work(self, timeout: float) -> bool:
        return self._call(self.inner.wait_for_work, timeout)

    def unlead(self) -> None:
        return self._call(self.inner.unlead)

    def holder_open(self) -> tuple[str, str] | None:
        return self._call(self.inner.holder_open)

    def holder_close(self, holder: str) -> None:
        return self._call(self.inner.holder_close, holder)

    def schema_version(self) -> int:
        return self._call(self.inner.schema_version)

    def close(self) -> None:
        self.inner.close()

    def run_submit(self, new: NewRun) -> tuple[RunRow, bool]:
        return self._call(self.inner.run_submit, new)

    def run_submit_in(self, conn: Any, new: NewRun) -> tuple[RunRow, bool]:
        return self._call(self.inner.run_submit_in, conn, new)

    def runs_submit_many(self, runs: Sequence[NewRunItems],
                         check: Callable[[RunRow, NewRun], None] | None = None
                         ) -> list[tuple[RunRow, bool]]:
        return self._call(self.inner.runs_submit_many, runs, check)

    def runs_deferred(self, jobs: Sequence[str] | None, limit: int = 100) -> list[RunRow]:
        return self._call(self.inner.runs_deferred, jobs, limit)

    def run_take_deferred(self, run_id: int) -> RunRow | None:
        return self._call(self.inner.run_take_deferred, run_id)

    def run_get(self, run_id: int) -> RunRow | None:
        return self._call(self.inner.run_get, run_id)

    def run_payload(self, run_id: int) -> Any:
        return self._call(self.inner.run_payload, run_id)

    def runs_list(self, limit: int = 100, before: int | None = None,
                  tenant: str | None = None) -> list[RunRow]:
        return self._call(self.inner.runs_list, limit, before, tenant)

    def runs_count(self, before: int | None = None, tenant: str | None = None) -> int:
        return self._call(self.inner.runs_count, before, tenant)

    def run_mark_decomposed(self, run_id: int, first_stage: str) -> RunRow:
        return self._call(self.inner.run_mark_decomposed, run_id, first_stage)

    def run_record_error(self, run_id: int, error: str | None, actor: str | None = None) -> None:
        return self._call(self.inner.run_record_error, run_id, error, actor)

    def runs_claimable(self, jobs: Sequence[str]) -> list[ClaimableRun]:
        return self._call(self.inner.runs_claimable, jobs)

    def runs_top_priority(self, jobs: Sequence[str]) -> int | None:
        return self._call(self.inner.runs_top_priority, jobs)

    def run_set_priority(self, run_id: int, priority: int, actor: str,
                         note: str | None) -> bool:
        return self._call(self.inner.run_set_priority, run_id, priority, actor, note)

    def tenant_set_weight(self, name: str, weight: int, actor: str,
                          note: str | None) -> bool:
        return self._call(self.inner.tenant_set_weight, name, weight, actor, note)

    def tenants_list(self) -> list[TenantRow]:
        return self._call(self.inner.tenants_list)

    def tenant_open_runs(self, name: str) -> int:
        return self._call(self.inner.tenant_open_runs, name)

    def run_counts(self, run_id: int) -> dict[str, dict[str, int]]:
        return self._call(self.inner.run_counts, run_id)

    def run_waits(self, run_id: int) -> tuple[int, int, int]:
        return self._call(self.inner.run_waits, run_id)

    def items_insert_many(self, params: ItemsInsert) -> int:
        return self._call(self.inner.items_insert_many, params)

    def items_claim(self, params: ClaimParams) -> list[ClaimedItem]:
        return self._call(self.inner.items_claim, params)

    def items_mark_started(self, params: LeaseParams, charge: int = 1) -> list[int]:
        return self._call(self.inner.items_mark_started, params, charge)

    def items_heartbeat(self, params: LeaseParams) -> int:
        return self._call(self.inner.items_heartbeat, params)

    def items_release(self, params: LeaseParams) -> int:
        return self._call(self.inner.items_release, params)

    def items_finish_if_leased(self, params: FinishParams) -> FinishResult:
        return self._call(self.inner.items_finish_if_leased, params)

    def items_list(self, query: ItemsQuery) -> list[ItemRow]:
        return self._call(self.inner.items_list, query)

    def items_count(self, query: ItemsQuery) -> int:
        return self._call(self.inner.items_count, query)

    def leases_reclaim_expired(self, params: ReclaimParams) -> list[ItemRow]:
        return self._call(self.inner.leases_reclaim_expired, params)

    def outlook(self, run_ids: Sequence[int]) -> Outlook:
        return self._call(self.inner.outlook, run_ids)

    def items_settle(self, params: SettleParams) -> FinishResult:
        return self._call(self.inner.items_settle, params)

    def items_keys(self, run_id: int, stage: str, lo: int, hi: int) -> dict[int, str | None]:
        return self._call(self.inner.items_keys, run_id, stage, lo, hi)

    def items_attention(self, states: Sequence[str], limit: int = 1000,
                        after_id: int = 0) -> list[ItemRow]:
        return self._call(self.inner.items_attention, states, limit, after_id)

    def leases_expired(self, limit: int = 1000, after_id: int = 0) -> list[ItemRow]:
        return self._call(self.inner.leases_expired, limit, after_id)

    def items_audit(self, params: AuditItems) -> list[ItemRow]:
        return self._call(self.inner.items_audit, params)

    def runs_undecomposed(self, grace_seconds: float, backoff: float = 0.0) -> list[RunRow]:
        return self._call(self.inner.runs_undecomposed, grace_seconds, backoff)

    def runs_to_close(self, jobs: Sequence[str], stage: str) -> list[int]:
        return self._call(self.inner.runs_to_close, jobs, stage)

    def run_set_paused(self, run_id: int, paused: bool, actor: str, note: str | None) -> bool:
        return self._call(self.inner.run_set_paused, run_id, paused, actor, note)

    def run_cancel(self, run_id: int, actor: str, note: str | None) -> int:
        return self._call(self.inner.run_cancel, run_id, actor, note)

    def run_reconcile(
        self, run_id: int, derive: Callable[[RunRow, dict[str, dict[str, int]]], Projection],
        repair: bool, actor: str,
    ) -> Reconciled:
        return self._call(self.inner.run_reconcile, run_id, derive, repair, actor)

    def events_add(self, events: Sequence[NewEvent]) -> None:
        return self._call(self.inner.events_add, events)

    def events_list(self, run_id: int, item_id: int | None = None,
                    kind: str | None = None) -> list[EventRow]:
        return self._call(self.inner.events_list, run_id, item_id, kind)

    def items_claim_by_identity(self, params: IdentityClaim) -> list[ClaimedItem]:
        return self._call(self.inner.items_claim_by_identity, params)

    def items_owe(self, run_id: int, stage: str, wait: float) -> int:
        return self._call(self.inner.items_owe, run_id, stage, wait)

    def items_pending_seqs(self, run_id: int, stage: str, after_id: int,
                           limit: int) -> list[tuple[int, int]]:
        return self._call(self.inner.items_pending_seqs, run_id, stage, after_id, limit)

    def items_mark_dispatched(self, params: DispatchMark) -> list[int]:
        return self._call(self.inner.items_mark_dispatched, params)

    def items_hold_back(self, params: HoldBack) -> Hold:
        return self._call(self.inner.items_hold_back, params)

    def items_owed(self, run_id: int, limit: int,
                   wait: float | None = None) -> list[tuple[str, int]]:
        return self._call(self.inner.items_owed, run_id, limit, wait)

    def runs_page(self, query: RunsQuery) -> list[RunRow]:
        return self._call(self.inner.runs_page, query)

    def runs_open(self) -> list[RunRow]:
        return self._call(self.inner.runs_open)

    def runs_finished_summary(self) -> list[FinishedRuns]:
        return self._call(self.inner.runs_finished_summary)

    def counts_open(self) -> list[tuple[str, str, str, int]]:
        return self._call(self.inner.counts_open)

    def pending_heads(self, run_id: int, window: int) -> dict[str, float]:
        return self._call(self.inner.pending_heads, run_id, window)

    def attention_totals(self) -> Attention:
        return self._call(self.inner.attention_totals)

    def run_attention(self, query: ItemsQuery) -> list[ItemRow]:
        return self._call(self.inner.run_attention, query)

    def run_reasons(self, run_id: int, state: str, window: int, groups: int) -> list[ReasonGroup]:
        return self._call(self.inner.run_reasons, run_id, state, window, groups)

    def items_by_key(self, query: ItemsQuery, key: str) -> list[ItemRow]:
        return self._call(self.inner.items_by_key, query, key)

    def events_page(self, run_id: int, after_id: int, limit: int) -> list[EventRow]:
        return self._call(self.inner.events_page, run_id, after_id, limit)

    def runs_prunable(self, cutoff_seconds: float, job: str | None, after_id: int,
                      limit: int) -> list[RunRow]:
        return self._call(self.inner.runs_prunable, cutoff_seconds, job, after_id, limit)

    def run_prune(self, run_id: int, cutoff_seconds: float, with_events: bool) -> bool:
        return self._call(self.inner.run_prune, run_id, cutoff_seconds, with_events)

    def items_prune(self, run_id: int, limit: int) -> int:
        return self._call(self.inner.items_prune, run_id, limit)

    def events_prune(self, run_id: int, limit: int) -> int:
        return self._call(self.inner.events_prune, run_id, limit)

    def counts_prune(self, run_id: int) -> None:
        return self._call(self.inner.counts_prune, run_id)

    def runs_orphaned(self) -> list[int]:
        return self._call(self.inner.runs_orphaned)

    def runs_unclosed(self, run_ids: Sequence[int]) -> list[int]:
        return self._call(self.inner.runs_unclosed, run_ids)

    def db_now(self) -> datetime:
        return self._call(self.inner.db_now)

    def schedules_declare(self, decls: Sequence[ScheduleDecl], replace: bool) -> None:
        return self._call(self.inner.schedules_declare, decls, replace)

    def schedules_all(self) -> list[ScheduleRow]:
        return self._call(self.inner.schedules_all)

    def schedule_fire(self, firing: Firing) -> Fired:
        return self._call(self.inner.schedule_fire, firing)

    def schedule_advance(self, name: str, expected: datetime, next_at: datetime,
                         missed: int) -> bool:
        return self._call(self.inner.schedule_advance, name, expected, next_at, missed)

    def schedule_firing_failed(self, name: str, fire_at: datetime, error: str,
                               actor: str) -> None:
        return self._call(self.inner.schedule_firing_failed, name, fire_at, error, actor)

    def schedule_open_run(self, name: str, job: str) -> int | None:
        return self._call(self.inner.schedule_open_run, name, job)

    def schedule_set_paused(self, name: str, paused: bool, actor: str) -> bool:
        return self._call(self.inner.schedule_set_paused, name, paused, actor)

    def firings_list(self, name: str, limit: int) -> list[FiringRow]:
        return self._call(self.inner.firings_list, name, limit)

    def firings_failed(self, limit: int) -> list[FiringRow]:
        return self._call(self.inner.firings_failed, limit)

    def runs_mark_deadline_missed(self, actor: str, limit: int) -> list[int]:
        return self._call(self.inner.runs_mark_deadline_missed, actor, limit)

    def runs_deadlines(self, limit: int) -> tuple[datetime, list[DeadlineRow]]:
        return self._call(self.inner.runs_deadlines, limit)
