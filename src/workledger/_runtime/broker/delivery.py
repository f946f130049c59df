"""What a broker task does with a message (``Ledger.deliver``): claim exactly the items it
names, run them with the worker's own code, write their outcomes fenced, and publish what that
made claimable.

The claim is :meth:`~workledger.storage.port.Store.items_claim_by_identity`: only items still
pending and claimable (the run decomposed, not paused or cancelled, a retry due) move, under a lease
with a fresh token, so a copy of a message, or one delivered after its items were claimed some other
way, claims nothing and runs nothing. What the task claimed it runs as a worker runs a chunk
(``_runtime/worker/chunk.py``: stages, retries, time limits, lease renewals, recorded starts for
stages that are not idempotent, a suspect run alone), through a :class:`TaskHolder` in place of the
worker. After each commit of outcomes, the rows it handed off to the next stage, the items it must
retry (held by the broker until due) and the items it released are published (:class:`FollowUps`),
each marked owed first (``_runtime/broker/dispatch.py``). Of a rate-limited stage, what the bucket
left is held back (``Store.items_hold_back``): published again, held by the broker until the bucket
can serve it, and claimed by no copy of an earlier message.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from workledger._runtime.broker.dispatch import DispatchOptions, Message, Outbox
from workledger._runtime.handlers.async_executor import AsyncExecutor
from workledger._runtime.handlers.executors import ThreadExecutor
from workledger._runtime.worker.chunk import Chunk, LateResults
from workledger._runtime.worker.holder import WorkerOptions, WorkReport
from workledger._runtime.worker.worker import new_worker_id
from workledger.core.states import ItemState
from workledger.errors import UnknownJob
from workledger.jobs import Job
from workledger.storage.delegate import DelegatingStore
from workledger.storage.port import (
    ClaimedItem,
    FinishParams,
    FinishResult,
    HoldBack,
    IdentityClaim,
    LeaseParams,
    Store,
)

log = logging.getLogger("workledger.dispatch")


class TaskHolder:
    """The worker, as a chunk sees it, for one delivered message."""

    def __init__(self, store: Store, options: WorkerOptions, worker_id: str,
                 rng: random.Random, late: LateResults, stop: threading.Event) -> None:
        self.store = store
        self.options = options
        self.report = WorkReport()
        self.worker_id = worker_id
        self.rng = rng
        self.clock: Callable[[], float] = time.monotonic
        self.count_lock = threading.Lock()  # one chunk per holder, but the protocol asks
        self._late = late
        self._stop = stop

    @property
    def late(self) -> LateResults:
        return self._late

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def nudge(self) -> None:
        """Items became claimable: a broker task has no idle lanes to wake; what its outcomes
        made claimable is published instead (:class:`FollowUps`)."""


class FollowUps(DelegatingStore):
    """The store a delivered chunk writes through: after each write that commits outcomes or
    releases items, the items that made claimable are published (hand-offs at once, retries
    held until due). Every other method is the store's own."""

    def __init__(self, store: Store, outbox: Outbox, job: Job,
                 claimed: list[ClaimedItem]) -> None:
        super().__init__(store)
        self._store = store
        self._outbox = outbox
        self._job = job
        self._where = {c.id: (c.stage, c.seq) for c in claimed}
        self.run_id = claimed[0].run_id

    def items_finish_if_leased(self, params: FinishParams) -> FinishResult:
        result = self._store.items_finish_if_leased(params)
        applied = set(result.applied)
        handoffs: dict[str, list[int]] = {}
        retries: dict[str, tuple[list[int], float]] = {}
        for f in params.finishes:
            if f.id not in applied or f.id not in self._where:
                continue
            stage, seq = self._where[f.id]
            if f.next_stage is not None:
                handoffs.setdefault(f.next_stage, []).append(seq)
            elif f.state == ItemState.PENDING:  # a retry: one message, held until the last is due
                seqs, delay = retries.get(stage, ([], 0.0))
                retries[stage] = ([*seqs, seq], max(delay, f.delay or 0.0))
        for stage, seqs in handoffs.items():
            self._outbox.send(self._store, self._job.name, self.run_id, stage, seqs)
        for stage, (seqs, delay) in retries.items():
            self._outbox.send(self._store, self._job.name, self.run_id, stage, seqs, delay)
        return result

    def items_release(self, params: LeaseParams) -> int:
        released = self._store.items_release(params)
        if released:
            by_stage: dict[str, list[int]] = {}
            for item_id in params.ids:
                stage, seq = self._where[item_id]
                by_stage.setdefault(stage, []).append(seq)
            for stage, seqs in by_stage.items():  # only those still pending are published
                self._outbox.send(self._store, self._job.name, self.run_id, stage, seqs)
        return released


class Delivery:
    """Runs the messages a broker delivers to this process. One handler pool, one set of late
    results and one worker id per process: a broker worker that forks its children (Celery's
    prefork pool, RQ's work horse) gets fresh ones in each child."""

    def __init__(self, jobs: Mapping[str, Job], store: Callable[[], Store], outbox: Outbox,
                 options: DispatchOptions) -> None:
        self.jobs = jobs
        self._store = store
        self.outbox = outbox
        self.options = WorkerOptions(concurrency=options.concurrency, chunk=options.chunk,
                                     lease=options.lease, timeout=options.timeout)
        self._lock = threading.Lock()
        self._pid = -1
        self._loop: AsyncExecutor | None = None
        self.stop = threading.Event()  # set by an adapter whose worker is shutting down

    def _here(self) -> tuple[Store, ThreadExecutor, LateResults, str, str | None]:
        """This process's store, threads, late results, worker id and holder. The holder
        (``Store.holder_open``: on SQLite a locked file, on PostgreSQL a session's lock) lives
        as long as the process: a task stopped past its lease keeps its items, as a worker
        does, and those of a task whose process died are taken back at once (SQLite)."""
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._loop = None
                store = self._store()
                opened = store.holder_open()
                self._state = (store, ThreadExecutor(self.options.concurrency, name="wl-task"),
                               LateResults(), new_worker_id(), opened[0] if opened else None)
            return self._state

    def _loop_for(self, job: Job) -> AsyncExecutor | None:
        """This process's event loop, started for the first job with async stages."""
        if "async" not in job.executors(False):
            return None
        with self._lock:
            if self._loop is None:
                self._loop = AsyncExecutor(self.options.concurrency, name="wl-task-async")
            return self._loop

    def _claim(self, store: Store, job: Job, message: Message, worker_id: str,
               holder: str | None) -> list[ClaimedItem]:
        """Claim the items ``message`` names. Of a limited stage, what its bucket or cap left
        is held back (``Store.items_hold_back``), published again held until the bucket can
        serve it; a held message short of its token by a moment waits for it here, once."""
        limit = next((lim for lim in job.claim_plan()[1] if lim.stage == message.stage), None)
        may_wait = message.held is not None
        while True:
            claimed = store.items_claim_by_identity(IdentityClaim(
                job.name, message.run_id, message.stage, message.seqs, self.options.lease,
                worker_id, job.full_history, limit, message.held, holder))
            taken = {c.seq for c in claimed}
            rest = [seq for seq in message.seqs if seq not in taken]
            if limit is None or not rest:
                return claimed
            hold = store.items_hold_back(HoldBack(
                job.name, message.run_id, message.stage, rest, limit, self.outbox.options.wait,
                message.held, may_wait and not claimed and not self.stop.is_set()))
            if hold.wait > 0:
                may_wait = False
                self.stop.wait(hold.wait)
                continue
            self.outbox.publish_held(job.name, message.run_id, message.stage, hold.messages)
            return claimed

    def run(self, body: Any) -> WorkReport:
        """Claim and run the items ``body`` names; what it did (nothing for a copy)."""
        message = Message.from_body(body)
        job = self.jobs.get(message.job)
        if job is None:
            raise UnknownJob(f"a message for job {message.job!r}, which {message.app} does "
                             f"not define (defined: {', '.join(sorted(self.jobs)) or 'none'})")
        store, executor, late, worker_id, holder_id = self._here()
        late.write(TaskHolder(store, self.options, worker_id, random.Random(), late, self.stop))
        claimed = self._claim(store, job, message, worker_id, holder_id)
        if not claimed:
            log.debug("run %s: nothing of %s/%s left to claim (a copy, or claimed already)",
                      message.run_id, message.stage, list(message.seqs)[:5])
            return WorkReport()
        holder = TaskHolder(FollowUps(store, self.outbox, job, claimed),
                            self.options, worker_id, random.Random(), late, self.stop)
        holder.report.claimed = len(claimed)
        Chunk(holder, executor, job, claimed, coroutines=self._loop_for(job)).process()
        if executor.stuck > self.options.concurrency:
            log.error("%d handlers of this process are stuck past their time limit: restart "
                      "the broker worker", executor.stuck)
        return holder.report
