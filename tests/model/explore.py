"""Depth-first search of every state a :class:`world.Setup` can reach: the invariants are
checked in each state and on each step, every move made is recorded (to compare with
``MOVES``), and every state where nothing can happen any more must have every run settled or
waiting for a person (check V: no work is left that nobody will do).

Visited states are kept as their hashes only (hash compaction, as SPIN's bitstate search
does): a collision could hide a state, never invent a violation, and at a few million states
of 64-bit hashes one is very unlikely. The path to the current state is on the stack, so a
violation comes with the steps that lead to it. States are canonical (:func:`canonical`), so
two interleavings that reach the same ledger and the same actors' memories meet.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from . import world
from .ledger import CLOSE, TERMINAL
from .world import Setup, Step, World


@dataclass
class Explored:
    states: int = 0
    transitions: int = 0
    final: int = 0  # states where nothing can happen any more
    depth: int = 0
    moves: set[tuple[str, str | None, str, str]] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)  # the first of each kind, with a trace


def explore(setup: Setup, limit: int = 10_000_000) -> Explored:
    out = Explored()
    kinds: set[str] = set()
    start = canonical(setup.initial())
    seen = {hash(start)}
    path: list[str] = []
    stack: list[tuple[World, Iterator[Step]]] = [(start, world.successors(setup, start))]
    stepped = [False]
    while stack:
        w, steps = stack[-1]
        step = next(steps, None)
        if step is None:
            if not stepped[-1]:
                out.final += 1
                why = unsettled(setup, w)
                if why:
                    _report(out, kinds, f"V: {why}", path)
            stack.pop()
            stepped.pop()
            if path:
                path.pop()
            continue
        stepped[-1] = True
        out.transitions += 1
        out.moves.update(mv[:4] for mv in step.moves)
        nxt = canonical(step.world)
        for v in world.step_violations(w.ledger, step):
            _report(out, kinds, v, [*path, step.label])
        key = hash(nxt)
        if key in seen:
            continue
        seen.add(key)
        for v in world.state_violations(setup, nxt):
            _report(out, kinds, v, [*path, step.label])
        out.states += 1
        if out.states >= limit:
            out.violations.append(f"more than {limit} states: the world is too big to explore")
            return out
        path.append(step.label)
        out.depth = max(out.depth, len(path))
        stack.append((nxt, world.successors(setup, nxt)))
        stepped.append(False)
    return out


def _report(out: Explored, kinds: set[str], violation: str, path: list[str]) -> None:
    kind = re.sub(r"\d+", "N", violation.split("\n")[0])
    if kind not in kinds:
        kinds.add(kind)
        out.violations.append(f"{violation}\n  after: {' / '.join(path)}")


def unsettled(setup: Setup, w: World) -> str | None:
    """Why a run is not settled in a state where no actor can move (None if every run is).
    Settled: decomposed (or cancelled) with every item terminal, unknown or failed (a person's),
    or pending in a paused run (a person resumes it), and its closing entry done."""
    led = w.ledger
    for run, r in enumerate(led.runs):
        if not r.decomposed and not r.cancelled:
            return f"run {run} never decomposed"
        for it in led.items:
            if it.run == run and it.state == "claimed":
                return f"run {run}: {it.stage}/{it.seq} left claimed"
            if it.run == run and it.state == "pending" and not r.paused:
                return f"run {run}: {it.stage}/{it.seq} left pending"
        job = setup.jobs[r.job]
        close = [it for it in led.items if it.run == run and it.stage == CLOSE]
        work_done = all(it.state in TERMINAL for it in led.items
                        if it.run == run and it.stage != CLOSE)
        if job.closing and work_done and not r.cancelled and not r.paused and \
                not any(it.state in TERMINAL | {"unknown"} for it in close):
            return f"run {run}: complete, its closing hook never ran"
    return None


# -- canonical states -----------------------------------------------------------------------------


def canonical(w: World) -> World:
    """Tokens renumbered by first use; a token no claimed item carries any more is dead (-1),
    since nothing it guards can ever match it again; an unclaimed item's token is 0."""
    names: dict[int, int] = {}
    for it in w.ledger.items:
        if it.state == "claimed":
            names.setdefault(it.token, len(names) + 1)

    def name(t: int) -> int:
        return names.get(t, -1)

    items = tuple(it._replace(token=name(it.token)) if it.state == "claimed"
                  else (it._replace(token=0) if it.token else it) for it in w.ledger.items)
    workers = tuple(wk if wk.run < 0 else wk._replace(
        token=name(wk.token), outcomes=tuple(f._replace(token=name(f.token))
                                             for f in wk.outcomes)) for wk in w.workers)
    workers = tuple(sorted(workers))  # the workers are alike: which is which does not matter
    closer = w.closer if w.closer.run < 0 else w.closer._replace(token=name(w.closer.token))
    led = w.ledger._replace(items=items, next_token=len(names) + 1)
    return w._replace(ledger=led, workers=workers, closer=closer)
