"""The worker: claim a chunk under a lease, run its handlers in a thread pool, renew the
leases of what is still running, and write all outcomes of a chunk with one fenced statement.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from operator import itemgetter

from workledger.core.outcomes import Failed, Outcome
from workledger.core.states import LEASE_EXPIRED
from workledger.runtime.execute import run_handler, to_finish
from workledger.runtime.jobs import Job
from workledger.runtime.sweeper import Sweeper
from workledger.storage.port import (
    ClaimedItem,
    ClaimParams,
    Finish,
    FinishParams,
    FinishResult,
    LeaseParams,
    Store,
)

log = logging.getLogger("workledger.worker")

SLICE_MAX = 32  # items per thread-pool task at most
Ran = tuple[ClaimedItem, Outcome | None]  # None: not started (the worker was stopping)


@dataclass(frozen=True)
class WorkerOptions:
    concurrency: int = 4
    chunk: int = 100
    lease: float = 30.0  # seconds
    until_idle: bool = False
    poll: float = 0.5  # seconds between claims when nothing was claimable
    flush_every: float = 1.0  # write finished outcomes at least this often within a chunk
    reclaim_every: float | None = None  # default: lease / 2

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.chunk < 1:
            raise ValueError("concurrency and chunk must be at least 1")
        if self.lease <= 0:
            raise ValueError("lease must be positive")


@dataclass
class WorkReport:
    claimed: int = 0
    processed: int = 0
    failed: int = 0
    skipped: int = 0
    retried: int = 0
    stale: int = 0
    released: int = 0
    reclaimed: int = 0
    chunks: int = 0
    by_state: dict[str, int] = field(default_factory=dict)


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
        self.rng = rng or random.Random()
        self.clock = clock
        self.on_progress = on_progress
        self.report = WorkReport()
        self._stop = threading.Event()
        self._cursor: dict[int, int] = {}
        self._runs: list[tuple[int, str]] = []
        self._runs_at = -1e9
        self._turn = 0
        self._reclaimed_at = -1e9

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop: running handlers finish, unstarted items are released."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> WorkReport:
        with ThreadPoolExecutor(self.options.concurrency, thread_name_prefix="wl-handler") as pool:
            while not self._stop.is_set():
                self._maybe_sweep()
                chunk = self._claim_next()
                if chunk:
                    self._process(chunk, pool)
                    continue
                if self.options.until_idle and self._idle_for_good():
                    break
                self._stop.wait(self.options.poll)
        return self.report

    # -- claiming --------------------------------------------------------------------------

    def _active_runs(self, refresh: bool = False) -> list[tuple[int, str]]:
        if refresh or self.clock() - self._runs_at > 1.0:
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

    def _idle_for_good(self) -> bool:
        """Nothing is claimable now and nothing will become so without a person."""
        self._maybe_sweep(now=True)  # closing hooks and expired leases before deciding
        runs = self._active_runs(refresh=True)
        if not runs:
            return True
        outlook = self.store.outlook([r for r, _ in runs])
        if outlook.ready or outlook.waiting or outlook.leased:
            return False
        # a lease that ran out after this sweep is the next sweep's to settle
        return not (outlook.expired and self.sweeper is not None)

    # -- lease expiry and the rest of the sweeper's work ------------------------------------

    def _maybe_sweep(self, now: bool = False) -> None:
        if self.sweeper is None:
            return
        every = self.options.reclaim_every or min(self.options.lease / 2, 10.0)
        if not now and self.clock() - self._reclaimed_at < every:
            return
        self._reclaimed_at = self.clock()
        swept = self.sweeper.sweep()
        self.report.reclaimed += swept.to_pending + swept.to_unknown

    # -- processing ------------------------------------------------------------------------

    def _process(self, chunk: list[ClaimedItem], pool: ThreadPoolExecutor) -> None:
        job = self._job_of(chunk[0].run_id)
        suspects = [c for c in chunk if c.error and c.error.startswith(LEASE_EXPIRED)]
        normal = [c for c in chunk if not (c.error and c.error.startswith(LEASE_EXPIRED))]
        batch = _Batch(self, chunk[0].run_id, chunk[0].lease_token)
        for item in suspects:
            if self._stop.is_set():
                batch.release([item.id])
                continue
            self._run_isolated(job, item, batch, pool)
        recorded = job.recorded_stages()
        self._run_pooled(job, [i for i in normal if i.stage not in recorded], batch, pool)
        self._run_recorded(job, [i for i in normal if i.stage in recorded], batch, pool)
        batch.flush()
        self.report.chunks += 1
        if self.on_progress:
            self.on_progress(self.report)

    def _job_of(self, run_id: int) -> Job:
        for rid, name in self._runs:
            if rid == run_id:
                return self.jobs[name]
        raise LookupError(f"run {run_id} is not one of this worker's runs")

    def _run_isolated(
        self, job: Job, item: ClaimedItem, batch: _Batch, pool: ThreadPoolExecutor
    ) -> None:
        """An item whose previous holder vanished may be poison: charge its attempt before it
        starts, and run it alone, so a crash charges it and none of its siblings."""
        batch.flush()  # a poison item must not take its siblings' finished results down with it
        policy = job.stage_named(item.stage).policy
        if item.attempts >= policy.max_attempts:
            reason = f"gave up after {item.attempts} attempts: its worker was lost while running it"
            batch.add(to_finish(job, item, Failed(reason), item.attempts, 0.0, charge=0))
            return
        params = LeaseParams(item.run_id, [item.id], item.lease_token)
        if not self.store.items_mark_started(params):
            return  # lost the lease already; the new holder owns it
        future = pool.submit(self._run_slice, job, [item])
        batch.wait({future: [item]}, lambda f, _: self._collect(job, f.result(), batch, 0))

    def _run_pooled(
        self, job: Job, items: list[ClaimedItem], batch: _Batch, pool: ThreadPoolExecutor
    ) -> None:
        # Handlers run in small slices, not one task per item: a thread-pool task costs more
        # than a no-op handler, and a slice still leaves the other threads busy.
        size = max(1, min(SLICE_MAX, len(items) // (self.options.concurrency * 8)))
        slices = [items[i:i + size] for i in range(0, len(items), size)]
        futures = {pool.submit(self._run_slice, job, s): s for s in slices}
        batch.wait(futures, lambda f, _: self._collect(job, f.result(), batch, 1))

    def _run_recorded(
        self, job: Job, items: list[ClaimedItem], batch: _Batch, pool: ThreadPoolExecutor
    ) -> None:
        """Items of a stage that is not idempotent: each start is recorded before its handler
        runs, and each outcome as soon as it is known. One transaction per round writes the
        outcomes that came in and the starts of as many items as threads are free, so a worker
        killed at any moment leaves in doubt (``unknown``) only the handlers that were running;
        the rest of its chunk goes back to pending."""
        waiting = deque(items)
        running: dict[Future[list[Ran]], list[ClaimedItem]] = {}

        def feed() -> None:
            free = 0 if self._stop.is_set() else self.options.concurrency - len(running)
            take = [waiting.popleft() for _ in range(min(free, len(waiting)))]
            started = set(batch.flush(start=take))
            for item in take:
                if item.id in started:  # else its lease is lost: the new holder owns it
                    running[pool.submit(self._run_slice, job, [item])] = [item]
            if self._stop.is_set() and waiting:
                batch.release([i.id for i in waiting])
                waiting.clear()

        feed()
        batch.wait(running, lambda f, _: self._collect(job, f.result(), batch, 1), after=feed)

    def _run_slice(self, job: Job, items: list[ClaimedItem]) -> list[Ran]:
        """Run items one after another; once the worker is stopping, leave the rest unstarted."""
        ran: list[Ran] = []
        stage = None
        for item in items:
            if self._stop.is_set():
                ran.append((item, None))
                continue
            if stage is None or stage.name != item.stage:  # a slice is mostly one stage
                stage = job.stage_named(item.stage)
            ran.append((item, run_handler(job, stage, item, item.attempts + 1, self.worker_id)))
        return ran

    def _collect(self, job: Job, ran: list[Ran], batch: _Batch, charge: int) -> None:
        unstarted = []
        for item, outcome in ran:
            if outcome is None:
                unstarted.append(item.id)
            else:
                batch.add(to_finish(job, item, outcome, item.attempts + 1,
                                    self.rng.random(), charge))
        batch.release(unstarted)


class _Batch:
    """Outcomes of one chunk waiting to be written, and the leases still held."""

    def __init__(self, worker: Worker, run_id: int, token: int) -> None:
        self.worker = worker
        self.store = worker.store
        self.run_id = run_id
        self.token = token
        self.finishes: list[Finish] = []
        self.last_flush = worker.clock()
        self.last_beat = worker.clock()

    def add(self, finish: Finish) -> None:
        self.finishes.append(finish)

    def wait(
        self,
        left: dict[Future[list[Ran]], list[ClaimedItem]],
        on_done: Callable[[Future[list[Ran]], list[ClaimedItem]], None],
        after: Callable[[], None] | None = None,
    ) -> None:
        """Wait for the futures in ``left`` (emptied as they finish), renewing leases of running
        items and flushing as time passes; ``after`` runs after each wake-up and may add more."""
        opts = self.worker.options
        cancelled = False
        while left:
            beat_in = opts.lease / 3 - (self.worker.clock() - self.last_beat)
            flush_in = opts.flush_every - (self.worker.clock() - self.last_flush)
            timeout = max(0.01, min(beat_in, flush_in if self.finishes else beat_in))
            done, _ = wait(left, timeout=timeout, return_when=FIRST_COMPLETED)
            for f in done:
                on_done(f, left.pop(f))
            if after is not None:
                after()
            if self.worker.stopping and not cancelled:
                cancelled = True
                dropped = [i.id for f, items in list(left.items()) if f.cancel() for i in items]
                for f in [f for f in left if f.cancelled()]:
                    left.pop(f)
                self.release(dropped)
            if left and self.worker.clock() - self.last_beat >= opts.lease / 3:
                self._heartbeat([i.id for items in left.values() for i in items])
            if left and self.finishes and self.worker.clock() - self.last_flush >= opts.flush_every:
                self.flush()

    def _heartbeat(self, ids: list[int]) -> None:
        self.store.items_heartbeat(LeaseParams(self.run_id, ids, self.token,
                                               self.worker.options.lease))
        self.last_beat = self.worker.clock()

    def release(self, ids: list[int]) -> None:
        if ids:
            n = self.store.items_release(LeaseParams(self.run_id, ids, self.token))
            self.worker.report.released += n

    def flush(self, start: list[ClaimedItem] | None = None) -> list[int]:
        """Write the outcomes gathered so far (and record the starts of ``start``, in the same
        transaction); return the ids of ``start`` whose start was recorded."""
        self.last_flush = self.worker.clock()
        if not self.finishes and not start:
            return []
        finishes, self.finishes = self.finishes, []
        result = self.store.items_finish_if_leased(
            FinishParams(self.run_id, finishes, actor=self.worker.worker_id,
                         start=[i.id for i in start or ()], start_token=self.token))
        self._count(finishes, result)
        return result.started

    def _count(self, finishes: list[Finish], result: FinishResult) -> None:
        report = self.worker.report
        report.stale += len(result.stale)
        if len(result.applied) == len(finishes):  # the usual case: count states in C
            states = Counter(map(itemgetter(2), finishes))
        else:
            applied = set(result.applied)
            states = Counter(f.state for f in finishes if f.id in applied)
        for state, n in states.items():
            report.by_state[state] = report.by_state.get(state, 0) + n
            if state == "pending":
                report.retried += n
            elif state in ("processed", "failed", "skipped"):
                setattr(report, state, getattr(report, state) + n)
