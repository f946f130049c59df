"""The storage port: a small, set-based interface every adapter implements.

Each method takes and returns plain frozen values. Only modules under ``workledger.storage``
import a database driver; the runtime speaks to the ledger through this protocol alone.
All times that matter for leases are computed by the database, never by a worker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from workledger.core.states import LOST_TWICE, NOT_STARTED, ItemState
from workledger.core.writes import Write

# -- values -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deadline:
    """When a run should be complete (migration 0014): at a time, or seconds after it was
    recorded; its warning starts ``warn_before`` seconds earlier (None: no warning)."""

    at: datetime | None = None
    after: float | None = None
    warn_before: float | None = None


@dataclass(frozen=True)
class NewRun:
    job: str
    idempotency_key: str
    payload: str  # canonical JSON text
    tolerate: float | None = None  # failed units allowed: a count (>= 1) or a fraction (< 1)
    closing: bool | None = None  # its job declared a closing hook (migration 0012): prune waits
    deadline: Deadline | None = None  # set on the run when it is recorded (not when it exists)
    priority: int = 0  # -1000..1000 (migration 0015): higher runs are claimed first
    tenant: str | None = None  # migration 0016; None: the default tenant ("default")


@dataclass(frozen=True)
class RunRow:
    id: int
    job: str
    idempotency_key: str
    payload: Any  # None where the query leaves it out (run_get, runs_list): see run_payload
    created_at: str
    decomposed_at: str | None
    completed_at: str | None
    paused_at: str | None
    cancelled_at: str | None
    error: str | None
    total: int
    processed: int
    failed: int
    skipped: int
    tolerate: float | None = None  # recorded at submit (migration 0003); None before it
    priority: int = 0  # migration 0015; set_priority changes it while the run is open
    tenant: str | None = None  # migration 0016; None: the default tenant


class ClaimableRun(NamedTuple):
    """A run workers claim from (``runs_claimable``), in the claim order, with its tenant's
    weight (1 unless ``tenant_set_weight`` gave it another)."""

    id: int
    job: str
    priority: int
    tenant: str | None = None
    weight: int = 1


@dataclass(frozen=True)
class TenantRow:
    """A tenant whose weight an operator set (``tenant_set_weight``); others weigh 1."""

    name: str
    weight: int
    updated_at: str
    updated_by: str | None
    note: str | None


class NewRunItems(NamedTuple):
    """One run of ``runs_submit_many``: the run, its first stage and every item of it."""

    run: NewRun
    stage: str
    items: Sequence[NewItem]


class NewItem(NamedTuple):
    """One item row to write (a named tuple: decomposition makes millions)."""

    seq: int
    key: str | None
    data: str | None  # JSON text
    state: str = ItemState.PENDING.value  # pending, or skipped (with its reason)
    error: str | None = None
    concurrency_key: str | None = None  # migration 0017: max_per_key counts by it


@dataclass(frozen=True)
class ItemsInsert:
    run_id: int
    stage: str
    items: Sequence[NewItem]


@dataclass(frozen=True)
class StageLimit:
    """A stage's cluster-wide limits (``@job.stage(rate_limit=..., max_in_flight=...)``): a
    token bucket of ``burst`` tokens refilled at ``rate`` a second (None: no rate), and at most
    ``max_in_flight`` of its items claimed at once (None: no cap), over every run of the job."""

    stage: str
    rate: float | None
    burst: float
    max_in_flight: int | None
    max_per_key: int | None = None  # items of one concurrency key claimed at once at most


@dataclass(frozen=True)
class AuditItems:
    """The items an audit lists, a page at a time: ``expired`` (claimed, their lease run out)
    or ``attention`` (failed or unknown); of one run, of one job's runs, changed (or expired)
    since a time as stored."""

    kind: str  # "expired" or "attention"
    run_id: int | None = None
    job: str | None = None
    since: str | None = None
    after_id: int = 0
    limit: int = 1000


@dataclass(frozen=True)
class ClaimParams:
    run_id: int
    limit: int
    lease_seconds: float
    after_id: int = 0  # per-worker cursor: only rows with id > after_id
    actor: str = "worker"
    record_event: bool = False  # write a 'claimed' event per item (full history jobs)
    closing: bool = False  # claim the run's closing entry ('@close', the sweeper), never others
    holder: str | None = None  # Store.holder_open's id: the claimed rows' holder (SQLite)
    # A job with limited stages is claimed stage by stage, in this order (each through the
    # stage's own index, so a claim stays O(chunk)), each limited stage no further than its
    # bucket and cap allow; empty: the one claim over every stage, in id order.
    job: str = ""
    stages: tuple[str, ...] = ()
    limits: tuple[StageLimit, ...] = ()
    # A claim across runs (issue 25): the pending items of these runs of run_id's job, run by
    # run in id order, in one statement (after_id, closing and stages do not apply); empty:
    # run_id's items only.
    run_ids: tuple[int, ...] = ()


class ClaimedItem(NamedTuple):
    """One claimed row. A named tuple, not a dataclass: the hot path makes one per item."""

    id: int
    run_id: int
    stage: str
    seq: int
    key: str | None
    data: Any
    attempts: int
    lease_token: int
    error: str | None  # the reason left by the previous attempt, if any


class Finish(NamedTuple):
    """The fenced outcome of one execution (a named tuple: one per item on the hot path).
    ``write`` (from a constructor of core/writes.py, the port refuses any other) says the
    state, the unit counter and the event kind."""

    id: int
    lease_token: int
    write: Write
    result: str | None = None  # JSON text
    error: str | None = None
    delay: float | None = None  # pending only: seconds until claimable again
    charge: int = 1  # attempts to add (0 when charged when the execution started)
    next_stage: str | None = None  # insert this stage's row in the same transaction
    detail: str | None = None  # JSON text for the event

    @property
    def state(self) -> str:
        return self.write.state

    @property
    def unit(self) -> str | None:
        return self.write.unit

    @property
    def event(self) -> str | None:
        return self.write.event


@dataclass(frozen=True)
class FinishParams:
    run_id: int
    finishes: Sequence[Finish]
    actor: str = "worker"
    # items of the same claim to mark started in the same transaction: a worker records the
    # starts of its next handlers with the outcomes of the last ones (suspects: each charged
    # its attempt as it starts, start_charge 1)
    start: Sequence[int] = ()
    start_token: int = 0
    start_charge: int = 0
    # the outcomes of a chunk claimed across runs: the run of each finished item's id (every
    # run's counters, events and completion its own); None: all of them are run_id's
    run_of: Mapping[int, int] | None = None


@dataclass(frozen=True)
class FinishResult:
    applied: list[int]
    stale: list[int]
    started: list[int] = field(default_factory=list)  # of FinishParams.start, still held


@dataclass(frozen=True)
class LeaseParams:
    run_id: int
    ids: Sequence[int]
    lease_token: int
    lease_seconds: float = 0.0
    actor: str = "worker"


@dataclass(frozen=True)
class ReclaimParams:
    job: str
    stage: str
    to_state: str  # 'pending' (idempotent stage) or 'unknown'
    reason: str
    # the reason left on an item whose handler never started under the expired claim: it goes
    # back to pending whatever to_state says, since it cannot have had an effect
    unstarted: str = NOT_STARTED
    # the reason left on a suspect (an item already left with a LEASE_EXPIRED reason) that was
    # started again under the expired claim, in a stage whose items go back to pending
    again: str = LOST_TWICE
    actor: str = "sweeper"
    limit: int = 1000


@dataclass(frozen=True)
class Outlook:
    """What remains for the given runs: used to decide whether a worker is idle for good."""

    ready: int  # pending and claimable now
    waiting: int  # pending with not_before in the future
    next_ready_in: float | None  # seconds until the earliest waiting item
    leased: int  # claimed with a live lease
    lease_ends_in: float | None  # seconds until the earliest live lease ends
    expired: int  # claimed with an expired lease


@dataclass(frozen=True)
class Settle:
    """An operator's or the sweeper's move of one item, guarded by its current state; its
    ``write`` (core/writes.py) says the state, the unit counters and the event kind."""

    id: int
    write: Write
    result: str | None = None
    error: str | None = None
    delay: float | None = None
    reset_attempts: bool = False
    next_stage: str | None = None
    detail: str | None = None
    lease_token: int | None = None

    @property
    def state(self) -> str:
        return self.write.state

    @property
    def unit(self) -> str | None:
        return self.write.unit  # the unit counter this adds to

    @property
    def unit_removed(self) -> str | None:
        return self.write.unit_removed  # the unit counter this takes from (a redriven failure)

    @property
    def event(self) -> str | None:
        return self.write.event


@dataclass(frozen=True)
class SettleParams:
    run_id: int
    from_state: str  # the guard: only rows still in this state move
    settles: Sequence[Settle]
    actor: str = "operator"


@dataclass(frozen=True)
class Projection:
    """A run's counters, in units, and whether it is complete."""

    total: int
    processed: int
    failed: int
    skipped: int
    complete: bool


@dataclass(frozen=True)
class Reconciled:
    stored: Projection
    derived: Projection
    repaired: bool
    # wl_stage_counts against the items: {stage: {state: n}}, each as found before any repair
    stored_counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    ledger_counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class ItemRow:
    id: int
    run_id: int
    stage: str
    seq: int
    key: str | None
    data: Any
    state: str
    attempts: int
    lease_until: str | None
    not_before: str | None
    lease_token: int | None
    result: Any
    error: str | None
    created_at: str
    updated_at: str
    started_at: str | None = None  # when the handler of its current claim started (0004)
    concurrency_key: str | None = None  # migration 0017; a hand-off keeps its unit's


@dataclass(frozen=True)
class ItemsQuery:
    run_id: int
    stage: str | None = None
    state: str | None = None
    limit: int = 1000
    after_id: int = 0
    seq: int | None = None


@dataclass(frozen=True)
class EventRow:
    id: int
    run_id: int
    item_id: int | None
    at: str
    kind: str
    lease_token: int | None
    actor: str | None
    detail: Any


@dataclass(frozen=True)
class NewEvent:
    run_id: int
    kind: str
    item_id: int | None = None
    lease_token: int | None = None
    actor: str | None = None
    detail: str | None = None  # JSON text


@dataclass(frozen=True)
class RunsQuery:
    """A page of runs, newest first: ids below ``before`` (a keyset cursor), of ``job``."""

    job: str | None = None
    before: int | None = None
    limit: int = 100


@dataclass(frozen=True)
class ReasonGroup:
    """Items of one stage that share one reason (``error``), and the first of them."""

    stage: str
    reason: str | None
    n: int
    first_seq: int


@dataclass(frozen=True)
class FinishedRuns:
    """Complete runs of a job that share what decides their state: ``n`` of them."""

    job: str
    cancelled: bool
    failed: int
    total: int  # 0 when failed is 0 (it then decides nothing)
    tolerate: float | None
    n: int


@dataclass(frozen=True)
class IdentityClaim:
    """A broker task's claim: exactly the items one message names (_runtime/broker/dispatch.py)."""

    job: str  # the run's job: a message naming another job's run claims nothing
    run_id: int
    stage: str
    seqs: Sequence[int]
    lease_seconds: float
    actor: str = "worker"
    record_event: bool = False  # a 'claimed' event per item (full history jobs)
    limit: StageLimit | None = None  # the stage's bucket and cap, when it is limited
    # the message's own hold (HeldBack.held): its items held until then are its to claim, even
    # a moment early; None (a message no bucket held) claims no item held until later
    held: int | None = None
    # Store.holder_open's id, of the process running the task: a lease of a task whose process
    # lives (stopped past its lease) is not taken back, as a worker's (storage/holders.py)
    holder: str | None = None


@dataclass(frozen=True)
class HoldBack:
    """The items of a limited stage a broker task's claim left (its bucket or cap was short).
    Of them, those still pending, due, in a claimable run and not held for a later message
    already are held until the bucket can serve them (``core/rates.py:hold_plan``), marked owed
    a message from then (migration 0013), and pushed onto the bucket's reservation horizon."""

    job: str
    run_id: int
    stage: str
    seqs: Sequence[int]
    limit: StageLimit
    wait: float  # the ledger's redispatch_after
    held: int | None = None  # the message's own hold, as IdentityClaim.held
    may_wait: bool = False  # the message was held for now: short by a moment, it may wait
    # seconds a broker may hold a message: a group due later gets none, its items are owed
    # from their due time and the sweeper publishes them then (a broker holding a message for
    # long redelivers it or drops the consumer: Redis' visibility timeout, RabbitMQ's
    # consumer_timeout)
    broker_hold: float = 300.0


class HeldBack(NamedTuple):
    """One message to publish for held-back items: held ``delay`` seconds by the broker."""

    seqs: tuple[int, ...]
    delay: float
    held: int  # when the items are held until: ms since the epoch, by the database's clock


@dataclass(frozen=True)
class Hold:
    """What ``items_hold_back`` did: held ``messages`` (marked owed, to publish), or nothing
    and ``wait`` above 0: claim again after that many seconds (``core/rates.py:HoldPlan``)."""

    wait: float = 0.0
    messages: tuple[HeldBack, ...] = ()


@dataclass(frozen=True)
class DispatchMark:
    """Items about to be named by a published message: each still pending owes the next one
    ``delay + wait * 2^(messages so far, at most 4)`` seconds from now."""

    run_id: int
    stage: str
    seqs: Sequence[int]
    wait: float  # the ledger's redispatch_after
    delay: float = 0.0  # a retry's backoff: the broker holds the message that long


@dataclass(frozen=True)
class Attention:
    """Ledger-wide counts of what waits on the sweeper or a person."""

    expired_leases: int
    unknown: int
    failed: int


@dataclass(frozen=True)
class ScheduleDecl:
    """A schedule as the code declares it; ``next_at``: its first planned time after now,
    where it starts when it is new (or its spec, time zone or job changed)."""

    name: str
    job: str
    spec: str
    tz: str
    next_at: datetime


@dataclass(frozen=True)
class ScheduleRow:
    """A ``wl_schedules`` row, with its last firing and the last run it made."""

    name: str
    job: str
    spec: str
    tz: str
    next_fire_at: datetime | None
    waiting_fire_at: datetime | None
    missed: int
    paused_at: str | None
    paused_by: str | None
    last_fire_at: datetime | None
    last_run_id: int | None


@dataclass(frozen=True)
class FiringRow:
    schedule: str
    fire_at: datetime
    state: str  # submitted, skipped, waiting, none, failed
    run_id: int | None
    error: str | None
    attempts: int
    actor: str | None
    recorded_at: str


@dataclass(frozen=True)
class Firing:
    """One firing, recorded in one transaction with the schedule's next fire time.

    ``advance``: a planned firing, ``(expected, next)``: written only if the schedule's
    ``next_fire_at`` is still ``expected`` (it becomes ``next``), so two sweepers never record
    one firing twice. ``from_waiting``: the firing that waited (overlap ``wait``), written only
    if it still waits. Neither: by hand (``schedule fire``, ``backfill``), once per time.
    ``run``: None when the schedule's function returned None."""

    schedule: str
    job: str
    fire_at: datetime
    actor: str
    run: NewRun | None
    overlap: str = "allow"
    advance: tuple[datetime, datetime] | None = None
    missed: int = 0  # planned firings passed over before this one (counted on the schedule)
    from_waiting: bool = False


@dataclass(frozen=True)
class Fired:
    """What a firing did: ``submitted`` (``run_id``; ``created`` False when its key named a
    run already), ``skipped`` or ``waiting`` (``run_id``: the open run), ``none``, ``raced``
    (another sweeper recorded it: nothing written) or ``recorded`` (recorded before, as
    ``was``: nothing written)."""

    state: str
    run_id: int | None = None
    created: bool = False
    was: str | None = None


@dataclass(frozen=True)
class DeadlineRow:
    """An open run past its deadline or inside its warning."""

    run_id: int
    job: str
    key: str
    deadline_at: datetime
    warn_at: datetime | None
    left: int  # units not yet terminal
    total: int


# -- the port -----------------------------------------------------------------------------------


class Store(Protocol):
    """Everything the runtime needs from a database. Both adapters pass one contract suite."""

    dialect: str

    def migrate(self) -> list[int]: ...
    # the one process that runs the periodic sweeper: True while this store holds the lock
    def lead(self, scope: str = "") -> bool: ...
    # idle workers: block up to `timeout` s for a sign that work became claimable (True)
    def wait_for_work(self, timeout: float) -> bool: ...
    wakes_other_processes: bool  # whether that sign reaches workers in other processes
    def unlead(self) -> None: ...
    # a holder of leases whose life the backend can tell from the operating system (SQLite:
    # a locked file per worker, storage/holders.py): its (id, file), for ClaimParams.holder
    # and for handler processes to hold too; None where leases are judged by the database's
    # clock alone (PostgreSQL). A live holder's leases are never taken back on SQLite, a
    # closed or dead one's at once (docs/design.md, "Leases: the holder's life, not the clocks").
    def holder_open(self) -> tuple[str, str] | None: ...
    def holder_close(self, holder: str) -> None: ...
    def schema_version(self) -> int: ...
    def close(self) -> None: ...

    def run_submit(self, new: NewRun) -> tuple[RunRow, bool]: ...
    # submit inside the caller's transaction (docs/design.md): only the run row and its
    # `submitted` event, written on `conn` (the caller's open connection to this ledger's
    # database) and committed by the caller alone; a connection elsewhere is a UsageError
    def run_submit_in(self, conn: Any, new: NewRun) -> tuple[RunRow, bool]: ...
    # many runs in one transaction (submit_many), each with all its items and decomposed
    # unless its key names a run already (that one as it is, created False, nothing of it
    # written); `check` sees each such run with what was asked of it, inside the
    # transaction: what it raises rolls back every run of the call
    def runs_submit_many(self, runs: Sequence[NewRunItems],
                         check: Callable[[RunRow, NewRun], None] | None = None
                         ) -> list[tuple[RunRow, bool]]: ...
    # deferred runs (recorded that way) no decomposer took yet: of `jobs`, or of all (None)
    def runs_deferred(self, jobs: Sequence[str] | None, limit: int = 100) -> list[RunRow]: ...
    # take a deferred run's decomposition: the run with its payload, or None (taken already)
    def run_take_deferred(self, run_id: int) -> RunRow | None: ...
    def run_get(self, run_id: int) -> RunRow | None: ...
    def run_payload(self, run_id: int) -> Any: ...
    def runs_list(self, limit: int = 100, before: int | None = None,
                  tenant: str | None = None) -> list[RunRow]: ...
    def runs_count(self, before: int | None = None, tenant: str | None = None) -> int: ...
    def run_mark_decomposed(self, run_id: int, first_stage: str) -> RunRow: ...
    def run_record_error(self, run_id: int, error: str | None,
                         actor: str | None = None) -> None: ...
    def runs_claimable(self, jobs: Sequence[str]) -> list[ClaimableRun]: ...
    def runs_top_priority(self, jobs: Sequence[str]) -> int | None: ...
    def run_set_priority(self, run_id: int, priority: int, actor: str,
                         note: str | None) -> bool: ...
    # a tenant's weight (1..1000), upserted with who set it; False when it had that weight
    def tenant_set_weight(self, name: str, weight: int, actor: str,
                          note: str | None) -> bool: ...
    def tenants_list(self) -> list[TenantRow]: ...
    def tenant_open_runs(self, name: str) -> int: ...  # "default": the runs without a tenant
    def run_counts(self, run_id: int) -> dict[str, dict[str, int]]: ...
    # (expired leases, retries due later, unknown items awaiting their verify hook)
    def run_waits(self, run_id: int) -> tuple[int, int, int]: ...

    def items_insert_many(self, params: ItemsInsert) -> int: ...
    def items_claim(self, params: ClaimParams) -> list[ClaimedItem]: ...
    def items_mark_started(self, params: LeaseParams, charge: int = 1) -> list[int]: ...
    def items_heartbeat(self, params: LeaseParams) -> int: ...
    def items_release(self, params: LeaseParams) -> int: ...
    def items_finish_if_leased(self, params: FinishParams) -> FinishResult: ...
    def items_list(self, query: ItemsQuery) -> list[ItemRow]: ...
    def items_count(self, query: ItemsQuery) -> int: ...  # rows items_list would find, unlimited
    def leases_reclaim_expired(self, params: ReclaimParams) -> list[ItemRow]: ...
    def outlook(self, run_ids: Sequence[int]) -> Outlook: ...

    def items_settle(self, params: SettleParams) -> FinishResult: ...
    def items_keys(self, run_id: int, stage: str, lo: int, hi: int) -> dict[int, str | None]: ...
    def items_attention(self, states: Sequence[str], limit: int = 1000,
                        after_id: int = 0) -> list[ItemRow]: ...
    def leases_expired(self, limit: int = 1000, after_id: int = 0) -> list[ItemRow]: ...
    def items_audit(self, params: AuditItems) -> list[ItemRow]: ...

    def runs_undecomposed(self, grace_seconds: float, backoff: float = 0.0) -> list[RunRow]: ...
    def runs_to_close(self, jobs: Sequence[str], stage: str) -> list[int]: ...
    def run_set_paused(self, run_id: int, paused: bool, actor: str, note: str | None) -> bool: ...
    def run_cancel(self, run_id: int, actor: str, note: str | None) -> int: ...
    def run_reconcile(
        self, run_id: int, derive: Callable[[RunRow, dict[str, dict[str, int]]], Projection],
        repair: bool, actor: str,
    ) -> Reconciled: ...

    def events_add(self, events: Sequence[NewEvent]) -> None: ...
    def events_list(self, run_id: int, item_id: int | None = None,
                    kind: str | None = None) -> list[EventRow]: ...

    # -- dispatch through a broker (_runtime/broker/dispatch.py, migration 0007) -------------------

    def items_claim_by_identity(self, params: IdentityClaim) -> list[ClaimedItem]: ...
    # before the mark of a run dispatched through a broker: its stage's pending rows owe a
    # message `wait` s from now (in short transactions); how many
    def items_owe(self, run_id: int, stage: str, wait: float) -> int: ...
    def items_pending_seqs(self, run_id: int, stage: str, after_id: int,
                           limit: int) -> list[tuple[int, int]]: ...  # (id, seq) in id order
    def items_mark_dispatched(self, params: DispatchMark) -> list[int]: ...  # the seqs marked
    def items_hold_back(self, params: HoldBack) -> Hold: ...  # migration 0013
    # pending, due, and owed a message by now: (stage, seq), oldest first; given the
    # ledger's ``wait``, also those marked by a clock ahead (SQLite; docs/design.md)
    def items_owed(self, run_id: int, limit: int,
                   wait: float | None = None) -> list[tuple[str, int]]: ...

    # -- reads for the HTTP layer and metrics; retention --------------------------------------

    def runs_page(self, query: RunsQuery) -> list[RunRow]: ...  # without payloads
    def runs_open(self) -> list[RunRow]: ...  # not complete, without payloads
    def runs_finished_summary(self) -> list[FinishedRuns]: ...
    def counts_open(self) -> list[tuple[str, str, str, int]]: ...  # (job, stage, state, n)
    def pending_heads(self, run_id: int, window: int) -> dict[str, float]: ...  # stage: age s
    def attention_totals(self) -> Attention: ...
    def run_attention(self, query: ItemsQuery) -> list[ItemRow]: ...  # failed or unknown
    def run_reasons(self, run_id: int, state: str, window: int, groups: int
                    ) -> list[ReasonGroup]: ...
    def items_by_key(self, query: ItemsQuery, key: str) -> list[ItemRow]: ...
    def events_page(self, run_id: int, after_id: int, limit: int) -> list[EventRow]: ...
    def runs_prunable(self, cutoff_seconds: float, job: str | None, after_id: int,
                      limit: int) -> list[RunRow]: ...
    def run_prune(self, run_id: int, cutoff_seconds: float, with_events: bool) -> bool: ...
    def items_prune(self, run_id: int, limit: int) -> int: ...
    def events_prune(self, run_id: int, limit: int) -> int: ...
    def counts_prune(self, run_id: int) -> None: ...
    def runs_orphaned(self) -> list[int]: ...
    def runs_unclosed(self, run_ids: Sequence[int]) -> list[int]: ...

    # schedules and deadlines (migration 0014)
    def db_now(self) -> datetime: ...  # the database's clock, which times every firing
    def schedules_declare(self, decls: Sequence[ScheduleDecl], replace: bool) -> None: ...
    def schedules_all(self) -> list[ScheduleRow]: ...
    def schedule_fire(self, firing: Firing) -> Fired: ...
    def schedule_advance(self, name: str, expected: datetime, next_at: datetime,
                         missed: int) -> bool: ...  # passed over, nothing fired
    def schedule_firing_failed(self, name: str, fire_at: datetime, error: str,
                               actor: str) -> None: ...
    def schedule_open_run(self, name: str, job: str) -> int | None: ...
    def schedule_set_paused(self, name: str, paused: bool, actor: str) -> bool: ...
    def firings_list(self, name: str, limit: int) -> list[FiringRow]: ...
    def firings_failed(self, limit: int) -> list[FiringRow]: ...
    def runs_mark_deadline_missed(self, actor: str, limit: int) -> list[int]: ...
    def runs_deadlines(self, limit: int) -> tuple[datetime, list[DeadlineRow]]: ...

