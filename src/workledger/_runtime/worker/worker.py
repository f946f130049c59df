"""The worker: claim a chunk under a lease, run its handlers, renew the leases of what is still
running, and write the outcomes fenced by the claim's token (``_runtime/worker/chunk.py``).

A worker is a long-lived process: it waits out a database outage rather than exit (its store is
a :class:`~workledger._runtime.patience.PatientStore`), holds handlers to their time limits, and
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, replace
from typing import NamedTuple

from workledger._runtime.deferred import take_deferred
from workledger._runtime.handlers.async_executor import AsyncExecutor
from workledger._runtime.handlers.executors import Executor, ThreadExecutor
from workledger._runtime.handlers.processes import ProcessExecutor
from workledger._runtime.patience import MAX_DELAY
from workledger._runtime.repair.sweeper import Sweeper, SweepLoop, SweepReport
from workledger._runtime.worker.chunk import Chunk, LateResults
from workledger._runtime.worker.holder import WorkerOptions, WorkReport
from workledger._runtime.worker.lanes import Lane, Nudge
from workledger.core.limits import CHUNK_MAX
from workledger.jobs import Job
from workledger.storage.port import ClaimableRun, ClaimedItem, ClaimParams, Store

log = logging.getLogger("workledger.worker")

STOP_CHECK = 0.25  # seconds between looks at the stop flag while idle
NUDGE_CHECK = 0.02  # the same while another lane or a chunk of its own may nudge it
LIMITED_POLL = 0.1  # seconds between claims while a capped stage is full (no rate to go by)
MIN_POLL = 0.005  # seconds: the shortest wait between claims of a rate-limited stage
# seconds more handlers than threads must stay stuck before the worker gives up: a worker
# SIGSTOPped (or its machine asleep) mid-handler finds every handler past its time limit when
# it resumes, and they end a moment later
STUCK_GRACE = 5.0


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
        self._stuck_since: float | None = None  # since when more handlers than threads are stuck
        self.on_progress = on_progress
        self.report = WorkReport()
        self._stop = threading.Event()
        self._runs: list[ClaimableRun] = []
        self._order = _Order.of([])  # the same list, grouped for the claim order
        self._runs_at = -1e9
        self.count_lock = threading.Lock()  # the report, moved by every lane's chunks
        self._nudge = Nudge()
        self._lanes_done = threading.Event()
        self.lanes: list[Lane] = []
        self.threads = ThreadExecutor(0)  # made with its size when the worker runs
        self._logged_at = clock()
        self._logged: dict[str, int] = {}
        self.late = LateResults()  # results of handlers abandoned past their time limit
        self.processes: ProcessExecutor | None = None  # with options.processes > 1
        self.coroutines: AsyncExecutor | None = None  # for jobs with async stages
        self.holder: str | None = None  # this worker's holder of leases (Store.holder_open)

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop: running handlers finish, unstarted items are released."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> WorkReport:
        opts = self.options
        # on SQLite: a locked file that tells other processes this worker is alive, whatever
        # the clocks say (storage/holders.py); its handler processes hold it too
        holding = self.store.holder_open()
        self.holder = holding[0] if holding else None
        if self.sweeper is not None:
            self.sweeper.holder = self.holder
        self.processes = (ProcessExecutor(opts.processes, opts.app,
                                          holder_file=holding[1] if holding else None)
                          if opts.processes > 1 and opts.app else None)
        where = frozenset().union(*(j.executors(opts.processes > 1) for j in self.jobs.values()))
        # threads only where a stage runs in them (one idle thread otherwise), and the event
        # loop only for async stages: --concurrency 200 for async handlers starts no 200 threads
        self.threads = ThreadExecutor(opts.concurrency if "thread" in where else 1)
        self.coroutines = AsyncExecutor(opts.concurrency) if "async" in where else None
        lanes = self.lanes = self._lanes()
        sweeps = self._sweep_loop()
        log.info("worker %s: started%s: jobs %s; concurrency %d, chunk %d, lease %gs%s",
                 self.worker_id, f" on {self.where}" if self.where else "",
                 ", ".join(sorted(self.jobs)), self.options.concurrency,
                 self.options.chunk, self.options.lease,
                 f", timeout {self.options.timeout:g}s" if self.options.timeout else "")
        if self.processes is not None:
            log.info("worker %s: %d handler processes importing %s", self.worker_id,
                     opts.processes, opts.app)
        others = [threading.Thread(target=self._lane_loop, args=(lane,), daemon=True,
                                   name=f"wl-lane-{lane.name}") for lane in lanes[1:]]
        try:
            if sweeps is not None:
                sweeps.start()
            for thread in others:
                thread.start()
            self._loop(lanes[0], sweeps)
        finally:
            self._lanes_done.set()
            self.nudge()
            for thread in others:
                thread.join(120)
            for lane in lanes:
                lane.join()
            if self.late.busy and not self.report.stuck:
                log.info("worker %s: waiting for %d handler(s) abandoned past their time limit "
                         "to end: their items stay held until then (a second signal exits at "
                         "once)", self.worker_id, len(self.late.pending))
                self.late.drain(self)
            if sweeps is not None:
                sweeps.stop()
            self.threads.shutdown()
            if self.coroutines is not None:
                self.coroutines.shutdown()
            if self.processes is not None:
                self.processes.shutdown()
            if (self.holder is not None and not self.late.busy
                    and not (self.processes is not None and self.processes.running)):
                # nothing held any more: its leases may be taken back at once. (A handler
                # abandoned past its limit that is still running keeps the holder alive with
                # its process: its item is settled when it ends.)
                self.store.holder_close(self.holder)
        for lane in lanes:
            lane.raise_failure()
        log.info("worker %s: stopped: %s", self.worker_id, _summary(self.report))
        return self.report

    def _lanes(self) -> list[Lane]:
        """One lane per kind of executor the stages run in (_runtime/worker/lanes.py); the handler
        processes' lane keeps two chunks in flight."""
        places: dict[str, Executor | None] = {
            "process": self.processes, "async": self.coroutines, "thread": self.threads}
        kinds: dict[str, set[tuple[str, str]]] = {}
        for job in self.jobs.values():
            for stage in job.stages:
                kind = stage.executor or ("process" if self.processes else "thread")
                kinds.setdefault(kind, set()).add((job.name, stage.name))
        lanes = []
        for kind in (k for k in ("process", "async", "thread") if k in kinds):
            executor = places[kind] or self.threads
            lanes.append(Lane(kind, executor, frozenset(kinds[kind]) if len(kinds) > 1 else None,
                              depth=2 if kind == "process" else 1))
        return lanes or [Lane("thread", self.threads)]

    def nudge(self) -> None:
        """Work may be claimable (a chunk handed items on, a chunk ended): idle lanes look."""
        self._nudge()

    def _stuck(self) -> bool:
        stuck = max(self.threads.stuck, self.coroutines.stuck if self.coroutines else 0)
        if stuck <= self.options.concurrency:
            self._stuck_since = None
            return False
        now = self.clock()
        if self._stuck_since is None:
            self._stuck_since = now
        if now - self._stuck_since < STUCK_GRACE:
            return False
        self.report.stuck = True
        log.error("worker %s: %d handlers are stuck past their time limit, more than its "
                  "concurrency of %d: it stops claiming and exits so that a supervisor "
                  "restarts it", self.worker_id, stuck, self.options.concurrency)
        return True

    def _loop(self, lane: Lane, sweeps: SweepLoop | None) -> None:
        """The first lane's loop, in the worker's own thread: it also writes late results,
        logs, and decides when the worker is idle for good."""
        while not self._stop.is_set():
            self.late.write(self)
            for each in self.lanes:
                each.raise_failure()
            if self._stuck():
                return
            self._log_progress()
            if self._step(lane):
                continue
            if self.options.until_idle and not self._busy() and self._idle_for_good(sweeps):
                return
            self._idle_wait(lane, first=True)

    def _lane_loop(self, lane: Lane) -> None:
        """Another lane's loop, in a thread of its own, until the first lane's loop ends."""
        try:
            while not (self._stop.is_set() or self._lanes_done.is_set()):
                if not self._step(lane):
                    self._idle_wait(lane, first=False)
        except BaseException as exc:  # raised by the first lane's loop
            lane.failure = exc
            self.nudge()

    def _step(self, lane: Lane) -> bool:
        """Claim and start a chunk if the lane has room (True), or wait a moment for room."""
        if not lane.room:
            seen = self._nudge.generation
            lane.raise_failure()
            if lane.busy:
                self._nudge.wait(seen, STOP_CHECK)
            return True
        chunk = self._claim_next(lane)
        if not chunk:
            return False
        lane.run(lambda: self._process(chunk), self.nudge)
        return True

    def _busy(self) -> bool:
        return any(lane.busy for lane in self.lanes)

    def _idle_wait(self, lane: Lane, first: bool) -> None:
        """Wait until work may be there: woken by the store (new or redriven work; the first
        lane listens, and nudges the others), by a nudge from this worker's own chunks, by the
        earliest retry coming due, or after the poll interval; a stop ends it at once."""
        opts = self.options
        poll = opts.idle_poll if self.store.wakes_other_processes else opts.poll
        poll = min(poll, self._limited_poll())
        due = self._next_due()
        deadline = self.clock() + (poll if due is None else max(0.0, min(poll, due)))
        step = STOP_CHECK if len(self.lanes) == 1 and not lane.busy else NUDGE_CHECK
        while not (self._stop.is_set() or self._lanes_done.is_set()):
            left = deadline - self.clock()
            if left <= 0 or self._nudge.generation != lane.seen:
                lane.seen = self._nudge.generation
                return
            if not first:
                self._nudge.wait(lane.seen, min(left, STOP_CHECK))
            elif self.store.wait_for_work(min(left, step)):
                self._runs_at = -1e9  # a new run, perhaps: look for it now
                self.nudge()  # and the other lanes with it
                lane.seen = self._nudge.generation
                return

    def _limited_poll(self) -> float:
        """How soon to look again when a limited stage may be what held the claim back: about
        when its bucket holds a token again (nothing wakes a worker for that), or soon after
        an item of a capped stage may have finished elsewhere."""
        soonest = float("inf")
        for name in {r.job for r in self._runs}:
            for stage in self.jobs[name].stages:
                if stage.rate is not None:
                    soonest = min(soonest, 1.0 / stage.rate.per_second)
                elif stage.max_in_flight is not None:
                    soonest = min(soonest, LIMITED_POLL)
        return max(MIN_POLL, soonest)

    def _next_due(self) -> float | None:
        """Seconds until the earliest backed-off retry of the active runs comes due."""
        if not self._runs:
            return None
        return self.store.outlook([r.id for r in self._runs]).next_ready_in

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
        with self.count_lock:
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

    def _active_runs(self, refresh: bool = False) -> list[ClaimableRun]:
        known = self._runs  # once: another lane's thread may replace the list meanwhile
        if not refresh and known and self.clock() - self._runs_at <= 1.0:
            # a higher run than this list's first (another process's submission, an operator's
            # set_priority), or a first run lowered: look again now, not at the next second
            refresh = self.store.runs_top_priority(sorted(self.jobs)) != known[0].priority
        if refresh or self.clock() - self._runs_at > 1.0:
            # runs recorded in a caller's transaction wait for a decomposer: this worker, at
            # once, if it is the first to see one (the others then claim its items)
            take_deferred(self.store, self.jobs, self.worker_id)
            runs = self.store.runs_claimable(sorted(self.jobs))
            self._order = _Order.of(runs)  # before the list: a lane reads the list, then this
            self._runs = runs
            self._runs_at = self.clock()
        return self._runs

    def _claim_next(self, lane: Lane) -> list[ClaimedItem]:
        """Claim in the claim order (docs/design.md, "Claim order"): the runs of the highest
        priority first; among runs of one priority, across the tenants with claimable work by
        their weights (core/shares.py), and across a tenant's runs in turn, so a small run is
        not stuck behind a big one; a lower priority only when no higher run has anything
        claimable. A claim is one tenant's."""
        self._active_runs()
        for tenants, weights in self._order.groups:
            idle: set[tuple[int, str | None]] = set()
            for key in lane.shares.order(weights):
                chunk = self._claim_turn(tenants[key], key, lane)
                if chunk:
                    lane.shares.charge(key, weights, idle)
                    return chunk
                idle.add(key)
            lane.shares.forget(idle)
        self._runs_at = -1e9  # nothing anywhere: look for new runs next time
        return []

    def _claim_turn(self, runs: list[ClaimableRun], key: tuple[int, str | None],
                    lane: Lane) -> list[ClaimedItem]:
        """A claim from one tenant's runs of one priority, from the run whose turn it is."""
        turn = lane.turns.get(key, 0)
        i = 0
        while i < len(runs):
            k = (turn + i) % len(runs)
            job = self.jobs[runs[k].job]
            window = self._window(runs, k, job, lane)
            if len(window) > 1:
                chunk = self._claim_across(window, job)
            else:
                chunk = self._claim_from(runs[k].id, job, lane)
            if chunk:  # the next claim starts after the last run this one took from
                last = max(c.run_id for c in chunk)
                lane.turns[key] = k + window.index(last) + 1
                return chunk
            i += len(window)  # nothing claimable in any run of the window
        return []

    def _window(self, group: list[ClaimableRun], k: int, job: Job, lane: Lane) -> list[int]:
        """The runs one claim may take items of, from the run whose turn it is: it and the
        runs after it in the rotation of one priority (in id order: no wrap), of the same job,
        at most a chunk's worth. One run when the job's claim goes stage by stage (limits, or
        a lane of some stages only): those claims are one run's."""
        stages, _ = job.claim_plan()
        if stages or lane.stages is not None:
            return [group[k].id]
        size = self._claim_size(job)
        window = []
        for run in group[k:k + size]:
            if run.job != job.name:
                break
            window.append(run.id)
        return window

    def _claim_across(self, run_ids: list[int], job: Job) -> list[ClaimedItem]:
        """One claim over several runs' items (ClaimParams.run_ids): many small runs drain
        like one big one."""
        chunk = self.store.items_claim(ClaimParams(
            run_id=run_ids[0], run_ids=tuple(run_ids), limit=self._claim_size(job),
            lease_seconds=self.options.lease, actor=self.worker_id,
            record_event=job.full_history, holder=self.holder))
        self._counted("claimed", len(chunk))
        return chunk

    def _claim_from(self, run_id: int, job: Job, lane: Lane) -> list[ClaimedItem]:
        stages, limits = job.claim_plan()
        if lane.stages is not None:  # this lane's stages only, one statement each
            stages = tuple(s for s in stages or tuple(st.name for st in reversed(job.stages))
                           if lane.claims(job.name, s))
            limits = tuple(limit for limit in limits if limit.stage in stages)
            if not stages:
                return []
        if stages:  # a job with limited stages: stage by stage, each bucket and cap honoured
            chunk = self.store.items_claim(ClaimParams(
                run_id=run_id, limit=self._claim_size(job), lease_seconds=self.options.lease,
                actor=self.worker_id, record_event=job.full_history, job=job.name,
                stages=stages, limits=limits, holder=self.holder))
            self._counted("claimed", len(chunk))
            return chunk
        params = ClaimParams(run_id=run_id, limit=self._claim_size(job),
                             lease_seconds=self.options.lease, actor=self.worker_id,
                             record_event=job.full_history, after_id=lane.cursor.get(run_id, 0),
                             holder=self.holder)
        chunk = self.store.items_claim(params)
        if not chunk and params.after_id:
            # one sweep from the start picks up retries and reclaimed rows behind the cursor
            chunk = self.store.items_claim(replace(params, after_id=0))
        lane.cursor[run_id] = chunk[-1].id if chunk else 0
        self._counted("claimed", len(chunk))
        return chunk

    def _counted(self, what: str, n: int) -> None:
        with self.count_lock:
            setattr(self.report, what, getattr(self.report, what) + n)

    def _claim_size(self, job: Job) -> int:
        """``--chunk``; for a job with async stages at least ``--concurrency``: a claim smaller
        than the tasks that may run at once would leave the loop short of work."""
        opts = self.options
        if opts.concurrency > opts.chunk and "async" in job.executors(opts.processes > 1):
            return min(opts.concurrency, CHUNK_MAX)
        return opts.chunk

    def _idle_for_good(self, sweeps: SweepLoop | None) -> bool:
        """Nothing is claimable now and nothing will become so without a person."""
        if sweeps is not None:
            sweeps.sweep_once()  # closing hooks and expired leases before deciding
        runs = self._active_runs(refresh=True)
        if not runs:
            return True
        outlook = self.store.outlook([r.id for r in runs])
        if outlook.ready or outlook.waiting or outlook.leased:
            return False
        # a lease that ran out after this sweep is the next sweep's to settle
        return not (outlook.expired and self.sweeper is not None)

    # -- processing ------------------------------------------------------------------------

    def _process(self, chunk: list[ClaimedItem]) -> None:
        Chunk(self, self.threads, self._job_of(chunk[0].run_id), chunk, self.processes,
              self.coroutines).process()
        self._counted("chunks", 1)
        if self.on_progress:
            self.on_progress(self.report)

    def _job_of(self, run_id: int) -> Job:
        name = self._order.job_of.get(run_id)
        if name is None:
            raise LookupError(f"run {run_id} is not one of this worker's runs")
        return self.jobs[name]


TenantKey = tuple[int, str | None]  # (priority, tenant)


class _Order(NamedTuple):
    """The claimable runs as the claim order walks them, made once per read of the list (not
    per claim: 10,000 open runs cost a grouping a second, not one per chunk): per priority,
    highest first, the runs of each tenant and each tenant's weight; and each run's job."""

    groups: list[tuple[dict[TenantKey, list[ClaimableRun]], dict[TenantKey, int]]]
    job_of: dict[int, str]

    @classmethod
    def of(cls, runs: list[ClaimableRun]) -> _Order:
        groups = []
        for group in _by_priority(runs):
            tenants = _by_tenant(group)
            groups.append((tenants, {key: rs[0].weight for key, rs in tenants.items()}))
        return cls(groups, {r.id: r.job for r in runs})


def _summary(report: WorkReport) -> str:
    return (f"claimed {report.claimed}, processed {report.processed}, failed {report.failed}, "
            f"skipped {report.skipped}, retried {report.retried}, stale {report.stale}, "
            f"abandoned {report.abandoned}")


def _by_tenant(group: list[ClaimableRun]) -> dict[tuple[int, str | None], list[ClaimableRun]]:
    """One priority's runs by tenant (keyed by priority and tenant), tenants in the order of
    their oldest run, each tenant's runs in id order."""
    out: dict[tuple[int, str | None], list[ClaimableRun]] = {}
    for run in group:
        out.setdefault((run.priority, run.tenant), []).append(run)
    return out


def _by_priority(runs: list[ClaimableRun]) -> Iterator[list[ClaimableRun]]:
    """The runs (listed highest priority first) in groups of one priority each."""
    start = 0
    while start < len(runs):
        end = start + 1
        while end < len(runs) and runs[end].priority == runs[start].priority:
            end += 1
        yield runs[start:end]
        start = end
