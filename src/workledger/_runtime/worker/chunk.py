"""One claimed chunk, from its claim to its last outcome: what the worker does with it.

Handlers run in an :class:`~workledger._runtime.handlers.executors.Executor`; this module waits
for them, renews the leases of those still running, holds each handler to its stage's time
limit, and writes the outcomes fenced by the claim's token:

- items of idempotent stages without a time limit run in small slices, their outcomes written
  once per chunk (at least once a second): a lost outcome costs only a re-run;
- items of a stage that is not idempotent, or that has a time limit, run one per task, in rounds:
  one transaction writes the outcomes that came in and records the starts of as many next items
  as threads are free (for stages that are not idempotent), and only then are they started;
- an item whose previous holder vanished (a suspect) runs alone, its attempt charged first.

A handler still running past its limit is abandoned: the chunk goes on without it, but its item
stays held, its lease renewed, until the handler has really ended (a thread returns, a
coroutine's cancellation completes, a child process is killed): only then is it settled as if
its holder had vanished, by the stage's declaration (:class:`LateResults`). An item whose
handler may still be running is never verified, run again or resolved as pending.

Every item the chunk holds keeps its lease renewed while the chunk waits, whatever it waits
for: its turn in a round, a suspect running alone before it, a flush.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from operator import attrgetter

from workledger._runtime.handlers.async_executor import AsyncExecutor
from workledger._runtime.handlers.execute import run_batch, run_handler, run_unit_async, to_finish
from workledger._runtime.handlers.executors import Executor
from workledger._runtime.handlers.processes import HolderLost, ProcessExecutor, Slice
from workledger._runtime.renewal import Renewal
from workledger._runtime.worker.holder import Holder, WorkReport
from workledger.core.outcomes import Failed, Outcome, RetryLater, Unknown
from workledger.core.states import AWAITING_VERIFY, LEASE_EXPIRED, LOST_TWICE
from workledger.jobs import Job
from workledger.storage.port import (
    ClaimedItem,
    Finish,
    FinishParams,
    FinishResult,
    LeaseParams,
    Store,
)

_WRITE = attrgetter("write")  # a Finish's write, read in C when a chunk's finishes are counted
log = logging.getLogger("workledger.worker")

SLICE_MAX = 32  # items per executor task at most
QUEUED_POLL = 0.05  # seconds between looks at a timed task that has not started yet
# None: not started (the worker was stopping, or the process before it died)
Ran = tuple[ClaimedItem, Outcome | HolderLost | None]
Tasks = dict[Future[list[Ran]], list[ClaimedItem]]


def is_suspect(item: ClaimedItem) -> bool:
    """Its previous holder vanished while it may have been running: it may be poison."""
    return bool(item.error and item.error.startswith(LEASE_EXPIRED))


class Chunk:
    """The outcomes of one claimed chunk waiting to be written, and the leases still held."""

    def __init__(self, worker: Holder, executor: Executor, job: Job,
                 items: list[ClaimedItem], processes: ProcessExecutor | None = None,
                 coroutines: AsyncExecutor | None = None) -> None:
        self.worker = worker
        self.store: Store = worker.store
        self.executor = executor  # threads of this process
        self.processes = processes  # child processes, with `worker --processes N`
        self.coroutines = coroutines  # the event loop, for async handlers
        self.job = job
        self.items = items
        self.run_id = items[0].run_id
        # a chunk claimed across runs (issue 25): each outcome is written in its own run
        self.run_of = runs_of(items)
        self.token = items[0].lease_token
        self.finishes: list[Finish] = []
        self.held = {i.id for i in items}  # leased to this chunk, outcome not written yet
        self.limits = job.timed_stages(worker.options.timeout)
        self.last_flush = worker.clock()
        self.last_beat = worker.clock()
        self.queued: deque[list[ClaimedItem]] = deque()  # units claimed, not yet handed out
        self.batches = {s.name: s.batch for s in job.stages if s.batch}  # batch stages' sizes

    # -- the three ways items run ------------------------------------------------------------

    def process(self) -> None:
        recorded = self.job.recorded_stages()
        normal = [i for i in self.items if not is_suspect(i)]
        suspects = [i for i in self.items if is_suspect(i)]
        # a suspect of an idempotent stage lost once runs side by side with the others, each
        # charged as it starts; one lost again while running, or one of a stage that is not
        # idempotent (only those that had really started are suspects there), runs alone
        alone = [i for i in suspects
                 if i.error == LOST_TWICE or not self.job.stage_named(i.stage).idempotent]
        for item in alone:
            if self.worker.stopping:
                self.release([item.id])
            else:
                self._run_alone(item)
        side_by_side = [i for i in suspects if i not in alone and not self._gave_up(i)]
        if side_by_side:
            self.flush()  # a poison among them must not take finished results down with it
            self._run_singly(side_by_side, recorded, charged=True)
        # a limited stage's outcomes are written as they come, so a cap's slot is freed soon
        singly = recorded | set(self.limits) | self.job.limited_stages()
        self._run_pooled([i for i in normal if i.stage not in singly])
        self._run_singly([i for i in normal if i.stage in singly], recorded)
        self.flush()

    def _run_alone(self, item: ClaimedItem) -> None:
        """A suspect: charge its attempt before it starts, and run it alone, so a crash charges
        it and none of its siblings."""
        self.flush()  # a poison item must not take its siblings' finished results down with it
        if self._gave_up(item):
            return
        if not self.store.items_mark_started(LeaseParams(item.run_id, [item.id], self.token)):
            return  # lost the lease already; the new holder owns it
        tasks: Tasks = {self._submit([item]): [item]}
        self.wait(tasks, lambda f, _: self._collect(f.result(), 0), charge=0)

    def _gave_up(self, item: ClaimedItem) -> bool:
        """A suspect that has used its attempts fails without running again."""
        if item.attempts < self.job.stage_named(item.stage).policy.max_attempts:
            return False
        reason = f"gave up after {item.attempts} attempts: its worker was lost while running it"
        self.add(to_finish(self.job, item, Failed(reason), item.attempts, 0.0, charge=0))
        return True

    def _run_pooled(self, items: list[ClaimedItem]) -> None:
        # Handlers run in small slices, not one task per item: a task costs more than a no-op
        # handler, and a slice still leaves the other threads busy.
        tasks: Tasks = {}
        for executor in (self.executor, self.processes, self.coroutines):
            mine = [i for i in items if executor is not None and self.executor_for(i) is executor]
            if executor is None or not mine:
                continue
            # a coroutine is cheap; a slice sent to a handler process is one message each way,
            # and its lane keeps the next chunk queued, so it needs no small slices at the end
            per_slot = 2 if executor is self.processes else 8
            size = 1 if executor is self.coroutines else max(
                1, min(SLICE_MAX, len(mine) // (executor.size * per_slot)))
            tasks.update({self._submit(unit): unit for unit in self._units(mine, size)})
        self.wait(tasks, lambda f, _: self._collect(f.result(), 1))

    def _units(self, items: list[ClaimedItem], size: int) -> list[list[ClaimedItem]]:
        """The tasks ``items`` make: a batch stage's items in batches of its size (one handler
        call each), the others in slices of ``size``."""
        if not self.batches:  # the usual job: no batch stage
            return [items[i:i + size] for i in range(0, len(items), size)]
        units: list[list[ClaimedItem]] = []
        plain = [i for i in items if not self._batch_of(i)]
        units += [plain[i:i + size] for i in range(0, len(plain), size)]
        for stage in dict.fromkeys(i.stage for i in items if self._batch_of(i)):
            mine = [i for i in items if i.stage == stage]
            n = self._batch_of(mine[0])
            units += [mine[i:i + n] for i in range(0, len(mine), n)]
        return units

    def _batch_of(self, item: ClaimedItem) -> int:
        return self.batches.get(item.stage, 0)

    def _run_singly(self, items: list[ClaimedItem], recorded: frozenset[str],
                    charged: bool = False) -> None:
        """One item per task, in rounds: each round's transaction writes the outcomes that came
        in and records the starts of the next items of recorded stages, so a worker killed at
        any moment leaves in doubt only the handlers that were running. ``charged`` (suspects):
        every start is recorded and charged its attempt, so a crash charges only the items
        that were running, and those lost again run alone the next time."""
        # an item, or a batch of a batch stage; its lease is renewed while it waits its turn
        waiting = self.queued = deque(self._units(items, 1))
        running: Tasks = {}

        def marks(item: ClaimedItem) -> bool:
            return charged or item.stage in recorded

        def feed() -> None:
            take = [] if self.worker.stopping else self._fits(waiting, running)
            marked = set(self.flush(start=[i for u in take for i in u if marks(i)],
                                    charge=int(charged)))
            for unit in take:
                # an item whose start was not recorded has lost its lease: the new holder owns it
                unit = [i for i in unit if not marks(i) or i.id in marked]
                if unit:
                    running[self._submit(unit)] = unit
            if self.worker.stopping and waiting:
                self.release([i.id for u in waiting for i in u])
                waiting.clear()

        feed()
        self.wait(running, lambda f, _: self._collect(f.result(), int(not charged)), after=feed,
                  charge=int(not charged))

    def executor_for(self, item: ClaimedItem) -> Executor:
        """The event loop for an async stage; the child processes, if the worker has them and
        the stage does not ask for threads; else this process's threads."""
        where = self.job.stage_named(item.stage).executor
        if where == "async":
            if self.coroutines is None:  # the worker starts its loop for a job that has them
                raise RuntimeError(f"stage {item.stage!r} is async and this chunk has no loop")
            return self.coroutines
        if self.processes is None or where == "thread":
            return self.executor
        return self.processes

    def _fits(self, waiting: deque[list[ClaimedItem]], running: Tasks
              ) -> list[list[ClaimedItem]]:
        """Take from ``waiting`` as many units as their executors have free slots."""
        busy = Counter(id(self.executor_for(items[0])) for items in running.values())
        take = []
        for unit in list(waiting):
            executor = self.executor_for(unit[0])
            if busy[id(executor)] < executor.size:
                busy[id(executor)] += 1
                take.append(unit)
                waiting.remove(unit)
        return take

    def _submit(self, items: list[ClaimedItem]) -> Future[list[Ran]]:
        executor = self.executor_for(items[0])
        if isinstance(executor, ProcessExecutor):
            return executor.submit_slice(Slice(self.job.name, items, self.worker.worker_id,
                                               bool(self._batch_of(items[0]))))
        if self.coroutines is not None and executor is self.coroutines:
            return self.coroutines.submit(lambda: run_unit_async(
                self.job, items, self.worker.worker_id, lambda: self.worker.stopping))
        return executor.submit(lambda: self._run_slice(items))

    def _run_slice(self, items: list[ClaimedItem]) -> list[Ran]:
        """Run items one after another; once the worker is stopping, leave the rest unstarted."""
        if self.batches.get(items[0].stage):  # one call for the whole batch (one stage)
            first = self.job.stage_named(items[0].stage)
            if self.worker.stopping:
                return [(item, None) for item in items]
            return list(zip(items, run_batch(self.job, first, items, self.worker.worker_id),
                            strict=True))
        ran: list[Ran] = []
        stage = None
        for item in items:
            if self.worker.stopping:
                ran.append((item, None))
                continue
            if stage is None or stage.name != item.stage:  # a slice is mostly one stage
                stage = self.job.stage_named(item.stage)
            ran.append((item, run_handler(self.job, stage, item, item.attempts + 1,
                                          self.worker.worker_id)))
        return ran

    def _collect(self, ran: list[Ran], charge: int) -> None:
        unstarted = []
        for item, outcome in ran:
            if outcome is None:
                unstarted.append(item.id)
            elif isinstance(outcome, HolderLost):  # its process died while running it
                with self.worker.count_lock:
                    self.worker.report.lost_processes += 1
                log.warning("run %s: item %s/%s (key %s): %s", item.run_id, item.stage,
                            item.seq, item.key, outcome.reason)
                self.add(to_finish(self.job, item, self._vanished(item, outcome.reason),
                                   item.attempts + 1, self.worker.rng.random(), charge))
            else:
                self.add(to_finish(self.job, item, outcome, item.attempts + 1,
                                   self.worker.rng.random(), charge))
        self.release(unstarted)

    # -- waiting: leases, flushes, time limits ---------------------------------------------------

    def add(self, finish: Finish) -> None:
        self.finishes.append(finish)

    def wait(self, left: Tasks, on_done: Callable[[Future[list[Ran]], list[ClaimedItem]], None],
             after: Callable[[], None] | None = None, charge: int = 1) -> None:
        """Wait for the tasks in ``left`` (emptied as they finish), renewing leases of running
        items, flushing as time passes and abandoning a handler past its limit; ``after`` runs
        after each wake-up and may add more."""
        opts = self.worker.options
        cancelled = False
        while left:
            now = self.worker.clock()
            due = [opts.lease / 3 - (now - self.last_beat), self._next_deadline(left, now)]
            if self.finishes:
                due.append(opts.flush_every - (now - self.last_flush))
            done, _ = wait(left, timeout=max(0.01, min(due)), return_when=FIRST_COMPLETED)
            for f in done:
                on_done(f, left.pop(f))
            self._abandon_late(left, charge)
            if after is not None:
                after()
            if self.worker.stopping and not cancelled:
                cancelled = True
                dropped = [i.id for f, items in list(left.items()) if f.cancel() for i in items]
                for f in [f for f in left if f.cancelled()]:
                    left.pop(f)
                self.release(dropped)
            if left and self.worker.clock() - self.last_beat >= opts.lease / 3:
                self._heartbeat(sorted(self.held))
            if left and self.finishes and self.worker.clock() - self.last_flush >= opts.flush_every:
                self.flush()

    def _limit(self, items: list[ClaimedItem]) -> float | None:
        """The time limit of a task of one item, or of one batch call."""
        if len(items) == 1 or self._batch_of(items[0]):
            return self.limits.get(items[0].stage)
        return None

    def _next_deadline(self, left: Tasks, now: float) -> float:
        soonest = 3600.0
        for f, items in left.items():
            limit, started = self._limit(items), self.executor_for(items[0]).started_at(f)
            if limit is None:
                continue
            # a timed task still queued has no deadline yet: look again soon, or one that
            # starts just after this wait began would run unwatched until the next lease renewal
            soonest = min(soonest, QUEUED_POLL if started is None else started + limit - now)
        return soonest

    def _abandon_late(self, left: Tasks, charge: int) -> None:
        now = self.worker.clock()
        for f, items in list(left.items()):
            limit, started = self._limit(items), self.executor_for(items[0]).started_at(f)
            if limit is None or started is None or now - started < limit or f.done():
                continue
            self.executor_for(items[0]).abandon(f)
            left.pop(f)
            for item in items:
                self._overrun(item, limit)
            self.held.difference_update(i.id for i in items)  # the late results hold them now
            self.worker.late.add(self.worker, Overrun(f, self.job, items, limit, charge, now))

    def _vanished(self, item: ClaimedItem, reason: str) -> Outcome:
        return vanished(self.job, item, reason)

    def _overrun(self, item: ClaimedItem, limit: float) -> None:
        stage = self.job.stage_named(item.stage)
        with self.worker.count_lock:
            self.worker.report.abandoned += 1
        log.warning("run %s: item %s/%s (key %s) still running after %gs: abandoned; it stays "
                    "held until its handler ends, then %s", item.run_id, item.stage, item.seq,
                    item.key, limit, after_timeout(stage.idempotent,
                                                   item.attempts + 1 >= stage.policy.max_attempts))

    # -- writes ------------------------------------------------------------------------------------

    def _heartbeat(self, ids: list[int]) -> None:
        self.store.items_heartbeat(LeaseParams(self.run_id, ids, self.token,
                                               self.worker.options.lease))
        self.last_beat = self.worker.clock()

    def release(self, ids: list[int]) -> None:
        self.held.difference_update(ids)
        if not ids:
            return
        by_run: dict[int, list[int]] = {}
        for item_id in ids:
            by_run.setdefault(self.run_of[item_id] if self.run_of else self.run_id,
                              []).append(item_id)
        n = sum(self.store.items_release(LeaseParams(run_id, mine, self.token,
                                                     actor=self.worker.worker_id))
                for run_id, mine in sorted(by_run.items()))
        with self.worker.count_lock:
            self.worker.report.released += n

    def flush(self, start: Sequence[ClaimedItem] = (), charge: int = 0) -> list[int]:
        """Write the outcomes gathered so far (and record the starts of ``start``, each charged
        ``charge`` attempts, in the same transaction); return the ids of ``start`` whose start
        was recorded."""
        self.last_flush = self.worker.clock()
        if not self.finishes and not start:
            return []
        finishes, self.finishes = self.finishes, []
        self.held.difference_update(f.id for f in finishes)
        result = self.store.items_finish_if_leased(
            FinishParams(self.run_id, finishes, actor=self.worker.worker_id,
                         start=[i.id for i in start], start_token=self.token,
                         start_charge=charge, run_of=self.run_of))
        count(self.worker, self.run_id, finishes, result)
        if result.applied and any(f.next_stage for f in finishes):
            self.worker.nudge()  # their next stage's items are claimable: an idle lane looks
        return result.started


def runs_of(items: Sequence[ClaimedItem]) -> dict[int, int] | None:
    """The run of each item's id when the items are of several runs (a claim across runs);
    None when they are all of one."""
    first = items[0].run_id
    if all(i.run_id == first for i in items):
        return None
    return {i.id: i.run_id for i in items}


def after_timeout(idempotent: bool, last_attempt: bool) -> str:
    """What becomes of an item abandoned at its time limit, for the log."""
    if not idempotent:
        return "its outcome is in doubt"
    return "its retries are exhausted" if last_attempt else "retried"


def count(worker: Holder, run_id: int, finishes: list[Finish], result: FinishResult) -> None:
    """Add a write's outcomes to the worker's report (and say when some were stale)."""
    with worker.count_lock:
        _count(worker.report, run_id, finishes, result)


def _count(report: WorkReport, run_id: int, finishes: list[Finish], result: FinishResult
           ) -> None:
    report.stale += len(result.stale)
    if result.stale:
        log.warning("run %s: %d result(s) discarded as stale: their leases had been taken "
                    "back", run_id, len(result.stale))
    if len(result.applied) == len(finishes):  # the usual case: count the writes in C
        made = Counter(map(_WRITE, finishes))
    else:
        applied = set(result.applied)
        made = Counter(f.write for f in finishes if f.id in applied)
    states: Counter[str] = Counter()
    for write, n in made.items():  # a few distinct writes per chunk
        states[write.state] += n
    report.add_outcomes(states)


def vanished(job: Job, item: ClaimedItem, reason: str) -> Outcome:
    """What becomes of an item whose handler was lost mid-run (or ran past its time limit
    and has ended), by its stage's declaration: what the sweeper does once its holder is gone,
    but at once."""
    stage = job.stage_named(item.stage)
    if stage.idempotent:
        return RetryLater(reason)  # an attempt charged; failed after max_attempts
    if stage.verify is not None:
        return Unknown(AWAITING_VERIFY)  # the sweeper asks the hook
    return Unknown(reason)  # a person resolves it


@dataclass(frozen=True)
class Overrun:
    """A task abandoned past its time limit: its items, still held under the chunk's token."""

    future: Future[list[Ran]]
    job: Job
    items: list[ClaimedItem]
    limit: float
    charge: int
    since: float  # the worker's clock when it was abandoned


@dataclass
class LateResults:
    """Handlers abandoned past their time limit, until each has really ended. Their items stay
    claimed, their leases renewed from a thread of their own (:class:`Renewal`), so no sweeper
    takes them back, asks a verify hook or lets a person resolve them as pending while the
    handler may still make its effect. When the handler ends (a thread returns, a coroutine's
    cancellation completes, a child process is killed), its items are settled, fenced by their
    token, as if their holder had vanished, by the stage's declaration; what the handler did
    late is in the event's detail (``late``), never applied as the item's result."""

    pending: list[Overrun] = field(default_factory=list)
    _renewal: Renewal | None = None
    _holder: Holder | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _settling: int = 0  # taken out of pending by a write not finished yet

    def add(self, holder: Holder, overrun: Overrun) -> None:
        with self._lock:
            self._holder = holder
            if self._renewal is None:
                self._renewal = Renewal(holder.store, holder.options.lease, "wl-overruns",
                                        on_wake=lambda: self.write(holder))
            self.pending.append(overrun)
            renewal = self._renewal
        items = overrun.items
        renewal.hold(items[0].run_id, items[0].lease_token, [i.id for i in items])
        overrun.future.add_done_callback(lambda _: renewal.poke())

    @property
    def busy(self) -> bool:
        """An abandoned handler still runs, or its items are being settled."""
        with self._lock:
            return bool(self.pending) or self._settling > 0

    def drain(self, worker: Holder) -> None:
        """Wait until every abandoned handler has ended and its items are settled (a worker
        that stops does not leave an item held by a handler that may still act)."""
        while True:
            with self._lock:
                futures = [p.future for p in self.pending]
                settling = self._settling
            if not futures and not settling:
                return
            if futures:
                wait(futures, timeout=1.0, return_when=FIRST_COMPLETED)
            else:  # another thread is writing the last ones: let it finish
                time.sleep(0.01)
            self.write(worker)

    def write(self, worker: Holder) -> None:
        """Settle the items of every abandoned handler that has ended by now."""
        with self._lock:
            done = [p for p in self.pending if p.future.done()]
            self.pending = [p for p in self.pending if not p.future.done()]
            self._settling += len(done)  # drain() waits for these too
            renewal = self._renewal
        try:
            for i, overrun in enumerate(done):
                try:
                    self._settle(worker, overrun)
                except BaseException:
                    with self._lock:  # not written: the next wake-up tries again
                        self.pending.extend(done[i:])
                    raise
                if renewal is not None:
                    items = overrun.items
                    renewal.drop(items[0].run_id, items[0].lease_token, [i.id for i in items])
        finally:
            with self._lock:
                self._settling -= len(done)

    def _settle(self, worker: Holder, overrun: Overrun) -> None:
        late = {item.id: outcome for item, outcome in _ran(overrun.future)}
        ran_for = worker.clock() - overrun.since + overrun.limit
        finishes = []
        for item in overrun.items:
            outcome = vanished(overrun.job, item, f"timeout after {overrun.limit:g}s")
            finish = to_finish(overrun.job, item, outcome, item.attempts + 1,
                               worker.rng.random(), overrun.charge)
            facts = json.loads(finish.detail) if finish.detail else {}
            facts["late"] = _what_it_did(late.get(item.id))
            facts["ran_for"] = round(ran_for, 3)
            finishes.append(finish._replace(detail=json.dumps(facts)))  # each records one
        run_id = overrun.items[0].run_id
        result = worker.store.items_finish_if_leased(
            FinishParams(run_id, finishes, actor=worker.worker_id,
                         run_of=runs_of(overrun.items)))
        count(worker, run_id, finishes, result)
        worker.nudge()


def _what_it_did(outcome: Outcome | HolderLost | None) -> str:
    """What an abandoned handler did in the end, for the settling event."""
    if outcome is None:
        return "it ended without an outcome"
    if isinstance(outcome, HolderLost):
        return outcome.reason
    name = type(outcome).__name__
    reason = getattr(outcome, "reason", None) or getattr(outcome, "evidence", None)
    return f"{name}: {reason}" if reason else name


def _ran(future: Future[list[Ran]]) -> list[Ran]:
    try:
        return future.result()
    except BaseException:  # noqa: BLE001 - a task that failed has no result to discard
        return []

