"""The facade: ``Ledger`` holds job definitions and a store, and offers submit, work, status.

>>> ledger = Ledger("sqlite:///workledger.db")              # doctest: +SKIP
>>> sub = ledger.job("ingest-events").submit({"events": []})  # doctest: +SKIP
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from workledger.errors import (
    DecompositionFailed,
    PayloadMismatch,
    UnknownJob,
    UnknownRun,
    UsageError,
)
from workledger.runtime import operations
from workledger.runtime.audit import Finding, audit
from workledger.runtime.decompose import decompose
from workledger.runtime.jobs import Job, canonical_json, default_key
from workledger.runtime.operations import RESOLVE_TARGETS
from workledger.runtime.reconcile import differences, reconcile
from workledger.runtime.results import RunStatus, Submission
from workledger.runtime.status import status_of
from workledger.runtime.sweeper import Sweeper, SweepReport
from workledger.runtime.worker import Worker, WorkerOptions, WorkReport
from workledger.storage import DEFAULT_URL, open_store
from workledger.storage import display_url as masked_url
from workledger.storage.port import (
    EventRow,
    ItemRow,
    ItemsQuery,
    NewRun,
    Reconciled,
    RunRow,
    Store,
)

# What the CLI and the HTTP layer use besides the Ledger: they reach the runtime and the
# storage only through this module.
__all__ = ["DEFAULT_URL", "RESOLVE_TARGETS", "Finding", "Ledger", "RunStatus", "Submission",
           "SweepReport", "WorkReport", "Worker", "differences", "masked_url"]


class Ledger:
    """Job definitions plus the database that holds their runs.

    ``url``: ``sqlite:///relative.db``, ``sqlite:////absolute.db`` or
    ``postgresql://user@host:5432/db``; default ``WORKLEDGER_DB`` or ``sqlite:///workledger.db``.
    The database is opened (and migrated) on first use.
    """

    def __init__(self, url: str | None = None, *, seed: int | None = None) -> None:
        self.url = url or os.environ.get("WORKLEDGER_DB") or DEFAULT_URL
        self.jobs: dict[str, Job] = {}
        self.rng = random.Random(seed)
        self._store: Store | None = None
        self._lock = threading.Lock()

    # -- database --------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        with self._lock:
            if self._store is None:
                store = open_store(self.url)
                try:
                    store.migrate()
                except BaseException:
                    store.close()
                    raise
                self._store = store
            return self._store

    @property
    def where(self) -> str:
        """The database URL with any password masked: safe to print."""
        return masked_url(self.url)

    def use(self, url: str) -> None:
        """Point this ledger at another database (the CLI's ``--db``)."""
        self.close()
        self.url = url

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
            batch_size: int = 5000) -> Job:
        """Define (or fetch) the job called ``name``.

        ``tolerate``: failed units a run may have and still end ``completed_with_failures``
        (a fraction below 1, or a count). ``full_history``: also record plain claims and
        completions in ``wl_events``. ``batch_size``: item rows per decomposition transaction.
        """
        if name not in self.jobs:
            self.jobs[name] = Job(self, name, tolerate=tolerate, full_history=full_history,
                                  batch_size=batch_size)
        return self.jobs[name]

    def job_named(self, name: str) -> Job:
        try:
            return self.jobs[name]
        except KeyError:
            known = ", ".join(sorted(self.jobs)) or "none"
            raise UnknownJob(f"unknown job {name!r} (defined: {known})") from None

    def submit(self, job_name: str, payload: Any, key: str | None = None) -> Submission:
        """Record a run, decompose it, and return its real state.

        A key that exists already returns that run (``created=False``) and its real state;
        the same key with another payload raises :class:`PayloadMismatch` and writes nothing.
        """
        job = self.job_named(job_name)
        job.check_ready()
        text = canonical_json(payload)
        run, created = self.store.run_submit(NewRun(job.name, key or default_key(text), text,
                                                     float(job.tolerate)))
        if not created:
            if canonical_json(run.payload) != text:
                raise PayloadMismatch(
                    f"key {run.idempotency_key!r} already names run {run.id} of job {job.name!r}"
                    " with a different payload; nothing was written", run.id)
            return Submission(run.id, False, self._status_of(run))
        try:
            run = decompose(self.store, job, run)
        except DecompositionFailed as exc:
            exc.status = self.status(run.id)
            raise
        return Submission(run.id, True, self._status_of(run))

    def work(
        self,
        *,
        concurrency: int = 4,
        until_idle: bool = True,
        chunk: int = 100,
        lease: float = 30.0,
        jobs: Sequence[str] | None = None,
        on_progress: Callable[[WorkReport], None] | None = None,
    ) -> WorkReport:
        """Claim, run and complete items until stopped (or, with ``until_idle``, until idle)."""
        return self.worker(concurrency=concurrency, until_idle=until_idle, chunk=chunk,
                           lease=lease, jobs=jobs, on_progress=on_progress).run()

    def worker(
        self,
        *,
        concurrency: int = 4,
        until_idle: bool = False,
        chunk: int = 100,
        lease: float = 30.0,
        jobs: Sequence[str] | None = None,
        on_progress: Callable[[WorkReport], None] | None = None,
    ) -> Worker:
        chosen = {name: self.job_named(name) for name in (jobs or sorted(self.jobs))}
        for job in chosen.values():
            job.check_ready()
        options = WorkerOptions(concurrency=concurrency, chunk=chunk, lease=lease,
                                until_idle=until_idle)
        worker = Worker(self.store, chosen, options, rng=random.Random(self.rng.random()),
                        on_progress=on_progress)
        worker.sweeper = self.sweeper(actor=worker.worker_id, lease=lease, jobs=list(chosen))
        return worker

    # -- recovery and repair ---------------------------------------------------------------

    def sweeper(
        self, *, actor: str = "sweeper", grace: float = 30.0, lease: float = 30.0,
        jobs: Sequence[str] | None = None,
    ) -> Sweeper:
        chosen = {name: self.job_named(name) for name in (jobs or sorted(self.jobs))}
        return Sweeper(self.store, chosen, self.status, actor=actor, grace=grace, lease=lease,
                       rng=random.Random(self.rng.random()))

    def sweep(self, *, grace: float = 30.0, lease: float = 30.0) -> SweepReport:
        """One sweeper pass: re-decompose, expired leases, verify, closing hooks (each closing
        hook run under a lease of ``lease`` seconds, like a worker's items)."""
        return self.sweeper(grace=grace, lease=lease).sweep()

    def retry(self, run_id: int, *, stage: str | None = None, seqs: Sequence[int] | None = None,
              note: str | None = None, actor: str = "operator") -> int:
        """Redrive failed items (all, one stage's, or some seqs); returns how many moved."""
        self._run(run_id)
        return operations.retry(self.store, run_id, stage=stage, seqs=seqs, actor=actor,
                                note=note)

    def resolve(self, run_id: int, stage: str, seq: int, as_state: str, *,
                note: str | None = None, actor: str = "operator") -> bool:
        run = self._run(run_id)
        job = self.jobs.get(run.job)
        if job is None and as_state == "processed":
            raise UsageError(f"resolving as processed needs job {run.job!r}'s definition (its "
                             "next stage): pass --app module:attribute")
        return operations.resolve(self.store, job, run_id, stage, seq,
                                  as_state, actor=actor, note=note)

    def pause(self, run_id: int, *, note: str | None = None, actor: str = "operator") -> bool:
        self._run(run_id)
        return operations.pause(self.store, run_id, actor=actor, note=note)

    def resume(self, run_id: int, *, note: str | None = None, actor: str = "operator") -> bool:
        self._run(run_id)
        return operations.resume(self.store, run_id, actor=actor, note=note)

    def cancel(self, run_id: int, *, note: str | None = None, actor: str = "operator") -> int:
        self._run(run_id)
        return operations.cancel(self.store, run_id, actor=actor, note=note)

    def history(self, run_id: int, stage: str, seq: int) -> operations.History:
        self._run(run_id)
        return operations.history(self.store, run_id, stage, seq)

    def reconcile(self, run_id: int, *, dry_run: bool = False,
                  actor: str = "operator") -> Reconciled:
        """Derive the run's counters from its items; without ``dry_run`` repair the stored ones."""
        run = self._run(run_id)
        job = self.jobs.get(run.job)
        stages = [s.name for s in job.stages] if job else []
        return reconcile(self.store, run_id, stages, dry_run=dry_run, actor=actor)

    def audit(self, limit: int = 1000) -> list[Finding]:
        """Every stranded run and item, with the path that will move it."""
        return audit(self.store, self.jobs, limit)

    # -- reading ---------------------------------------------------------------------------

    def _run(self, run_id: int) -> RunRow:
        run = self.store.run_get(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id} in {self.where}")
        return run

    def status(self, run_id: int) -> RunStatus:
        return self._status_of(self._run(run_id))

    def runs(self, limit: int = 100) -> list[RunStatus]:
        return [self._status_of(r) for r in self.store.runs_list(limit)]

    def items(
        self, run_id: int, *, stage: str | None = None, state: str | None = None,
        limit: int = 1000, after_id: int = 0,
    ) -> list[ItemRow]:
        self._run(run_id)
        return self.store.items_list(ItemsQuery(run_id, stage, state, limit, after_id))

    def events(self, run_id: int, item_id: int | None = None) -> list[EventRow]:
        return self.store.events_list(run_id, item_id)

    def _status_of(self, run: RunRow) -> RunStatus:
        return status_of(self.store, run, self.jobs.get(run.job))
