"""The sweeper: the named actor for every stranded state that no worker moves by itself.

One pass (``workledger sweep``; every worker also runs it periodically) does four things, each
safe when two sweepers race, because every write is guarded by the state it moves from:

- re-decomposes runs accepted but never (or only partly) decomposed, from the retained payload;
- handles expired leases as the stage declares (docs/design.md, invariant 5): idempotent -> pending,
  ``verify`` hook -> ask it, otherwise -> ``unknown`` for a person to ``resolve``;
- asks ``verify`` hooks about ``unknown`` items still awaiting them;
- runs the closing hook of complete runs, once, as a ledger entry of its own;

and, for a ledger that dispatches through a broker, publishes again the messages its pending
items are owed by now (``_runtime/broker/dispatch.py``).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

from workledger import failpoints
from workledger._runtime.decompose import decompose
from workledger._runtime.deferred import take_deferred
from workledger._runtime.handlers.execute import (
    context_for,
    run_handler,
    to_finish,
    view_of,
)
from workledger._runtime.renewal import Renewal
from workledger._runtime.repair.calendar import Firer
from workledger.core import writes
from workledger.core.outcomes import Failed, Outcome, Processed
from workledger.core.states import (
    AWAITING_VERIFY,
    OUTCOME_UNKNOWN,
    RECLAIMED,
    VERIFIED_NOT_DONE,
    Actor,
    move,
)
from workledger.core.status import CLOSE_STAGE, PERMANENT_DECOMPOSITION
from workledger.core.text import Unstorable, json_text, reason_text
from workledger.errors import DatabaseUnavailable, DecompositionFailed, WorkledgerError
from workledger.jobs import Job, Stage
from workledger.storage.port import (
    ClaimedItem,
    ClaimParams,
    FinishParams,
    ItemRow,
    ItemsInsert,
    LeaseParams,
    NewEvent,
    NewItem,
    ReclaimParams,
    RunRow,
    Settle,
    SettleParams,
    Store,
)

log = logging.getLogger("workledger.sweeper")

_RECLAIM, _RECLAIM_UNKNOWN = (
    move(name, Actor.SWEEPER) for name in ("lease_expired", "lease_expired_unknown"))
_UNKNOWN = writes.verify_unsure().move.from_state  # what a verify hook's answer settles


PAGE = 1000
T = TypeVar("T")


class HookTimeout(Exception):  # noqa: N818 - read as "the hook timed out"
    """A verify or closing hook still running after its time limit."""


def bounded(call: Callable[[], T], limit: float | None) -> T:
    """``call()``, given at most ``limit`` seconds (None: as long as it takes). A hook past its
    limit is left running in a daemon thread (a thread cannot be killed) and
    :class:`HookTimeout` raised, so a slow hook never holds up the sweeper's other work."""
    if limit is None:
        return call()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            box["error"] = exc

    thread = threading.Thread(target=run, name="wl-hook", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        raise HookTimeout(f"still running after {limit:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


@dataclass
class SweepReport:
    redecomposed: int = 0
    decomposition_errors: int = 0
    to_pending: int = 0
    to_unknown: int = 0
    verified: int = 0
    closed: int = 0
    closing_failed: int = 0
    deferred: int = 0  # deferred runs taken and decomposed (_runtime/deferred.py)
    redispatched: int = 0  # items whose messages were overdue, published again (a broker)
    fired: int = 0  # schedules' firings recorded with a run (repair/calendar.py)
    firing_failures: int = 0  # firings whose schedule function raised
    deadlines_missed: int = 0  # runs noted as past their deadline by this pass


class Sweeper:
    def __init__(
        self,
        store: Store,
        jobs: Mapping[str, Job],
        status_of: Callable[[int], Any],
        *,
        actor: str = "sweeper",
        grace: float = 30.0,
        lease: float = 30.0,
        rng: random.Random | None = None,
        backoff: float = 0.0,
        timeout: float | None = None,
        redispatch: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        self.timeout = timeout  # a hook's time limit where its stage sets none
        # with a broker: publish again what is owed a message by now (_runtime/broker/dispatch.py)
        self.redispatch = redispatch
        # after a decomposer failed n times, wait backoff * 2^(n-1) s (at most 1 h) to retry it
        self.backoff = backoff
        self.jobs = dict(jobs)
        self.status_of = status_of
        self.actor = actor
        self.grace = grace  # seconds without decomposition progress before re-decomposing
        self.lease = lease
        self.rng = rng or random.Random()
        self.holder: str | None = None  # the worker's holder, when it runs in a worker
        self._overruns: list[threading.Thread] = []  # closing hooks past their time limit
        self.firer = Firer(store, self.jobs, actor)  # the jobs' schedules and deadlines

    def sweep(self) -> SweepReport:
        report = SweepReport()
        self._fire(report)  # first: the runs it records are decomposed by this pass
        self._redecompose(report)
        self._expired_leases(report)
        self._verify_unknown(report)
        self._close_runs(report)
        if self.redispatch is not None:  # last: what this pass made pending goes out now
            report.redispatched = self.redispatch()
        return report

    def fire(self) -> SweepReport:
        """Only the schedules that are due (and the runs they record, decomposed at once): what
        a worker's sweeper does between its passes when a firing comes first."""
        report = SweepReport()
        self._fire(report)
        if report.fired:
            taken, failed = take_deferred(self.store, self.jobs, self.actor)
            report.deferred += taken
            report.decomposition_errors += failed
        return report

    def _fire(self, report: SweepReport) -> None:
        fired = self.firer.fire_due()
        report.fired += fired.submitted
        report.firing_failures += fired.failed
        report.deadlines_missed += fired.deadlines_missed

    # -- runs never decomposed ---------------------------------------------------------------

    def _redecompose(self, report: SweepReport) -> None:
        # runs recorded in a caller's transaction first: nobody else decomposes them, so no
        # grace (unless a worker took them already)
        taken, failed = take_deferred(self.store, self.jobs, self.actor)
        report.deferred += taken
        report.decomposition_errors += failed
        for run in self.store.runs_undecomposed(self.grace, self.backoff):
            job = self.jobs.get(run.job)
            if job is None or (run.error or "").startswith(PERMANENT_DECOMPOSITION):
                continue
            if self._isolated(run.id, "re-decomposition", self._decompose, job, run):
                report.redecomposed += 1
            else:
                report.decomposition_errors += 1

    def _decompose(self, job: Job, run: RunRow) -> bool:
        # listings leave the payload out; only the runs this sweeper decomposes read it
        decompose(self.store, job, replace(run, payload=self.store.run_payload(run.id)),
                  check_existing=True, actor=self.actor)
        return True

    def _isolated(self, run_id: int, step: str, action: Callable[..., bool],
                  *args: Any) -> bool:
        """``action(*args)``, one run's step of the pass. If it fails, log it, record it on
        that run (an event; for a re-decomposition also the run's error, as ``status`` shows)
        and return False, so the pass goes on to the other runs. A lost database stops the
        pass: every other step would fail the same way."""
        try:
            return action(*args)
        except DatabaseUnavailable:
            raise
        except DecompositionFailed as exc:  # recorded on the run by decompose itself
            log.warning("run %s: %s", run_id, exc)
            return False
        except Exception as exc:  # one bad run must not stop the pass for every other run
            message = reason_text(f"{step} failed: {type(exc).__name__}: {exc}")
            log.warning("run %s: %s", run_id, message)
            try:
                if step == "re-decomposition":
                    self.store.run_record_error(run_id, message, self.actor)
                self.store.events_add([NewEvent(run_id, "sweep_failed", actor=self.actor,
                                                detail=json.dumps({"step": step,
                                                                   "error": message}))])
            except Exception:  # noqa: BLE001 - recording is best effort; the log has it
                log.exception("run %s: could not record the failure", run_id)
            return False

    # -- expired leases --------------------------------------------------------------------

    def _expired_leases(self, report: SweepReport) -> None:
        for job in self.jobs.values():
            for stage in [*job.stages, *([job.closing] if job.closing else [])]:
                if stage.idempotent:
                    to, reason = _RECLAIM.target.value, RECLAIMED
                elif stage.verify is not None:
                    to, reason = _RECLAIM_UNKNOWN.target.value, AWAITING_VERIFY
                else:
                    to, reason = _RECLAIM_UNKNOWN.target.value, OUTCOME_UNKNOWN
                params = ReclaimParams(job=job.name, stage=stage.name, to_state=to,
                                       reason=reason, actor=self.actor)
                while rows := self.store.leases_reclaim_expired(params):  # a batch at a time
                    # an item whose handler never started goes back to pending, whatever `to`
                    back = sum(1 for r in rows if r.state == _RECLAIM.target)
                    report.to_pending += back
                    report.to_unknown += len(rows) - back
                    if len(rows) < params.limit:
                        break

    def _verify_unknown(self, report: SweepReport) -> None:
        jobs_of: dict[int, str] = {}
        for item in self._awaiting():
            if item.error != AWAITING_VERIFY:
                continue
            if item.run_id not in jobs_of:
                run = self.store.run_get(item.run_id)
                jobs_of[item.run_id] = run.job if run else ""
            job = self.jobs.get(jobs_of[item.run_id])
            stage = next((s for s in job.stages if s.name == item.stage), None) if job else None
            if job is None or stage is None or stage.verify is None:
                continue  # not this app's, or a stage it no longer declares: a person's
            if self._isolated(item.run_id, f"verify of item {item.stage}/{item.seq}",
                              self._ask, job, stage, item):
                report.verified += 1

    def _awaiting(self) -> Iterator[ItemRow]:
        """Every unknown item, a page at a time (the hooks of all are asked, however many)."""
        after = 0
        while page := self.store.items_attention([_UNKNOWN], PAGE, after):
            yield from page
            after = page[-1].id

    def _ask(self, job: Job, stage: Stage, item: ItemRow) -> bool:
        verify = stage.verify
        assert verify is not None
        limit = stage.limit(self.timeout)
        try:
            answer = bounded(lambda: verify(view_of(item), context_for(
                job, item, item.attempts, self.actor)), limit)
        except HookTimeout:
            answer = "unknown", f"the verify hook was still running after {limit:g}s"
        except Exception as exc:  # a verify hook that fails tells us nothing
            answer = "unknown", f"verify raised {type(exc).__name__}: {exc}"
        self.store.items_settle(SettleParams(item.run_id, _UNKNOWN,
                                             [verdict_settle(job, item, answer)], self.actor))
        return True

    # -- closing hooks ---------------------------------------------------------------------

    def _close_runs(self, report: SweepReport) -> None:
        for job in self.jobs.values():
            if job.closing is None:
                continue
            for run_id in self.store.runs_to_close([job.name], CLOSE_STAGE):
                if self._isolated(run_id, "closing hook", self._close, job, run_id):
                    report.closed += 1
                else:
                    report.closing_failed += 1

    def _close(self, job: Job, run_id: int) -> bool:
        self.store.items_insert_many(ItemsInsert(run_id, CLOSE_STAGE, [NewItem(0, None, None)]))
        return self._run_closing(job, run_id)

    def _run_closing(self, job: Job, run_id: int) -> bool:
        """Claim the run's ``@close`` entry and run its hook under that lease, renewed while the
        hook runs (a hook longer than the lease is not taken back and run again by another
        sweeper). Its attempt is charged before the hook starts, so a hook whose process dies
        inside it is bounded by ``max_attempts`` like an item. A hook past its time limit is
        left to finish in its thread, its entry still held: its outcome is written when it
        ends (``finish_overruns`` waits for that), never while it may still act. A sweeper
        outside a worker holds a holder of its own for the claim (storage/holders.py)."""
        own = None
        if self.holder is None:
            opened = self.store.holder_open()
            own = opened[0] if opened else None
        holder = self.holder or own
        done = True
        try:
            claimed = self.store.items_claim(ClaimParams(run_id, 1, self.lease, 0, self.actor,
                                                         closing=True, holder=holder))
            item = next((c for c in claimed if c.stage == CLOSE_STAGE), None)
            if item is None:
                return False  # another sweeper holds it, or it waits for its retry time
            stage = job.stage_named(CLOSE_STAGE)
            if item.attempts >= stage.policy.max_attempts:  # each lost with its process
                return self._closed(job, run_id, item, Failed(
                    f"gave up after {item.attempts} attempts: the process running the "
                    "closing hook was lost each time"), item.attempts)
            if not self.store.items_mark_started(LeaseParams(run_id, [item.id],
                                                             item.lease_token)):
                return False  # its lease is lost already
            call = _HookCall(job, stage, item, item.attempts + 1, self.actor,
                             lambda: self._hook(job, run_id, item, item.attempts + 1))
            renewal = Renewal(self.store, self.lease, name="wl-hook-lease")
            renewal.hold(run_id, item.lease_token, [item.id])
            limit = stage.limit(self.timeout)
            if call.ended(limit):
                renewal.drop(run_id, item.lease_token, [item.id])
                failpoints.hit("closing.after_hook")
                return self._closed(job, run_id, item, call.outcome, call.attempt)
            log.warning("run %s: the closing hook is still running after %gs: its entry stays "
                        "held until it ends", run_id, limit)
            done = False
            finisher = threading.Thread(target=self._after_overrun, daemon=True,
                                        name="wl-hook-overrun",
                                        args=(job, run_id, item, call, renewal, own))
            self._overruns.append(finisher)
            finisher.start()
            return False
        finally:
            if own is not None and done:
                self.store.holder_close(own)

    def _hook(self, job: Job, run_id: int, item: ClaimedItem, attempt: int) -> Any:
        hook = job.on_complete_fn
        assert hook is not None
        if job.on_complete_takes_context:
            return hook(self.status_of(run_id), context_for(job, item, attempt, self.actor))
        return hook(self.status_of(run_id))

    def _after_overrun(self, job: Job, run_id: int, item: ClaimedItem, call: _HookCall,
                       renewal: Renewal, own: str | None) -> None:
        """A closing hook past its time limit has ended at last: write what it did."""
        try:
            call.ended(None)
            renewal.drop(run_id, item.lease_token, [item.id])
            self._closed(job, run_id, item, call.outcome, call.attempt)
        except Exception:  # noqa: BLE001 - its lease runs out and the next sweep takes it back
            log.exception("run %s: could not write the closing hook's late outcome", run_id)
        finally:
            if own is not None:
                self.store.holder_close(own)

    def finish_overruns(self, timeout: float | None = None) -> None:
        """Wait for closing hooks left running past their time limit to end (and their
        outcomes to be written)."""
        for thread in list(self._overruns):
            thread.join(timeout)
        self._overruns = [t for t in self._overruns if t.is_alive()]

    def _closed(self, job: Job, run_id: int, item: ClaimedItem, outcome: Outcome,
                attempt: int) -> bool:
        finish = to_finish(job, item, outcome, attempt, self.rng.random(), charge=0,
                           actor=Actor.SWEEPER)  # a processed closing entry records `closed`
        self.store.items_finish_if_leased(FinishParams(run_id, [finish], self.actor))
        return isinstance(outcome, Processed)


class _HookCall:
    """A closing hook's call in a thread of its own; ``ended(limit)`` waits for it."""

    def __init__(self, job: Job, stage: Stage, item: ClaimedItem, attempt: int, actor: str,
                 call: Callable[[], Any]) -> None:
        self.attempt = attempt
        self.outcome: Outcome = Failed("the closing hook did not end")
        self._thread = threading.Thread(target=self._run, daemon=True, name="wl-hook",
                                        args=(job, stage, item, actor, call))
        self._thread.start()

    def _run(self, job: Job, stage: Stage, item: ClaimedItem, actor: str,
             call: Callable[[], Any]) -> None:
        self.outcome = run_handler(job, stage, item, self.attempt, actor, call=call)

    def ended(self, limit: float | None) -> bool:
        self._thread.join(limit)
        return not self._thread.is_alive()


def verdict_settle(job: Job, item: ItemRow, answer: Any) -> Settle:
    """Turn a verify hook's answer into a state-guarded move out of ``unknown``."""
    verdict, extra = (answer if isinstance(answer, tuple) else (answer, None))
    detail = json.dumps({"verdict": str(verdict)})
    if verdict == "done":
        nxt = job.next_stage(item.stage)
        try:
            result = None if extra is None else json_text(extra)
        except Unstorable as exc:
            return Settle(item.id, writes.verify_unsure(), detail=detail,
                          error=f"verify could not tell: it answered done with a result that "
                                f"cannot be stored: {exc}")
        return Settle(item.id, writes.verified_done(item.stage, nxt is None), result=result,
                      next_stage=nxt, detail=detail)
    if verdict == "not_done":
        # a suspect from here on: if it is poison, its next run charges its attempt first
        return Settle(item.id, writes.verified_not_done(), error=VERIFIED_NOT_DONE,
                      detail=detail)
    evidence = extra if isinstance(extra, str) else f"verify answered {verdict!r}"
    return Settle(item.id, writes.verify_unsure(), error=f"verify could not tell: {evidence}",
                  detail=detail)


FIRE_SLACK = 0.02  # seconds: a firing's pass starts this long after its time
FIRE_RETRY = 1.0  # seconds before a firing still due (its function raised) is tried again


class SweepLoop:
    """A worker's periodic sweeper: in a thread of its own, off the claim loop, so a slow hook
    never delays claims or heartbeats; and only while this process leads the sweeping of its
    jobs (``Store.lead``: an advisory lock on PostgreSQL, a file lock beside the SQLite file,
    one per set of jobs), so N workers of the same jobs run one sweeper, not N. ``workledger
    sweep`` by hand sweeps regardless.

    A leader can be stuck (stopped, starved, in a hook without a time limit) while it holds the
    lock: a process that does not lead looks, each period, at what a sweep would find (expired
    leases, runs to close or to decompose, items awaiting a verify hook, with reads only) and
    sweeps itself when the same work is still waiting a period later.

    ``quiet()`` true (this process's database just came back from an outage) skips the pass:
    a worker whose leases expired during the outage first writes the outcomes it holds, instead
    of its own sweeper taking them back."""

    def __init__(self, sweeper: Sweeper, store: Store, every: float,
                 on_swept: Callable[[SweepReport], None],
                 quiet: Callable[[], bool] = lambda: False, *, only_fire: bool = False) -> None:
        self.sweeper = sweeper
        self.store = store
        self.every = every
        self.on_swept = on_swept
        self.quiet = quiet
        self.scope = ",".join(sorted(sweeper.jobs))  # the sweeper lock is per set of jobs
        # only the schedules (``serve``): a lock of their own, so that such a process never
        # takes the sweeping of its jobs from their workers (a firing is safe twice over)
        self.only_fire = only_fire
        if only_fire:
            self.scope = "@schedules:" + self.scope
        else:  # a worker's loop: its app's declarations replace the recorded ones (a deploy)
            sweeper.firer.replace = True
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._seen: set[tuple[object, ...]] = set()
        self._thread = threading.Thread(target=self._run, name="wl-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def terminate(self) -> None:
        """Ask the loop to stop after its pass in progress, without waiting."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        self.sweeper.finish_overruns(60)
        self.store.unlead()

    def _run(self) -> None:
        full_at = time.monotonic() + self.every if self.only_fire else 0.0
        while not self._stop.is_set():
            if time.monotonic() >= full_at and not self.only_fire:
                self.sweep_once()
                full_at = time.monotonic() + self.every
            else:  # a schedule's firing comes before the next full pass
                self.sweep_once(fire_only=True)
            if self.only_fire and time.monotonic() >= full_at:
                full_at = time.monotonic() + self.every
            wait = full_at - time.monotonic()
            due = self.sweeper.firer.next_due
            if due is not None:
                wait = min(wait, due + FIRE_SLACK if due > 0 else FIRE_RETRY)
            self._stop.wait(max(wait, FIRE_SLACK))

    def sweep_once(self, fire_only: bool = False) -> bool:
        """One pass now, if this process leads (or the leader left work waiting); False if it
        did not sweep (or the pass failed). ``fire_only``: only the schedules that are due."""
        with self._mutex:
            try:
                if self.quiet():
                    return False
                if not (self.store.lead(self.scope) or (
                        not fire_only and self._leader_is_stuck())):
                    self.sweeper.firer.next_due = None  # the leader fires: no early wake-up
                    return False
                if fire_only:
                    self.on_swept(self.sweeper.fire())
                    return True
                self._seen = set()
                report = self.sweeper.sweep()
                log.debug("sweep pass: %s", ", ".join(
                    f"{k} {v}" for k, v in asdict(report).items() if v) or "nothing to do")
                self.on_swept(report)
                return True
            except WorkledgerError as exc:  # an outage, a full disk: one line, not a traceback
                log.warning("sweep failed: %s", exc)
                return False
            except Exception:  # logged, and the next period tries again
                log.exception("sweep failed")
                return False

    def _leader_is_stuck(self) -> bool:
        waiting: set[tuple[object, ...]] = {("lease", i.id)
                                            for i in self.store.leases_expired(10)}
        jobs = [j.name for j in self.sweeper.jobs.values() if j.closing is not None]
        if jobs:
            waiting |= {("close", r) for r in self.store.runs_to_close(jobs, CLOSE_STAGE)[:10]}
        waiting |= {("decompose", r.id) for r in self.store.runs_undecomposed(
            self.sweeper.grace, self.sweeper.backoff) if r.job in self.sweeper.jobs}
        waiting |= {("verify", i.id) for i in self.store.items_attention([_UNKNOWN], 10)
                    if i.error == AWAITING_VERIFY}
        if self.sweeper.firer.schedules:  # this process's firings due and not recorded
            waiting |= {("fire", r.name, r.next_fire_at) for r in self.sweeper.firer.overdue()}
        if self.sweeper.redispatch is not None:  # with a broker: messages overdue
            for run_id, *_ in self.store.runs_claimable(sorted(self.sweeper.jobs))[:10]:
                waiting |= {("owed", run_id, stage, seq)
                            for stage, seq in self.store.items_owed(run_id, 10)}
        stuck = bool(waiting & self._seen)
        self._seen = waiting
        if stuck:
            log.warning("the sweeping process left expired leases, closing hooks, "
                        "decompositions, verify hooks or overdue messages waiting for a whole "
                        "period: this one sweeps instead")
        return stuck
