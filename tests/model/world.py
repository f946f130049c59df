"""A small world around the ledger model, explored exhaustively: every interleaving of what its
actors can do, and the invariants checked in every state reached.

Actors: a submitter per run (decompose: insert the rows, then mark the run), two workers
(claim a chunk, record starts, run handlers with any outcome, write outcomes fenced, stop and
release, crash), one sweeper (expired leases by declaration, verify hooks, re-decomposition,
the closing entry), one operator (retry, resolve, pause, resume, cancel), and a clock that
lets a lease run out. Faults and the operator are bounded by budgets; otherwise the world is
closed. A worker follows ``_runtime/worker/worker.py``: suspects (left ``lease_expired``) first,
each charged before it runs and run alone; then the idempotent stages' items, outcomes written
together; then the other stages' items, each start recorded with the outcomes so far.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from . import ledger as m
from . import settles as rules
from .ledger import CLOSE, SUSPECT, Finish, Job, Ledger


class Task(NamedTuple):
    idx: int
    suspect: bool  # claimed with a reason "lease_expired...": charged first, run alone
    attempts: int  # as read by the claim
    recorded: bool  # a stage that is not idempotent: its start is recorded first


class Worker(NamedTuple):
    run: int = -1  # -1: idle
    token: int = 0
    todo: tuple[Task, ...] = ()
    running: bool = False  # todo[0]'s handler may start: its start is recorded (or needs none)
    outcomes: tuple[Finish, ...] = ()  # run, not yet written


class Closer(NamedTuple):
    """The sweeper's closing entry in hand (it claims one and runs the hook)."""

    run: int = -1
    token: int = 0
    idx: int = -1


class Budget(NamedTuple):
    expiries: int
    faults: int  # crashes of any process, and workers stopped by SIGTERM
    operator: int


class World(NamedTuple):
    ledger: Ledger
    workers: tuple[Worker, ...]
    closer: Closer
    submitted: tuple[int, ...]  # per run: 0 nothing written, 1 rows written, 2 done or dead
    budget: Budget


@dataclass(frozen=True)
class Setup:
    jobs: dict[str, Job]
    runs: tuple[tuple[str, int, frozenset[int]], ...]  # (job, units, units skipped at decompose)
    workers: int = 2
    chunk: int = 2
    budget: Budget = Budget(2, 1, 2)
    # a handler's outcome by attempt (the last one repeats), per (run, stage, seq); an item
    # without a script may end any way its stage allows in ``outcomes``
    scripts: dict[tuple[int, str, int], tuple[str, ...]] = field(default_factory=dict)
    outcomes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # by stage
    broker: bool = False  # an idle worker may instead be a broker task handed one item

    def choices(self, run: int, stage: str, seq: int, attempt: int) -> tuple[str, ...]:
        script = self.scripts.get((run, stage, seq))
        if script is None:
            return self.outcomes[stage]
        return (script[min(attempt, len(script)) - 1],)

    def initial(self) -> World:
        led = Ledger()
        for job, units, _ in self.runs:
            led = m.submit(led, job, units)
        return World(led, (Worker(),) * self.workers, Closer(), (0,) * len(self.runs),
                     self.budget)


class Step(NamedTuple):
    label: str
    world: World
    moves: m.Moves


# -- successors -------------------------------------------------------------------------------


def successors(setup: Setup, w: World) -> Iterator[Step]:
    yield from _submitters(setup, w)
    for n, worker in enumerate(w.workers):
        yield from _worker(setup, w, n, worker)
    yield from _sweeper(setup, w)
    yield from _operator(setup, w)
    yield from _clock(w)


def _with_worker(w: World, n: int, worker: Worker, led: Ledger | None = None) -> World:
    workers = list(w.workers)
    workers[n] = worker
    return w._replace(ledger=led or w.ledger, workers=tuple(workers))


def _spend(w: World, kind: str) -> World:
    return w._replace(budget=w.budget._replace(**{kind: getattr(w.budget, kind) - 1}))


def _submitters(setup: Setup, w: World) -> Iterator[Step]:
    for run, phase in enumerate(w.submitted):
        if phase == 2:
            continue
        submitted = list(w.submitted)
        submitted[run] = phase + 1
        if phase == 0:
            led, moves = m.decompose_insert(w.ledger, setup.jobs, run, setup.runs[run][2])
        else:
            led, moves = m.decompose_mark(w.ledger, setup.jobs, run), []
        yield Step(f"submit{run}", w._replace(ledger=led, submitted=tuple(submitted)), moves)
        if w.budget.faults:
            submitted[run] = 2
            yield Step(f"submitter{run} crashes",
                       _spend(w, "faults")._replace(submitted=tuple(submitted)), [])


def _tasks(setup: Setup, led: m.Ledger, run: int, taken: list[int]) -> tuple[Task, ...]:
    job = setup.jobs[led.runs[run].job]
    tasks = [Task(i, led.items[i].reason in SUSPECT, led.items[i].attempts,
                  led.items[i].stage not in job.idempotent and led.items[i].stage != CLOSE)
             for i in taken]
    return tuple(sorted(tasks, key=lambda t: (not t.suspect, t.recorded)))


def _delivered(setup: Setup, w: World, n: int, run: int) -> Iterator[Step]:
    """A broker task instead of a worker: a message names the run's last pending item, which
    it claims by identity, then runs as a worker runs a chunk (_runtime/broker/delivery.py)."""
    pending = [it for it in w.ledger.items if it.run == run and it.state == "pending"
               and it.stage != CLOSE]
    if not (setup.broker and pending):
        return
    last = pending[-1]
    led2, token, taken, moves = m.claim_identity(w.ledger, run, last.stage, [last.seq])
    if taken:
        yield Step(f"w{n} is handed run {run}'s {last.stage}/{last.seq} by a broker",
                   _with_worker(w, n, Worker(run, token, _tasks(setup, w.ledger, run, taken)),
                                led2), moves)


def _worker(setup: Setup, w: World, n: int, wk: Worker) -> Iterator[Step]:
    led = w.ledger
    if wk.run < 0:
        for run in range(len(led.runs)):
            led2, token, taken, moves = m.claim(led, run, setup.chunk, "worker")
            if taken:
                yield Step(f"w{n} claims run {run}",
                           _with_worker(w, n, Worker(run, token, _tasks(setup, led, run, taken)),
                                        led2), moves)
            yield from _delivered(setup, w, n, run)
        return
    if w.budget.faults:
        yield Step(f"w{n} crashes", _with_worker(_spend(w, "faults"), n, Worker()), [])
        if not wk.running:
            led2, moves = m.release(led, [t.idx for t in wk.todo], wk.token)
            led2, moves2 = _flush(setup, led2, wk)
            yield Step(f"w{n} stops", _with_worker(_spend(w, "faults"), n, Worker(), led2),
                       moves + moves2)
    if not wk.todo:  # the chunk's last outcomes are written, and the worker claims again
        led2, moves = _flush(setup, led, wk)
        yield Step(f"w{n} writes its outcomes", _with_worker(w, n, Worker(), led2), moves)
        return
    yield from _next_task(setup, w, n, wk)


def _next_task(setup: Setup, w: World, n: int, wk: Worker) -> Iterator[Step]:
    led, task = w.ledger, wk.todo[0]
    job = setup.jobs[led.runs[wk.run].job]
    if wk.running or not (task.suspect or task.recorded):
        yield from _handler(setup, w, n, wk, task, job)
        return
    rest = wk._replace(todo=wk.todo[1:])
    if task.suspect:
        if wk.outcomes:  # the chunk's outcomes are written first, then it runs alone
            led2, moves = _flush(setup, led, wk)
            yield Step(f"w{n} writes its outcomes", _with_worker(
                w, n, wk._replace(outcomes=()), led2), moves)
            return
        if task.attempts >= job.max_attempts:
            gave_up = Finish(task.idx, wk.token, "failed", 0, "gave_up")
            yield Step(f"w{n} gives up", _with_worker(
                w, n, rest._replace(outcomes=wk.outcomes + (gave_up,))), [])
            return
        led2, started = m.mark_started(led, [task.idx], wk.token, 1)
    else:
        led2, _, _, started, moves = m.finish(led, setup.jobs, wk.run, list(wk.outcomes),
                                              "worker", [task.idx], wk.token)
        wk = wk._replace(outcomes=())
        rest = rest._replace(outcomes=())
        if not started:
            yield Step(f"w{n} records outcomes, start refused", _with_worker(w, n, rest, led2),
                       moves)
            return
        yield Step(f"w{n} records a start", _with_worker(w, n, wk._replace(running=True), led2),
                   moves)
        return
    if not started:
        yield Step(f"w{n} lost the lease", _with_worker(w, n, rest, led2), [])
    else:
        yield Step(f"w{n} charges first", _with_worker(w, n, wk._replace(running=True), led2),
                   [])


def _handler(setup: Setup, w: World, n: int, wk: Worker, task: Task, job: Job) -> Iterator[Step]:
    item = w.ledger.items[task.idx]
    attempt = task.attempts + 1
    choices = ("retry",) if item.stage == CLOSE else \
        setup.choices(item.run, item.stage, item.seq, attempt)
    for outcome in choices:
        decided, reason = outcome, outcome
        if outcome == "retry" and attempt >= job.max_attempts:
            decided, reason = "failed", "failed"
        if outcome == "processed":
            reason = ""
        charge = 0 if task.suspect else 1
        done = Finish(task.idx, wk.token, decided, charge, reason)
        led = _effect(w.ledger, task.idx) if outcome in ("processed", "unknown") else w.ledger
        rest = wk._replace(todo=wk.todo[1:], running=False, outcomes=wk.outcomes + (done,))
        yield Step(f"w{n} runs {item.stage}/{item.seq}: {outcome}",
                   _with_worker(w, n, rest, led), [])


def _effect(led: Ledger, idx: int) -> Ledger:
    items = list(led.items)
    items[idx] = items[idx]._replace(effects=min(2, items[idx].effects + 1))
    return led._replace(items=tuple(items))


def _flush(setup: Setup, led: Ledger, wk: Worker) -> tuple[Ledger, m.Moves]:
    if not wk.outcomes:
        return led, []
    led, _, _, _, moves = m.finish(led, setup.jobs, wk.run, list(wk.outcomes), "worker")
    return led, moves


def _sweeper(setup: Setup, w: World) -> Iterator[Step]:
    led = w.ledger
    for name, job in setup.jobs.items():
        for stage in job.all_stages():
            if any(it.state == "claimed" and not it.live and it.stage == stage
                   and led.runs[it.run].job == name for it in led.items):
                led2, moves = m.reclaim(led, setup.jobs, name, stage)
                yield Step(f"sweeper reclaims {name}/{stage}", w._replace(ledger=led2), moves)
    for i, it in enumerate(led.items):
        if it.state == "unknown" and it.reason == "awaiting_verify":
            truth = "done" if it.effects else "not_done"
            for verdict in (truth, "unsure"):
                led2, moves = rules.verify(led, setup.jobs, i, verdict)
                yield Step(f"sweeper verifies {it.stage}/{it.seq}: {verdict}",
                           w._replace(ledger=led2), moves)
    for run, phase in enumerate(w.submitted):
        if phase == 2 and not led.runs[run].decomposed:  # after its grace: decompose again
            led2, moves = m.decompose_insert(led, setup.jobs, run, setup.runs[run][2])
            yield Step(f"sweeper decomposes {run}",
                       w._replace(ledger=m.decompose_mark(led2, setup.jobs, run)), moves)
    yield from _closer(setup, w)


def _closer(setup: Setup, w: World) -> Iterator[Step]:
    led, c = w.ledger, w.closer
    if c.run >= 0:
        for outcome in ("processed", "retry", "failed", "skipped"):
            item = led.items[c.idx]
            decided = "failed" if outcome == "retry" and item.attempts + 1 >= \
                setup.jobs[led.runs[c.run].job].max_attempts else outcome
            led2 = _effect(led, c.idx) if outcome == "processed" else led
            led2, _, _, _, moves = m.finish(led2, setup.jobs, c.run, [Finish(
                c.idx, c.token, decided, 1, "" if decided == "processed" else decided)],
                "sweeper")
            yield Step(f"closing hook: {outcome}", w._replace(ledger=led2, closer=Closer()),
                       moves)
        if w.budget.faults:
            yield Step("sweeper crashes in the hook", _spend(w, "faults")._replace(
                closer=Closer()), [])
        return
    for run in range(len(led.runs)):
        if not rules.to_close(led, setup.jobs, run):
            continue
        if m.find(led, run, CLOSE, 0) is None:
            led2, moves = rules.close_insert(led, run)
            yield Step(f"sweeper inserts the closing entry of {run}", w._replace(ledger=led2),
                       moves)
            continue
        led2, token, taken, moves = m.claim(led, run, 1, "sweeper")
        if taken:  # a claimed work item is left to expire, as sweeper._close does
            closer = Closer(run, token, taken[0]) if led.items[taken[0]].stage == CLOSE \
                else Closer()
            yield Step(f"sweeper claims for closing {run}",
                       w._replace(ledger=led2, closer=closer), moves)


def _operator(setup: Setup, w: World) -> Iterator[Step]:
    if not w.budget.operator:
        return
    led, spent = w.ledger, _spend(w, "operator")
    for run, r in enumerate(led.runs):
        if any(it.run == run and it.state == "failed" for it in led.items):
            led2, moves = rules.retry(led, run)
            yield Step(f"operator retries {run}", spent._replace(ledger=led2), moves)
        if r.paused:
            yield Step(f"operator resumes {run}", spent._replace(ledger=rules.resume(led, run)), [])
        elif not r.cancelled:
            yield Step(f"operator pauses {run}", spent._replace(ledger=rules.pause(led, run)), [])
        if not r.cancelled:
            led2, moves = rules.cancel(led, run)
            yield Step(f"operator cancels {run}", spent._replace(ledger=led2), moves)
    for i, it in enumerate(led.items):
        if it.state == "unknown":  # a careful person: processed only if the effect is there
            for as_state in (("processed",) if it.effects else ("pending", "failed")):
                led2, moves = rules.resolve(led, setup.jobs, i, as_state)
                yield Step(f"operator resolves {it.stage}/{it.seq} as {as_state}",
                           spent._replace(ledger=led2), moves)


def _clock(w: World) -> Iterator[Step]:
    """A lease whose holder is gone runs out in time (free); one whose holder is still at work
    runs out only as a fault (a stalled worker, a heartbeat too late), from the budget."""
    held = {wk.token for wk in w.workers if wk.run >= 0} | {w.closer.token}
    for token in sorted({it.token for it in w.ledger.items if it.state == "claimed" and it.live}):
        if token not in held:
            yield Step(f"lease {token} runs out", w._replace(ledger=m.expire(w.ledger, token)),
                       [])
        elif w.budget.expiries:
            yield Step(f"lease {token} expires under its holder",
                       _spend(w, "expiries")._replace(ledger=m.expire(w.ledger, token)), [])


# -- invariants ------------------------------------------------------------------------------------


def state_violations(setup: Setup, w: World) -> list[str]:
    """Every invariant the state ``w`` breaks."""
    led, found = w.ledger, []
    rows = {(it.run, it.stage, it.seq): it for it in led.items}
    for run, r in enumerate(led.runs):
        # an accepted run's total is written when it is marked decomposed (base.py)
        if r.decomposed and rules.stored(led, run) != rules.derived(led, setup.jobs, run):
            found.append(f"R: run {run} stores {rules.stored(led, run)}, its items say "
                         f"{rules.derived(led, setup.jobs, run)}")
        job = setup.jobs[r.job]
        if r.decomposed and any((run, job.stages[0], seq) not in rows for seq in range(r.units)):
            found.append(f"L: run {run} is decomposed without all its rows")
        for a, b in zip(job.stages, job.stages[1:], strict=False):
            for seq in range(r.units):
                it = rows.get((run, a, seq))
                if it is not None and (it.state == "processed") != ((run, b, seq) in rows):
                    found.append(f"L: run {run} {a}/{seq} is {it.state}; {b} row mismatch")
    for it in led.items:
        job = setup.jobs[led.runs[it.run].job]
        if it.effects > 1 and not it.flagged and it.stage not in job.idempotent \
                and it.stage != CLOSE:
            found.append(f"D: {it.run}/{it.stage}/{it.seq} ran its effect twice, never unknown")
        if it.state == "processed" and not it.effects:
            found.append(f"D: {it.run}/{it.stage}/{it.seq} processed without its effect")
        if it.state == "pending" and led.runs[it.run].cancelled:
            found.append(f"L: {it.run}/{it.stage}/{it.seq} pending in a cancelled run: "
                         "nothing will claim it")
    return found


def step_violations(before: Ledger, step: Step) -> list[str]:
    """Every invariant the step from ``before`` breaks: a move out of ``processed`` or
    ``skipped``, out of ``failed`` other than the operator's redrive, or a change of an item's
    state that its chain of recorded moves does not explain."""
    found = []
    chains: dict[int, list[tuple[str, str | None, str, str, int]]] = {}
    for mv in step.moves:
        chains.setdefault(mv[4], []).append(mv)
        name, source, target, actor, _ = mv
        if source in ("processed", "skipped") or \
                (source == "failed" and (name, actor) != ("redrive", "operator")):
            found.append(f"T: {name} by {actor} left {source} for {target} ({step.label})")
    after = step.world.ledger.items
    for i, item in enumerate(after):
        state: str | None = before.items[i].state if i < len(before.items) else None
        for _, source, target, _, _ in chains.get(i, []):
            if source != state:
                found.append(f"a move from {source} applied to a {state} item ({step.label})")
            state = target
        if state != item.state:
            found.append(f"{item.stage}/{item.seq} went {state} -> {item.state} without a "
                         f"move ({step.label})")
    return found
