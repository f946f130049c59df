"""The facade: ``Ledger`` holds job definitions and a store, and offers submit, work, status.

>>> ledger = Ledger("sqlite:///workledger.db")              # doctest: +SKIP
>>> sub = ledger.job("ingest-events").submit({"events": []})  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from workledger._runtime import inputs, many, overview
from workledger._runtime.broker.delivery import Delivery
from workledger._runtime.broker.dispatch import Broker, Outbox, dispatching
from workledger._runtime.decompose import decompose
from workledger._runtime.handlers.processes import find_app, import_app
from workledger._runtime.overview import MetricsSnapshot
from workledger._runtime.patience import Patience, patient
from workledger._runtime.repair import calendar, operations, retention
from workledger._runtime.repair.audit import (
    AuditFilter,
    AuditPage,
    Finding,
    FindingGroup,
    audit,
    audit_page,
    group_findings,
)
from workledger._runtime.repair.operations import RESOLVE_TARGETS, History
from workledger._runtime.repair.reconcile import differences, reconcile
from workledger._runtime.repair.retention import PruneReport
from workledger._runtime.repair.sweeper import Sweeper, SweepLoop, SweepReport
from workledger._runtime.status import status_of, status_of_new
from workledger._runtime.worker.holder import WorkerOptions, WorkReport
from workledger._runtime.worker.worker import Worker
from workledger.core import durations, limits
from workledger.core.durations import seconds_of
from workledger.core.states import ATTENTION, ITEM_STATES, TERMINAL, ItemState
from workledger.core.status import CLOSE_STAGE, RUN_STATES, RunState
from workledger.core.text import mask_secrets, url_secrets, visible
from workledger.errors import (
    BadInput,
    DecompositionFailed,
    PayloadMismatch,
    UnknownJob,
    UnknownRun,
    UsageError,
)
from workledger.jobs import Job, canonical_json, default_key
from workledger.results import RunStatus, ScheduleStatus, Submission, TenantStatus
from workledger.storage import DEFAULT_URL, open_store, same_database
from workledger.storage import display_url as masked_url
from workledger.storage.port import (
    DeadlineRow,
    EventRow,
    Fired,
    FiringRow,
    ItemRow,
    ItemsQuery,
    NewRun,
    ReasonGroup,
    Reconciled,
    RunRow,
    RunsQuery,
    Store,
    TenantRow,
)

log = logging.getLogger("workledger")

# What the CLI and the HTTP layer use besides the Ledger: they reach the runtime, the storage
# and the core only through this module (the input limits, masking and showing text).
__all__ = ["AuditPage", "CLOSE_STAGE", "DEFAULT_URL", "ITEM_STATES", "RESOLVE_TARGETS",
           "RUN_STATES", "TERMINAL", "ItemState", "RunState",
           "Finding", "FindingGroup", "History", "ItemRow", "Ledger", "MetricsSnapshot",
           "DeadlineRow", "Fired", "FiringRow", "PruneReport", "ReasonGroup", "RunStatus",
           "RunsPage", "ScheduleStatus", "Submission", "SweepLoop", "SweepReport",
           "WorkReport", "Worker", "differences", "group_findings", "import_app", "limits",
           "mask_secrets", "masked_url", "open_private", "parse_deadline", "parse_duration",
           "parse_priority", "parse_weight", "TenantRow",
           "same_database",
           "since_time", "url_secrets", "visible"]

# the states' words come from their enums in core (ITEM_STATES, RUN_STATES: every state
# core/status.py:derive can give a run); failed and unknown items are listed through an index
# of their own, and reasons are kept for them and for skipped ones
ATTENTION_STATES = tuple(s.value for s in ATTENTION)
REASON_STATES = (*ATTENTION_STATES, ItemState.SKIPPED.value)


@dataclass(frozen=True)
class RunsPage:
    """Runs, newest first, and the cursor of the next page (None: nothing older)."""

    runs: list[RunStatus]
    next: int | None



class Ledger:
    """Job definitions plus the database that holds their runs.

    ``url``: ``sqlite:///relative.db``, ``sqlite:////absolute.db`` or
    ``postgresql://user@host:5432/db``; default ``WORKLEDGER_DB`` or ``sqlite:///workledger.db``.
    The database is opened (and migrated) on first use.

    ``dispatch``: a broker to dispatch through instead of the ledger's own workers
    (``workledger.contrib.celery.CeleryDispatch``, ``workledger.contrib.rq.RQDispatch``): the
    messages name items, the ledger decides what becomes of them (docs/design.md, dispatch).
    """

    def __init__(self, url: str | None = None, *, seed: int | None = None,
                 create: bool = True, dispatch: Broker | None = None) -> None:
        self.url = url or os.environ.get("WORKLEDGER_DB") or DEFAULT_URL
        # True: this ledger names its database itself (the CLI's --db may not name another);
        # False: it took WORKLEDGER_DB or the default, and --db chooses
        self.url_named = bool(url)
        # False: a database that holds no ledger is refused (NoLedger), not created
        self.create = create
        self.jobs: dict[str, Job] = {}
        self.app: str | None = None  # module:attribute naming this ledger (set by --app)
        self.rng = random.Random(seed)
        self._store: Store | None = None
        self._lock = threading.Lock()
        self._skips: dict[tuple[int, int, int], tuple[int, list[ReasonGroup]]] = {}
        self.dispatch = dispatch
        self._outbox: Outbox | None = None
        self._delivery: Delivery | None = None
        if dispatch is not None:
            self._through(dispatch)

    # -- database --------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        with self._lock:
            if self._store is None:
                store = open_store(self.url, create=self.create)
                try:
                    store.migrate()
                except BaseException:
                    store.close()
                    raise
                self._store = store if self._outbox is None else dispatching(store,
                                                                            self._outbox)
            return self._store

    # -- dispatch through a broker -----------------------------------------------------------

    def _through(self, dispatch: Broker) -> None:
        self._outbox = Outbox(dispatch, self._app_name)
        self._delivery = Delivery(self.jobs, lambda: patient(self.store, Patience(
            600.0, rng=random.Random(self.rng.random()))), self._outbox, dispatch.options)
        dispatch.bind(self)
        # a broker worker forks its task processes (Celery's prefork pool, RQ's work horse):
        # a child must open its own connections, never use its parent's
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_after_fork(ref))

    def _app_name(self) -> str:
        """``module:attribute`` that names this ledger in a broker's worker processes."""
        assert self.dispatch is not None
        try:
            return self.dispatch.options.app or self.app or find_app(self)
        except UsageError:
            raise UsageError("a broker's workers import the ledger that a message names: "
                             "make this ledger a module's attribute, or give the dispatch "
                             "app='module:attribute'") from None

    def deliver(self, body: Any) -> WorkReport:
        """Run the message a broker delivered (what ``contrib.celery``'s task and
        ``contrib.rq``'s job call): claim exactly the items it names that are still pending,
        run their handlers as a worker does, write the outcomes fenced, and publish what that
        made claimable. A copy of a message already claimed does nothing."""
        if self._delivery is None:
            raise UsageError("this ledger dispatches through no broker (Ledger(dispatch=...))")
        return self._delivery.run(body)

    def wait_out_outages(self, retry_for: float = 600.0) -> None:
        """From now on every call waits out a database outage (a dropped connection, a
        restart) for up to ``retry_for`` seconds before it raises ``DatabaseUnavailable``:
        what a long-lived process (``status --watch``, ``serve``) wants. Logged once per
        outage (``workledger.db``)."""
        store = self.store
        with self._lock:
            self._store = patient(store, Patience(retry_for,
                                                  rng=random.Random(self.rng.random())))

    @property
    def where(self) -> str:
        """The database URL with any password masked: safe to print."""
        return masked_url(self.url)

    def use(self, url: str) -> None:
        """Point this ledger at another database (the CLI's ``--db``)."""
        self.close()
        self.url = url
        self.url_named = True

    def init(self) -> list[int]:
        """Apply missing migrations; return the versions applied (empty when up to date)."""
        store = open_store(self.url)
        try:
            return store.migrate()
        finally:
            store.close()

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs and runs ---------------------------------------------------------------------

    def job(self, name: str, *, tolerate: float | int = 0, full_history: bool = False,
            batch_size: int = 5000, deadline: str | None = None,
            deadline_warning: str | None = None) -> Job:
        """Define (or fetch) the job called ``name``.

        ``tolerate``: failed units a run may have and still end ``completed_with_failures``
        (a fraction below 1, or a count). ``full_history``: also record plain claims and
        completions in ``wl_events``. ``batch_size``: item rows per decomposition transaction.
        ``deadline``: a duration (``"6h"``) after its submission or firing by which each run
        should be complete (else ``audit`` reports it, exit 1); ``deadline_warning``: how long
        before the deadline an open run is reported as near it.
        """
        if name not in self.jobs:
            self.jobs[name] = Job(self, name, tolerate=tolerate, full_history=full_history,
                                  batch_size=batch_size, deadline=deadline,
                                  deadline_warning=deadline_warning)
        return self.jobs[name]

    def job_named(self, name: str) -> Job:
        try:
            return self.jobs[name]
        except KeyError:
            known = ", ".join(sorted(self.jobs)) or "none"
            raise UnknownJob(f"unknown job {name!r} (defined: {known})") from None

    def submit(self, job_name: str, payload: Any, key: str | None = None,
               conn: Any = None, *, deadline: Any = None, priority: int = 0,
               tenant: str | None = None) -> Submission:
        """Record a run, decompose it, and return its real state.

        ``priority``: a whole number from -1000 to 1000 (default 0). A claimable item of a
        higher-priority run is claimed before any of a lower one (docs/design.md, "Claim
        order"); :meth:`set_priority` changes it while the run is open. A repeated submission
        returns the run as it is, priority included.

        ``tenant``: the customer the run is for (printable text, no spaces, at most 200
        bytes; None and ``"default"``: the default tenant). Among runs of one priority, claims
        rotate across the tenants with claimable work, each in proportion to its weight
        (:meth:`set_tenant_weight`, 1 by default), and across a tenant's runs in turn.

        ``deadline``: a timezone-aware datetime, or a duration after submission (``"2h"``),
        by which the run should be complete (default: the job's ``deadline``); a run past it
        is an ``audit`` finding, an event, a flag in the dashboard and a metric.

        A key that exists already returns that run (``created=False``) and its real state;
        the same key with another payload raises :class:`PayloadMismatch` and writes nothing.
        Run ids increase and are never given twice, but need not be consecutive (on PostgreSQL
        a repeated, refused or rolled-back submission uses one up): keep the id returned.

        ``conn``: the caller's open connection to this ledger's database (a psycopg 3
        connection on PostgreSQL, a ``sqlite3.Connection`` to the same file on SQLite). The
        run is then recorded in the caller's transaction, uncommitted: it exists if and only
        if the caller commits, and is decomposed after the commit by a worker or the sweeper
        (its state here is ``accepted``)::

            with psycopg.connect(url) as conn:          # doctest: +SKIP
                conn.execute("INSERT INTO orders ...")
                ledger.submit("fulfil", {"order": 7}, key="order-7", conn=conn)
            # committed: the order and its run, or neither
        """
        job = self.job_named(job_name)
        job.check_ready()
        inputs.check_key(key)
        rank = inputs.priority_of(priority)
        text = canonical_json(payload)
        new = NewRun(job.name, key or default_key(text), text, float(job.tolerate),
                     closing=job.closing is not None,
                     deadline=inputs.deadline_of(deadline, job.deadline, job.deadline_warning),
                     priority=rank, tenant=inputs.tenant_of(tenant))
        if conn is not None:
            return self._submit_in(conn, job, new)
        run, created = self.store.run_submit(new)
        if not created:
            self._same_payload(job, run, text)
            if run.decomposed_at is None and run.error is None and run.cancelled_at is None:
                # its decomposition was cut short (a crash, a full disk): carry it on now, as
                # the sweeper would; rows already written are not written twice
                # (checked against the rows already written, as the sweeper does: a source
                # that changed since marks the run failed rather than mixing two versions)
                return Submission(run.id, False,
                                  self._status_of(self._decompose(job, run, resume=True)),
                                  resumed=True)
            return Submission(run.id, False, self._status_of(run))
        return Submission(run.id, True, self._status_of(self._decompose(job, run)))

    def _submit_in(self, conn: Any, job: Job, new: NewRun) -> Submission:
        """Only the run row and its event, in the caller's transaction; the ledger's schema is
        migrated through this ledger's own store first (``self.store``), never in there."""
        run, created = self.store.run_submit_in(conn, new)
        if not created:
            self._same_payload(job, run, new.payload)
        # its real state through the ledger's own store: a run of this transaction, which
        # it cannot see yet, has no item: accepted
        return Submission(run.id, created, self._status_of(run))

    def submit_many(self, job_name: str, runs: Iterable[tuple[Any, str | None]], *,
                    priority: int = 0, tenant: str | None = None) -> list[Submission]:
        """Record many runs of one job in one transaction, each decomposed, and return one
        :class:`Submission` per ``(payload, key)`` pair, in order.

        Each pair answers as :meth:`submit` would: a key that names a run already returns
        that run as it is (``created=False``), and a key given twice in the call is one run.
        Before anything is written the whole call is checked: a bad key, a payload that is not
        JSON, a decomposer that raises (:class:`DecompositionFailed`, ``run_id`` 0) or a key
        reused with another payload (:class:`PayloadMismatch`) writes no run of the call.
        Meant for many small runs (a notification batch, one run per customer): every run's
        items are held in memory until the commit; a big run goes through :meth:`submit`,
        which writes its items in batches. A job dispatched through a broker records its runs
        one :meth:`submit` at a time (each owes its messages). ``priority`` and ``tenant``
        (as :meth:`submit` takes them) are every run's."""
        job = self.job_named(job_name)
        job.check_ready()
        rank = inputs.priority_of(priority)
        owner = inputs.tenant_of(tenant)
        entries, where = many.planned(job, runs, rank,
                                      inputs.deadline_of(None, job.deadline,
                                                         job.deadline_warning), owner)
        if self.dispatch is not None:
            subs = [self.submit(job.name, json.loads(e.run.payload), key=e.run.idempotency_key,
                                priority=rank, tenant=owner) for e in entries]
            return many.in_order(subs, where)
        recorded = self.store.runs_submit_many(
            entries, check=lambda run, new: self._same_payload(job, run, new.payload))
        answers: list[Submission] = []
        for entry, (run, created) in zip(entries, recorded, strict=True):
            if created:
                answers.append(Submission(run.id, True, status_of_new(
                    run, job, many.counts_of(entry))))
            elif run.decomposed_at is None and run.error is None and run.cancelled_at is None:
                # cut short before (a crash mid-submit): carried on now, as submit would
                answers.append(Submission(run.id, False, self._status_of(
                    self._decompose(job, run, resume=True)), resumed=True))
            else:
                answers.append(Submission(run.id, False, self._status_of(run)))
        return many.in_order(answers, where)

    @staticmethod
    def _same_payload(job: Job, run: RunRow, text: str) -> None:
        if canonical_json(run.payload) != text:
            raise PayloadMismatch(
                f"key {run.idempotency_key!r} already names run {run.id} of job {job.name!r}"
                " with a different payload; nothing was written", run.id)

    def _decompose(self, job: Job, run: RunRow, resume: bool = False) -> RunRow:
        try:
            return decompose(self.store, job, run, check_existing=resume)
        except DecompositionFailed as exc:
            exc.status = self.status(run.id)
            raise

    def work(
        self,
        *,
        concurrency: int = 4,
        until_idle: bool = True,
        chunk: int = 100,
        lease: float = 30.0,
        jobs: Sequence[str] | None = None,
        on_progress: Callable[[WorkReport], None] | None = None,
        timeout: float | None = None,
        db_retry_for: float = 600.0,
        processes: int = 1,
        app: str | None = None,
    ) -> WorkReport:
        """Claim, run and complete items until stopped (or, with ``until_idle``, until idle)."""
        return self.worker(concurrency=concurrency, until_idle=until_idle, chunk=chunk,
                           lease=lease, jobs=jobs, on_progress=on_progress, timeout=timeout,
                           db_retry_for=db_retry_for, processes=processes, app=app).run()

    def worker(
        self,
        *,
        concurrency: int = 4,
        until_idle: bool = False,
        chunk: int = 100,
        lease: float = 30.0,
        jobs: Sequence[str] | None = None,
        on_progress: Callable[[WorkReport], None] | None = None,
        timeout: float | None = None,
        db_retry_for: float = 600.0,
        processes: int = 1,
        app: str | None = None,
    ) -> Worker:
        """A worker for the loaded jobs (or ``jobs``). ``concurrency``: handlers that run at
        once (threads, or coroutines for async stages). ``timeout``: a handler's time limit
        where its stage sets none. ``db_retry_for``: seconds of continuous database outage it
        waits out before it gives up (``OutageTooLong``). ``processes``: run handlers in that
        many child processes (more than 1), each importing ``app`` (``module:attribute``
        naming this ledger; found by itself when this ledger is a module's attribute)."""
        chosen = {name: self.job_named(name) for name in (jobs or sorted(self.jobs))}
        for job in chosen.values():
            job.check_ready()
        if processes > 1:
            app = app or self.app or find_app(self)
        options = WorkerOptions(concurrency=concurrency, chunk=chunk, lease=lease,
                                until_idle=until_idle, timeout=timeout, processes=processes,
                                app=app)
        store = patient(self.store, Patience(db_retry_for, rng=random.Random(self.rng.random())))
        worker = Worker(store, chosen, options, rng=random.Random(self.rng.random()),
                        on_progress=on_progress)
        worker.where = self.where
        worker.sweeper = self.sweeper(actor=worker.worker_id, lease=lease, jobs=list(chosen),
                                      timeout=timeout, store=store)
        return worker

    # -- recovery and repair ---------------------------------------------------------------

    def sweeper(
        self, *, actor: str = "sweeper", grace: float = 30.0, lease: float = 30.0,
        jobs: Sequence[str] | None = None, backoff: float = 30.0,
        timeout: float | None = None, store: Store | None = None,
    ) -> Sweeper:
        """A sweeper for the loaded jobs. ``backoff``: a run whose decomposer failed n times
        is decomposed again only backoff * 2^(n-1) seconds (at most an hour) after its last
        failure (0: every pass). ``timeout``: a verify or closing hook's time limit where its
        stage sets none."""
        chosen = {name: self.job_named(name) for name in (jobs or sorted(self.jobs))}
        on = store or self.store
        outbox = self._outbox
        redispatch = None if outbox is None else (
            lambda: outbox.redispatch(on, on.runs_claimable(sorted(chosen))))
        return Sweeper(on, chosen, self.status, actor=actor, grace=grace,
                       lease=lease, rng=random.Random(self.rng.random()), backoff=backoff,
                       timeout=timeout, redispatch=redispatch)

    def sweep(self, *, grace: float = 30.0, lease: float = 30.0) -> SweepReport:
        """One sweeper pass now (by hand: a failing decomposer is retried at once, no backoff):
        re-decompose, expired leases, verify, closing hooks (each closing hook run under a
        lease of ``lease`` seconds, like a worker's items)."""
        sweeper = self.sweeper(grace=grace, lease=lease, backoff=0.0)
        report = sweeper.sweep()
        sweeper.finish_overruns()  # a closing hook past its limit: its outcome, once it ends
        return report

    def retry(self, run_id: int, *, stage: str | None = None, seqs: Sequence[int] | None = None,
              note: str | None = None, actor: str = "operator") -> int:
        """Redrive failed items (all, one stage's, or some seqs); returns how many moved.
        Refused (``Refused``, nothing changed) in a cancelled run; an unknown stage or seq is a
        ``UsageError``."""
        inputs.check_name("stage name", stage)
        run = self._run(run_id)
        return operations.retry(self.store, run, self.jobs.get(run.job), stage=stage,
                                seqs=seqs, actor=actor, note=note)

    def resolve(self, run_id: int, stage: str, seq: int, as_state: str, *,
                note: str | None = None, actor: str = "operator") -> bool:
        run, job = self._resolving(run_id, stage, [seq], as_state)
        return operations.resolve(self.store, job, run, stage, seq,
                                  as_state, actor=actor, note=note)

    def resolve_many(self, run_id: int, stage: str, as_state: str, *,
                     seqs: Sequence[int] | None = None, note: str | None = None,
                     actor: str = "operator") -> tuple[int, int]:
        """Settle the stage's unknown items (``seqs``, or all of them) by one decision, each by
        its own guarded move and audited. Returns (resolved, settled by someone else)."""
        run, job = self._resolving(run_id, stage, seqs or (), as_state)
        return operations.resolve_many(self.store, job, run, stage, as_state, seqs=seqs,
                                       actor=actor, note=note)

    def _resolving(self, run_id: int, stage: str, seqs: Sequence[int],
                   as_state: str) -> tuple[RunRow, Job | None]:
        """The checks every resolution makes first; the run and its job's definition."""
        inputs.check_name("stage name", stage)
        for seq in seqs:
            inputs.check_id("item", seq)
        run = self._run(run_id)
        job = self.jobs.get(run.job)
        if job is None and as_state == ItemState.PROCESSED:
            raise UsageError(f"resolving as processed needs the definition of job {run.job!r} "
                             "(its next stage): pass --app module:attribute")
        return run, job

    def ack(self, run_id: int, *, note: str, stage: str | None = None, seq: int | None = None,
            actor: str = "operator") -> int:
        """Acknowledge the run's failed items (or one stage's, or one item): ``audit`` lists
        them as reviewed and stops alerting on them. Returns how many it covers."""
        inputs.check_name("stage name", stage)
        run = self._run(run_id)
        return operations.ack(self.store, run, self.jobs.get(run.job), stage=stage, seq=seq,
                              note=note, actor=actor)

    def pause(self, run_id: int, *, note: str | None = None, actor: str = "operator") -> bool:
        """Stop claiming the run's items (False: paused already). A finished run refuses."""
        run = self._run(run_id)
        return operations.pause(self.store, run, self.jobs.get(run.job), actor=actor, note=note)

    def set_priority(self, run_id: int, priority: int, *, note: str | None = None,
                     actor: str = "operator") -> bool:
        """Change an open run's priority (audited: a ``priority_changed`` event with the old
        and the new one); False when it had that priority already. A finished run refuses."""
        rank = inputs.priority_of(priority)
        run = self._run(run_id)
        return operations.set_priority(self.store, run, self.jobs.get(run.job), rank,
                                       actor=actor, note=note)

    def set_tenant_weight(self, tenant: str, weight: int, *, note: str | None = None,
                          actor: str = "operator") -> bool:
        """Give ``tenant`` a share of the claims in proportion to ``weight`` (1 to 1000; every
        tenant weighs 1 until given another), among the tenants with claimable work at one
        priority; ``"default"`` is the tenant of the runs without one. Recorded with who set
        it and why (:meth:`tenants`); False when the tenant had that weight already. Workers
        see it within a second."""
        name = inputs.tenant_name(tenant)
        share = inputs.weight_of(weight)
        done = self.store.tenant_set_weight(name, share, actor, note)
        if done:
            log.info("tenant %s: weight %d (by %s%s)", name, share, actor,
                     f": {note}" if note else "")
        return done

    def tenants(self) -> list[TenantRow]:
        """The tenants given a weight, by name, with who set it last and why."""
        return self.store.tenants_list()

    def tenant(self, tenant: str) -> TenantStatus:
        """A tenant's weight (1 unless set), who set it last and why, and its open runs."""
        name = inputs.tenant_name(tenant)
        row = next((t for t in self.store.tenants_list() if t.name == name), None)
        open_runs = self.store.tenant_open_runs(name)
        if row is None:
            return TenantStatus(name, 1, open_runs)
        return TenantStatus(name, row.weight, open_runs, row.updated_at, row.updated_by,
                            row.note)

    def resume(self, run_id: int, *, note: str | None = None, actor: str = "operator") -> bool:
        """Let workers claim the run again (False: it was not paused). A finished run refuses."""
        run = self._run(run_id)
        return operations.resume(self.store, run, self.jobs.get(run.job), actor=actor,
                                 note=note)

    def cancel(self, run_id: int, *, note: str | None = None, actor: str = "operator") -> int:
        """Skip the run's pending items (-1: cancelled already). A finished run refuses."""
        run = self._run(run_id)
        return operations.cancel(self.store, run, self.jobs.get(run.job), actor=actor,
                                 note=note)

    def history(self, run_id: int, stage: str, seq: int) -> operations.History:
        inputs.check_name("stage name", stage)
        inputs.check_id("item", seq)
        self._run(run_id)
        return operations.history(self.store, run_id, stage, seq)

    def reconcile(self, run_id: int, *, dry_run: bool = False,
                  actor: str = "operator") -> Reconciled:
        """Derive the run's counters from its items; without ``dry_run`` repair the stored ones."""
        run = self._run(run_id)
        job = self.jobs.get(run.job)
        stages = [s.name for s in job.stages] if job else []
        return reconcile(self.store, run_id, stages, dry_run=dry_run, actor=actor)

    def audit(self, *, run_id: int | None = None, job: str | None = None,
              since: str | None = None) -> list[Finding]:
        """Every stranded run and item, with the path that will move it; of one run, of one
        job, or since a time (``since_time("24h")``) only. A finding with ``needs_person``
        false is moved by a process, or was reviewed (within tolerance, acknowledged)."""
        inputs.check_name("job name", job)  # a filter the database must be able to hold
        return audit(self.store, self.jobs, AuditFilter(run_id, job, since))

    def audit_page(self, *, run_id: int | None = None, job: str | None = None,
                   since: str | None = None, limit: int = 1000, after: str | None = None
                   ) -> AuditPage:
        """:meth:`audit` a page at a time: at most ``limit`` findings from the cursor
        ``after`` (the previous page's ``next``) on."""
        inputs.check_name("job name", job)
        return audit_page(self.store, self.jobs, AuditFilter(run_id, job, since), limit, after)

    # -- schedules (docs/design.md, "Schedules and deadlines") -------------------------------

    def schedules(self) -> list[ScheduleStatus]:
        """Every schedule the loaded app declares or the ledger recorded, by name: spec, time
        zone, next and last firing, the last run and its state, paused or not."""
        def state_of(run_id: int) -> str | None:
            run = self.store.run_get(run_id)
            return None if run is None else self._status_of(run).state

        return calendar.statuses(self.store, self.jobs, state_of)

    def schedule_loop(self) -> SweepLoop | None:
        """A background loop that fires the loaded app's schedules (only those: no leases, no
        hooks) while this process leads them: what ``serve --app`` runs. None without schedules.
        ``start()`` it; ``stop()`` waits for its pass in progress."""
        if not any(job.schedules for job in self.jobs.values()):
            return None
        store = patient(self.store, Patience(600.0, rng=random.Random(self.rng.random())))
        sweeper = self.sweeper(actor="serve", store=store)
        return SweepLoop(sweeper, store, 10.0, lambda report: None, only_fire=True)

    def firings(self, name: str, limit: int = 20) -> list[FiringRow]:
        """The schedule's recorded firings, newest first."""
        inputs.check_name("schedule name", name)
        inputs.check_limit(limit)
        return self.store.firings_list(name, limit)

    def schedule_pause(self, name: str, *, actor: str = "operator") -> bool:
        """Stop firing ``name`` (False: paused already). UnknownSchedule unless declared."""
        inputs.check_name("schedule name", name)
        return calendar.set_paused(self.store, self.jobs, name, True, actor)

    def schedule_resume(self, name: str, *, actor: str = "operator") -> bool:
        """Fire ``name`` again; what it missed while paused follows its catch-up rule."""
        inputs.check_name("schedule name", name)
        return calendar.set_paused(self.store, self.jobs, name, False, actor)

    def schedule_fire(self, name: str, *, actor: str = "operator") -> tuple[datetime, Fired]:
        """One firing now (keyed by now, to the second), under the schedule's overlap rule."""
        inputs.check_name("schedule name", name)
        return calendar.fire_now(self.store, self.jobs, name, actor)

    def schedule_backfill(self, name: str, start: datetime, end: datetime, *,
                          dry_run: bool = False, yes: bool = False,
                          actor: str = "operator") -> list[tuple[datetime, Fired | None]]:
        """Every planned firing from ``start`` to ``end`` (aware datetimes, both included),
        each recorded at most once, so a repeated backfill adds nothing; ``dry_run``: only the
        times (each with None). More than 10,000 firings need ``yes``; ``start`` after ``end``
        is refused (BadInput, nothing written)."""
        inputs.check_name("schedule name", name)
        for what, t in (("--from", start), ("--to", end)):
            if t.tzinfo is None or t.utcoffset() is None:
                raise BadInput(f"backfill: {what} must carry a time zone (2026-01-25T06:00Z)")
        times = calendar.backfill_times(self.jobs, name, start, end,
                                        None if yes else calendar.BACKFILL_MAX)
        if dry_run:
            return [(t, None) for t in times]
        return list(calendar.backfill(self.store, self.jobs, name, times, actor))

    def deadlines(self, limit: int = 1000) -> tuple[datetime, list[DeadlineRow]]:
        """Open runs past their deadline or inside its warning, with the database's now."""
        return self.store.runs_deadlines(limit)

    # -- reading ---------------------------------------------------------------------------

    def _run(self, run_id: int) -> RunRow:
        inputs.check_id("run", run_id)
        run = self.store.run_get(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id} in {self.where}")
        return run

    def status(self, run_id: int) -> RunStatus:
        return self._status_of(self._run(run_id))

    def runs(self, limit: int = 100, *, before: int | None = None,
             tenant: str | None = None) -> list[RunStatus]:
        """The most recent runs (below id ``before``, to page back), newest first; of
        ``tenant`` only when given (``"default"``: the runs without one)."""
        return [self._status_of(r) for r in self._runs_list(limit, before, tenant)]

    def run_ids(self, limit: int = 100, *, before: int | None = None,
                tenant: str | None = None) -> list[int]:
        """The ids :meth:`runs` would list, without deriving each run's status."""
        return [r.id for r in self._runs_list(limit, before, tenant)]

    def count_runs(self, *, before: int | None = None, tenant: str | None = None) -> int:
        """How many runs there are (below id ``before``, of ``tenant``): what a listing cut
        short says."""
        inputs.check_id("run", before)
        return self.store.runs_count(before, _tenant_filter(tenant))

    def _runs_list(self, limit: int, before: int | None, tenant: str | None) -> list[RunRow]:
        inputs.check_limit(limit)
        inputs.check_id("run", before)
        return self.store.runs_list(limit, before, _tenant_filter(tenant))

    def items(
        self, run_id: int, *, stage: str | None = None, state: str | None = None,
        limit: int = 1000, after_id: int = 0,
    ) -> list[ItemRow]:
        """The run's items in id order, after item ``after_id`` (to page on)."""
        inputs.check_limit(limit)
        return self.store.items_list(self._items_query(run_id, stage, state, limit, after_id))

    def count_items(self, run_id: int, *, stage: str | None = None, state: str | None = None,
                    after_id: int = 0) -> int:
        """How many items :meth:`items` would list without a limit: what a cut listing says."""
        return self.store.items_count(self._items_query(run_id, stage, state, 1, after_id))

    def _items_query(self, run_id: int, stage: str | None, state: str | None, limit: int,
                     after_id: int) -> ItemsQuery:
        inputs.check_name("stage name", stage)
        inputs.check_id("item", after_id)
        self._run(run_id)
        return ItemsQuery(run_id, stage, state, limit, after_id)

    def events(self, run_id: int, item_id: int | None = None) -> list[EventRow]:
        return self.store.events_list(run_id, item_id)

    def _status_of(self, run: RunRow) -> RunStatus:
        return status_of(self.store, run, self.jobs.get(run.job))

    # -- for the HTTP layer and metrics; retention ---------------------------------------------

    def runs_page(self, *, job: str | None = None, state: str | None = None, limit: int = 100,
                  after: int | None = None) -> RunsPage:
        """Runs newest first, ids below ``after``; with ``state``, only runs in that derived
        state. A state is derived, not stored, so a filtered page looks at up to ten pages of
        runs and may come back short with a ``next`` cursor to go on from."""
        inputs.check_name("job name", job)  # a filter the database must be able to hold
        if state is not None and state not in RUN_STATES:
            raise BadInput(f"unknown run state {state!r} (one of {', '.join(RUN_STATES)})")
        if limit < 1 or (after is not None and after < 0):
            raise BadInput("limit must be at least 1 and the cursor not negative")
        found: list[RunStatus] = []
        cursor, scanned = after, 0
        while True:
            rows = self.store.runs_page(RunsQuery(job, cursor, limit))
            for row in rows:
                cursor, scanned = row.id, scanned + 1
                st = self._status_of(row)
                if state is None or st.state == state:
                    found.append(st)
                if len(found) == limit or scanned >= limit * 10:
                    break
            else:
                if len(rows) < limit:
                    return RunsPage(found, None)
                continue
            break
        more = bool(self.store.runs_page(RunsQuery(job, cursor, 1)))
        return RunsPage(found, cursor if more else None)

    def items_page(self, run_id: int, *, stage: str | None = None, state: str | None = None,
                   key: str | None = None, limit: int = 100, after_id: int = 0) -> list[ItemRow]:
        """Like :meth:`items`, and by ``key``; failed and unknown items through their own
        index, so listing them never walks a run of a million items."""
        if state is not None and state not in ITEM_STATES:
            raise BadInput(f"unknown item state {state!r} (one of {', '.join(ITEM_STATES)})")
        inputs.check_name("stage name", stage)  # filters the database must be able to hold
        inputs.check_key(key)
        self._run(run_id)
        query = ItemsQuery(run_id, stage, state, limit, after_id)
        if key is not None:
            return self.store.items_by_key(query, key)
        if state in ATTENTION_STATES:
            return self.store.run_attention(query)
        return self.store.items_list(query)

    def item(self, run_id: int, stage: str, seq: int) -> ItemRow | None:
        inputs.check_name("stage name", stage)
        inputs.check_id("item", seq)
        self._run(run_id)
        rows = self.store.items_list(ItemsQuery(run_id, stage, None, 1, 0, seq))
        return rows[0] if rows else None

    def run_waits(self, run_id: int) -> tuple[int, int]:
        """(expired leases, retries not yet due) of the run."""
        self._run(run_id)
        expired, waiting, _verifying = self.store.run_waits(run_id)
        return expired, waiting

    def pending_ages(self, run_id: int) -> dict[str, float]:
        """Per stage, the age in seconds of the oldest of the items workers claim next."""
        return self.store.pending_heads(run_id, overview.HEAD_WINDOW)

    def reasons(self, run_id: int, state: str, *, window: int = 10_000,
                groups: int = 50) -> list[ReasonGroup]:
        """The run's failed, skipped or unknown items (the first ``window``) grouped by
        stage and reason, largest group first."""
        if state not in REASON_STATES:
            raise BadInput(f"reasons are kept for failed, skipped and unknown items, not {state}")
        if state != ItemState.SKIPPED:  # through the attention index: cheap
            return self.store.run_reasons(run_id, state, window, groups)
        # No index holds skipped items, so grouping them walks the run. But nothing leaves
        # `skipped` and its reason never changes: while the run's count of skipped items is
        # the same, so are the groups, and they are kept for the next reader.
        skipped = sum(c.get(ItemState.SKIPPED, 0) for c in self.store.run_counts(run_id).values())
        key = (run_id, window, groups)
        with self._lock:
            kept = self._skips.get(key)
        if kept is not None and kept[0] == skipped:
            return kept[1]
        found = self.store.run_reasons(run_id, state, window, groups)
        with self._lock:
            if len(self._skips) >= 256:
                self._skips.pop(next(iter(self._skips)))
            self._skips[key] = (skipped, found)
        return found

    def metrics(self) -> MetricsSnapshot:
        """What ``/metrics`` reports: cheap at any number of items (_runtime/overview.py)."""
        return overview.metrics_snapshot(self.store, self.jobs)

    def ping(self) -> None:
        """Raise ``DatabaseUnavailable`` (or ``StorageError``) unless the database answers."""
        self.store.schema_version()

    def prune(self, older_than: float, *, job: str | None = None, dry_run: bool = False,
              export: TextIO | None = None) -> PruneReport:
        """Delete runs finished more than ``older_than`` seconds ago, with their items, events
        and counts, in short batches; ``export``: write them as JSON Lines first."""
        if older_than < 0:
            raise BadInput("the cutoff must not be negative")
        return retention.prune(self.store, self.jobs, older_than, job=job, dry_run=dry_run,
                               export=export)


def _forget_after_fork(ref: weakref.ReferenceType[Ledger]) -> None:
    """In a forked child: drop (never close) the parent's connections; the child opens its
    own on first use."""
    ledger = ref()
    if ledger is not None:
        ledger._store = None
        ledger._lock = threading.Lock()


def open_private(path: str | os.PathLike[str]) -> TextIO:
    """``path`` opened to append text, created readable and writable by its owner only
    (``0600``, whatever the umask): an export holds payloads and results."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    return os.fdopen(fd, "a", encoding="utf-8")


def _tenant_filter(tenant: str | None) -> str | None:
    return None if tenant is None else inputs.tenant_name(tenant)


def parse_weight(text: str) -> int:
    """A tenant's weight as the CLI and the HTTP API take it, as text: a whole number;
    :meth:`Ledger.set_tenant_weight` checks its range."""
    if re.fullmatch(r"[0-9]{1,5}", text, re.ASCII) is None:
        raise BadInput(f"weight: expected a whole number from {limits.WEIGHT_MIN} to "
                       f"{limits.WEIGHT_MAX}, got {text[:20]!r}")
    return int(text)


def parse_priority(text: str | None) -> int:
    """A priority as the CLI and the HTTP API take it, as text: a whole number (None: 0);
    :meth:`Ledger.submit` checks its range."""
    if text is None:
        return 0
    if re.fullmatch(r"-?[0-9]{1,5}", text, re.ASCII) is None:  # not '١٢', '1_000', ' 7'
        raise BadInput(f"priority: expected a whole number from {limits.PRIORITY_MIN} to "
                       f"{limits.PRIORITY_MAX}, got {text[:20]!r}"
                       f"{'...' if len(text) > 20 else ''}")
    return int(text)


def parse_deadline(text: str | None) -> str | datetime | None:
    """A deadline as a person types it (``submit --deadline``, ``?deadline=``), as ``submit``
    takes it: a duration (``2h``) stays text, an ISO 8601 time becomes a datetime (its zone is
    checked by ``submit``). :class:`~workledger.errors.BadInput` for anything else."""
    if text is None or durations.seconds_of(text) is not None:
        return text
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise BadInput(f"deadline {text!r}: expected a duration (2h, 90m) or an ISO 8601 time "
                       "with its zone (2026-01-25T18:00+01:00)") from None


def parse_duration(text: str) -> float:
    """``"30d"`` -> seconds (``core/durations.py``): prune's ``--finished-before``, serve's
    ``--prune-after``. :class:`~workledger.errors.BadInput` for anything else, in one line."""
    try:
        return durations.parse_duration(text)
    except durations.BadDuration as exc:
        raise BadInput(str(exc)) from None


def since_time(text: str, now: datetime | None = None) -> str:
    """A cutoff as the ledger writes times (UTC, fixed width): ``30m``, ``24h``, ``7d``, ``2w``
    ago, or an ISO date or time (``2026-11-30``, ``2026-11-30T09:00:00+01:00``).
    :class:`~workledger.errors.BadInput` for anything else."""
    text = text.strip()
    age = seconds_of(text)
    if age is not None:
        try:
            when = (now or datetime.now(UTC)) - timedelta(seconds=age)
        except (OverflowError, ValueError):  # further back than any date: beyond year 1
            raise BadInput(f"--since {text!r}: an age beyond year 1; give a smaller one "
                           "(30m, 24h, 7d, 2w)") from None
    else:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise BadInput(f"--since {text!r}: give an age (30m, 24h, 7d, 2w) or an ISO date "
                           "or time (2026-11-30, 2026-11-30T09:00:00Z)") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        try:
            when = when.astimezone(UTC)
        except OverflowError:  # 9999-12-31T23:59-23:59 is in year 10000 in UTC
            raise BadInput(f"--since {text!r}: a time beyond the years 1 to 9999 in UTC; give "
                           "one within them") from None
    return when.isoformat(sep=" ", timespec="microseconds")
