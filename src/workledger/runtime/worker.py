"""The worker: claim a chunk under a lease, run its handlers, renew the leases of what is still
running, and write the outcomes fenced by the claim's token (``runtime/chunk.py``).

A worker is a long-lived process: it waits out a database outage rather than exit (its store is
a :class:`~workledger.runtime.patience.PatientStore`), holds handlers to their time limits, and
runs the periodic sweeper off its claim loop, in a thread of its own, only while it is the one
process of the ledger that leads (``Store.lead``: no write to elect it). Idle, it writes
nothing. It logs its lifecycle through :mod:`logging` (``workledger.worker``): its start, a
summary of what it did every ``log_every`` seconds, outages, abandoned handlers, stale results
and its stop; nothing per item.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict

from workledger.runtime.chunk import Chunk, LateResults
from workledger.runtime.deferred import take_deferred
from workledger.runtime.executors import Executor, ThreadExecutor
from workledger.runtime.holder import WorkerOptions, WorkReport
from workledger.runtime.jobs import Job
from workledger.runtime.patience import MAX_DELAY
from workledger.runtime.processes import ProcessExecutor
from workledger.runtime.sweeper import Sweeper, SweepLoop, SweepReport
from workledger.storage.port import ClaimedItem, ClaimParams, Store

log = logging.getLogger("workledger.worker")

STOP_CHECK = 0.25  # seconds between looks at the stop flag while idle


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(
        self,
        store: Store,
        jobs: Mapping[str, Job],
        options: WorkerOptions | None = None,
        *,
        worker_id: str | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_progress: Callable[[WorkReport], None] | None = None,
        sweeper: Sweeper | None = None,
    ) -> None:
        self.store = store
        self.sweeper = sweeper
        self.jobs = dict(jobs)
        self.options = options or WorkerOptions()
        self.worker_id = worker_id or new_worker_id()
        self.where = ""  # the ledger it works on, for its log lines (a masked URL)
        self.rng = rng or random.Random()
        self.clock = clock
        self.on_progress = on_progress
        self.report = WorkReport()
        self._stop = threading.Event()
        self._cursor: dict[int, int] = {}
        self._runs: list[tuple[int, str]] = []
        self._runs_at = -1e9
        self._turn = 0
        self._count_lock = threading.Lock()
        self._logged_at = clock()
        self._logged: dict[str, int] = {}
        self.late = LateResults()  # results of handlers abandoned past their time limit
        self.processes: ProcessExecutor | None = None  # with options.processes > 1

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop: running handlers finish, unstarted items are released."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> WorkReport:
        opts = self.options
        self.processes = (ProcessExecutor(opts.processes, opts.app)
                          if opts.processes > 1 and opts.app else None)
        executor = ThreadExecutor(opts.concurrency)
        sweeps = self._sweep_loop()
        log.info("worker %s: started%s: jobs %s; concurrency %d, chunk %d, lease %gs%s",
                 self.worker_id, f" on {self.where}" if self.where else "",
                 ", ".join(sorted(self.jobs)), self.options.concurrency,
                 self.options.chunk, self.options.lease,
                 f", timeout {self.options.timeout:g}s" if self.options.timeout else "")
        if self.processes is not None:
            log.info("worker %s: %d handler processes importing %s", self.worker_id,
                     opts.processes, opts.app)
        try:
            if sweeps is not None:
                sweeps.start()
            self._loop(executor, sweeps)
        finally:
            if sweeps is not None:
                sweeps.stop()
            executor.shutdown()
            if self.processes is not None:
                self.processes.shutdown()
        log.info("worker %s: stopped: %s", self.worker_id, _summary(self.report))
        return self.report

    def _loop(self, executor: Executor, sweeps: SweepLoop | None) -> None:
        while not self._stop.is_set():
            self.late.write(self)
            if executor.stuck > self.options.concurrency:
                self.report.stuck = True
                log.error("worker %s: %d handlers are stuck past their time limit, more than "
                          "its %d threads: it stops claiming and exits so that a supervisor "
                          "restarts it", self.worker_id, executor.stuck,
                          self.options.concurrency)
                return
            self._log_progress()
            chunk = self._claim_next()
            if chunk:
                self._process(chunk, executor)
                continue
            if self.options.until_idle and self._idle_for_good(sweeps):
                return
            self._idle_wait()

    def _idle_wait(self) -> None:
        """Wait until work may be there: woken by the store (new or redriven work), by the
        earliest retry coming due, or after the poll interval; a stop ends it at once."""
        opts = self.options
        poll = opts.idle_poll if self.store.wakes_other_processes else opts.poll
        due = self._next_due()
        deadline = self.clock() + (poll if due is None else max(0.0, min(poll, due)))
        while not self._stop.is_set():
            left = deadline - self.clock()
            if left <= 0:
                return
            if self.store.wait_for_work(min(left, STOP_CHECK)):
                self._runs_at = -1e9  # a new run, perhaps: look for it now
                return

    def _next_due(self) -> float | None:
        """Seconds until the earliest backed-off retry of the active runs comes due."""
        if not self._runs:
            return None
        return self.store.outlook([r for r, _ in self._runs]).next_ready_in

    def _sweep_loop(self) -> SweepLoop | None:
        if self.sweeper is None:
            return None
        every = self.options.reclaim_every or min(self.options.lease / 2, 10.0)
        patience = getattr(self.store, "patience", None)
        lease = self.options.lease
        # after an outage, a lease's length for this worker to write the outcomes it holds
        # before its own sweeper may take back the leases that expired meanwhile
        # (plus the longest backoff: the claim loop's next try may be that far off)
        window = lease + MAX_DELAY
        quiet = ((lambda: patience.recovering(window)) if patience is not None
                 else (lambda: False))
        return SweepLoop(self.sweeper, self.store, every, self._swept, quiet)

    def _swept(self, report: SweepReport) -> None:
        with self._count_lock:
            self.report.reclaimed += report.to_pending + report.to_unknown

    def _log_progress(self) -> None:
        if self.clock() - self._logged_at < self.options.log_every:
            return
        self._logged_at = self.clock()
        now = {k: v for k, v in asdict(self.report).items()
               if isinstance(v, int) and not isinstance(v, bool)}
        changed = {k: v - self._logged.get(k, 0) for k, v in now.items()
                   if v != self._logged.get(k, 0)}
        if changed:
            log.info("worker %s: in the last %gs: %s", self.worker_id, self.options.log_every,
                     ", ".join(f"{k} {v}" for k, v in changed.items()))
        self._logged = now

    # -- claiming --------------------------------------------------------------------------

    def _active_runs(self, refresh: bool = False) -> list[tuple[int, str]]:
        if refresh or self.clock() - self._runs_at > 1.0:
            # runs recorded in a caller's transaction wait for a decomposer: this worker, at
            # once, if it is the first to see one (the others then claim its items)
            take_deferred(self.store, self.jobs, self.worker_id)
            self._runs = self.store.runs_claimable(sorted(self.jobs))
            self._runs_at = self.clock()
        return self._runs

    def _claim_next(self) -> list[ClaimedItem]:
        """Claim from the active runs in turn, so a small run is not stuck behind a big one."""
        runs = self._active_runs()
        for i in range(len(runs)):
            run_id, job = runs[(self._turn + i) % len(runs)]
            chunk = self._claim_from(run_id, self.jobs[job])
            if chunk:
                self._turn = (self._turn + i + 1) % len(runs)
                return chunk
        self._runs_at = -1e9  # nothing anywhere: look for new runs next time
        return []

    def _claim_from(self, run_id: int, job: Job) -> list[ClaimedItem]:
        params = ClaimParams(run_id=run_id, limit=self.options.chunk,
                             lease_seconds=self.options.lease, actor=self.worker_id,
                             record_event=job.full_history, after_id=self._cursor.get(run_id, 0))
        chunk = self.store.items_claim(params)
        if not chunk and params.after_id:
            # one sweep from the start picks up retries and reclaimed rows behind the cursor
            chunk = self.store.items_claim(
                ClaimParams(run_id, params.limit, params.lease_seconds, 0, params.actor,
                            params.record_event))
        self._cursor[run_id] = chunk[-1].id if chunk else 0
        self.report.claimed += len(chunk)
        return chunk

    def _idle_for_good(self, sweeps: SweepLoop | None) -> bool:
        """Nothing is claimable now and nothing will become so without a person."""
        if sweeps is not None:
            sweeps.sweep_once()  # closing hooks and expired leases before deciding
        runs = self._active_runs(refresh=True)
        if not runs:
            return True
        outlook = self.store.outlook([r for r, _ in runs])
        if outlook.ready or outlook.waiting or outlook.leased:
            return False
        # a lease that ran out after this sweep is the next sweep's to settle
        return not (outlook.expired and self.sweeper is not None)

    # -- processing ------------------------------------------------------------------------

    def _process(self, chunk: list[ClaimedItem], executor: Executor) -> None:
        Chunk(self, executor, self._job_of(chunk[0].run_id), chunk, self.processes).process()
        self.report.chunks += 1
        if self.on_progress:
            self.on_progress(self.report)

    def _job_of(self, run_id: int) -> Job:
        for rid, name in self._runs:
            if rid == run_id:
                return self.jobs[name]
        raise LookupError(f"run {run_id} is not one of this worker's runs")


def _summary(report: WorkReport) -> str:
    return (f"claimed {report.claimed}, processed {report.processed}, failed {report.failed}, "
            f"skipped {report.skipped}, retried {report.retried}, stale {report.stale}, "
            f"abandoned {report.abandoned}")
