"""A model of the ledger in plain Python: what each storage transaction does to runs and items.

Every function takes an immutable :class:`Ledger` and returns a new one, so a state can be
hashed and explored (tests/model/world.py) or stepped next to the real adapters
(tests/model/test_model_against_adapters.py). Each function mirrors one port method of
``storage/base.py`` (or one runtime action over it) and nothing else: guards, fencing, the
run's unit counters, hand-offs, and a cancel winning over late finishes. Every change of an
item's state goes through :func:`_moved`, which looks the move up in ``core/states.py``
``MOVES`` and records it, so the model can make no move the table lacks.

tests/model/settles.py holds the settles, the run markers, the closing entry and the
projection. Left out on purpose: times (a retry's backoff; a lease is live until
:func:`expire`), the items' data and results, and events other than those a later step reads.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from workledger.core.states import Actor, ItemState, Move, move

CLOSE = "@close"
TERMINAL = frozenset({"processed", "failed", "skipped"})
# the class of wl_items.error that later steps read (a suspect starts with "lease_expired")
SUSPECT = frozenset({"reclaimed", "awaiting_verify", "outcome_unknown"})
OUTCOMES = {"processed": "processed", "retry": "pending", "failed": "failed",
            "skipped": "skipped", "unknown": "unknown"}


@dataclass(frozen=True)
class Job:
    name: str
    stages: tuple[str, ...]
    idempotent: frozenset[str]
    verify: frozenset[str]
    closing: bool
    max_attempts: int = 2

    def next_stage(self, stage: str) -> str | None:
        if stage == CLOSE:
            return None
        i = self.stages.index(stage)
        return self.stages[i + 1] if i + 1 < len(self.stages) else None

    def declared(self, stage: str) -> tuple[str, str]:
        """Where an expired lease of ``stage`` goes, and the reason it leaves (sweeper.py)."""
        if stage == CLOSE or stage in self.idempotent:
            return "pending", "reclaimed"
        if stage in self.verify:
            return "unknown", "awaiting_verify"
        return "unknown", "outcome_unknown"

    def all_stages(self) -> tuple[str, ...]:
        return self.stages + ((CLOSE,) if self.closing else ())


class Item(NamedTuple):
    run: int
    stage: str
    seq: int
    state: str = "pending"
    attempts: int = 0
    token: int = 0
    live: bool = False  # claimed under a lease that has not expired
    started: bool = False  # started_at is set (under the current claim)
    reason: str = ""  # the class of wl_items.error
    effects: int = 0  # handler executions that performed the effect (saturates at 2)
    flagged: bool = False  # has been unknown: a repeated effect is allowed (check D)


class Run(NamedTuple):
    job: str
    units: int
    decomposed: bool = False
    paused: bool = False
    cancelled: bool = False
    total: int = 0
    processed: int = 0
    failed: int = 0
    skipped: int = 0
    completed: bool = False


class Ledger(NamedTuple):
    runs: tuple[Run, ...] = ()
    items: tuple[Item, ...] = ()  # in id order: item id = index + 1
    next_token: int = 1


# (move, from, to, actor, item index) for every move one step makes, in order
Moves = list[tuple[str, str | None, str, str, int]]


@functools.cache
def _row(name: str, actor: str, target: str) -> Move:
    """The row of MOVES for this move (``IllegalTransition`` when the table has none)."""
    return move(name, Actor(actor), ItemState(target))


def _moved(items: list[Item], moves: Moves, i: int, name: str, actor: str, target: str,
           **changes: object) -> None:
    """Change ``items[i]`` by the move ``name``; fails if MOVES has no such row."""
    row = _row(name, actor, target)
    source = items[i].state
    if row.source is not None and row.source.value != source:
        raise AssertionError(f"{name} moves from {row.source.value}, not {source}")
    moves.append((name, source, target, actor, i))
    items[i] = items[i]._replace(state=target, **changes)


def _inserted(items: list[Item], moves: Moves, item: Item, name: str, actor: str) -> None:
    _row(name, actor, item.state)
    moves.append((name, None, item.state, actor, len(items)))
    items.append(item)


def find(ledger: Ledger, run: int, stage: str, seq: int) -> int | None:
    for i, it in enumerate(ledger.items):
        if it.run == run and it.stage == stage and it.seq == seq:
            return i
    return None


# -- runs: submit and decompose -------------------------------------------------------------


def submit(ledger: Ledger, job: str, units: int) -> Ledger:
    return ledger._replace(runs=ledger.runs + (Run(job, units),))


def decompose_insert(ledger: Ledger, jobs: dict[str, Job], run: int,
                     skip: frozenset[int] = frozenset(), actor: str = "decomposer"
                     ) -> tuple[Ledger, Moves]:
    """Every first-stage row, ON CONFLICT DO NOTHING (``items_insert_many``); the new rows
    count in ``total`` and their skips in ``skipped`` at once, not only at the mark."""
    r, moves, items = ledger.runs[run], [], list(ledger.items)
    first = jobs[r.job].stages[0]
    for seq in range(r.units):
        if find(ledger, run, first, seq) is None:
            state = "skipped" if seq in skip else "pending"
            _inserted(items, moves, Item(run, first, seq, state,
                                         reason="skipped" if seq in skip else ""),
                      "insert", "decomposer")
    ledger = ledger._replace(items=tuple(items))
    if not moves:  # nothing new: the adapter writes no counter
        return ledger, moves
    r = _complete_units(r._replace(total=r.total + len(moves)),
                        skipped=sum(mv[2] == "skipped" for mv in moves))
    return _cancel_wins(_run(ledger, run, r), run, actor, moves)


def decompose_mark(ledger: Ledger, jobs: dict[str, Job], run: int) -> Ledger:
    """``run_mark_decomposed``: total from the first stage, skipped from every skipped row."""
    r = ledger.runs[run]
    mine = [it for it in ledger.items if it.run == run]
    first = jobs[r.job].stages[0]
    open_rows = any(it.state not in TERMINAL for it in mine)
    r = r._replace(decomposed=True, total=sum(it.stage == first for it in mine),
                   skipped=sum(it.state == "skipped" for it in mine),
                   completed=not open_rows)
    return _run(ledger, run, r)


def _run(ledger: Ledger, run: int, r: Run) -> Ledger:
    runs = list(ledger.runs)
    runs[run] = r
    return ledger._replace(runs=tuple(runs))


def _complete_units(r: Run, processed: int = 0, failed: int = 0, skipped: int = 0) -> Run:
    """``run_add_units``: the counters, and completion set or cleared from them."""
    r = r._replace(processed=r.processed + processed, failed=r.failed + failed,
                   skipped=r.skipped + skipped)
    return r._replace(completed=r.decomposed and r.processed + r.failed + r.skipped >= r.total)


# -- claims and leases ------------------------------------------------------------------------


def claimable(ledger: Ledger, run: int) -> bool:
    r = ledger.runs[run]
    return r.decomposed and not r.paused and not r.cancelled


def claim(ledger: Ledger, run: int, limit: int, actor: str
          ) -> tuple[Ledger, int, list[int], Moves]:
    """``items_claim``: the first ``limit`` pending items of the run, one fresh token."""
    token, moves, items = ledger.next_token, [], list(ledger.items)
    taken: list[int] = []
    if claimable(ledger, run):
        for i, it in enumerate(items):
            if len(taken) < limit and it.run == run and it.state == "pending":
                _moved(items, moves, i, "claim", actor, "claimed", token=token, live=True,
                       started=False)
                taken.append(i)
    return ledger._replace(items=tuple(items), next_token=token + 1), token, taken, moves


def claim_identity(ledger: Ledger, run: int, stage: str, seqs: list[int], actor: str = "broker"
                   ) -> tuple[Ledger, int, list[int], Moves]:
    """``items_claim_by_identity``: of the items a message names (one run, one stage, some
    seqs), those still pending in a claimable run, under one fresh token."""
    token, moves, items = ledger.next_token, [], list(ledger.items)
    taken: list[int] = []
    if claimable(ledger, run):
        for i, it in enumerate(items):
            if it.run == run and it.stage == stage and it.seq in seqs \
                    and it.state == "pending" and it.stage != CLOSE:
                _moved(items, moves, i, "claim", actor, "claimed", token=token, live=True,
                       started=False)
                taken.append(i)
    if not taken:
        return ledger, token, taken, moves  # a claim that finds nothing takes no token
    return ledger._replace(items=tuple(items), next_token=token + 1), token, taken, moves


def _held(it: Item, token: int) -> bool:
    return it.state == "claimed" and it.token == token


def mark_started(ledger: Ledger, idxs: list[int], token: int, charge: int
                 ) -> tuple[Ledger, list[int]]:
    items, started = list(ledger.items), []
    for i in idxs:
        if _held(items[i], token):
            items[i] = items[i]._replace(started=True, attempts=items[i].attempts + charge)
            started.append(i)
    return ledger._replace(items=tuple(items)), started


def release(ledger: Ledger, idxs: list[int], token: int) -> tuple[Ledger, Moves]:
    """``items_release``: unstarted items back to pending (the run's cancel not checked)."""
    items, moves = list(ledger.items), []
    for i in idxs:
        if _held(items[i], token):
            _moved(items, moves, i, "release", "worker", "pending", live=False)
    return _cancel_wins(ledger._replace(items=tuple(items)), idxs and items[idxs[0]].run,
                        "worker", moves) if moves else (ledger, moves)


def expire(ledger: Ledger, token: int) -> Ledger:
    """The clock: every lease of ``token`` runs out."""
    items = tuple(it._replace(live=False) if _held(it, token) else it for it in ledger.items)
    return ledger._replace(items=items)


def reclaim(ledger: Ledger, jobs: dict[str, Job], job: str, stage: str,
            actor: str = "sweeper") -> tuple[Ledger, Moves]:
    """``leases_reclaim_expired`` for one job and stage: by the stage's declaration, and back
    to pending whatever it says when the handler never started."""
    to, reason = jobs[job].declared(stage)
    items, moves = list(ledger.items), []
    for i, it in enumerate(items):
        if it.state == "claimed" and not it.live and it.stage == stage \
                and ledger.runs[it.run].job == job:
            target = to if it.started else "pending"
            why = "not_started" if not it.started and to != "pending" else reason
            name = "lease_expired" if target == "pending" else "lease_expired_unknown"
            _moved(items, moves, i, name, actor, target, reason=why,
                   flagged=it.flagged or target == "unknown")
    ledger = ledger._replace(items=tuple(items))
    for run in sorted({items[mv[4]].run for mv in moves if mv[2] == "pending"}):
        ledger, moves = _cancel_wins(ledger, run, actor, moves)
    return ledger, moves


# -- outcomes: finish and settle ----------------------------------------------------------------


class Finish(NamedTuple):
    idx: int
    token: int
    outcome: str  # processed | retry | failed | skipped | unknown
    charge: int = 1
    reason: str = ""  # the reason class it writes ("" for processed)


def finish(ledger: Ledger, jobs: dict[str, Job], run: int, finishes: list[Finish],
           actor: str, start: list[int] = (), start_token: int = 0  # type: ignore[assignment]
           ) -> tuple[Ledger, list[int], list[int], list[int], Moves]:
    """``items_finish_if_leased``: fenced outcomes, the starts recorded with them, hand-offs,
    unit counters, and a cancel that landed meanwhile skipping what is left pending.
    Returns the ledger, the applied and stale ids (indexes), the started ones, the moves."""
    items, moves = list(ledger.items), []
    r = ledger.runs[run]
    job = jobs[r.job]
    applied, stale, handoffs = [], [], []
    units = {"processed": 0, "failed": 0, "skipped": 0}
    name = {"processed": "complete", "retry": "retry_later", "failed": "fail",
            "skipped": "skip", "unknown": "outcome_unknown"}
    for f in finishes:
        it = items[f.idx]
        if not _held(it, f.token):
            stale.append(f.idx)
            continue
        target = OUTCOMES[f.outcome]
        _moved(items, moves, f.idx, name[f.outcome], actor, target, live=False,
               attempts=it.attempts + f.charge, reason=f.reason,
               flagged=it.flagged or target == "unknown")
        applied.append(f.idx)
        nxt = job.next_stage(it.stage) if target == "processed" else None
        if nxt:
            handoffs.append((f.idx, nxt))
        elif it.stage != CLOSE and target in units:
            units[target] += 1
    ledger = ledger._replace(items=tuple(items))
    ledger, started = mark_started(ledger, list(start), start_token, 0)
    ledger, more = _write_plan(ledger, run, handoffs, units, actor)
    return ledger, applied, stale, started, moves + more


def _write_plan(ledger: Ledger, run: int, handoffs: list[tuple[int, str]],
                units: dict[str, int], actor: str) -> tuple[Ledger, Moves]:
    """What a finish or a settle writes besides the guarded update (base.py ``_write_plan``)."""
    items, moves = list(ledger.items), []
    for idx, stage in handoffs:
        src = items[idx]
        if find(ledger._replace(items=tuple(items)), src.run, stage, src.seq) is None:
            _inserted(items, moves, Item(src.run, stage, src.seq), "handoff", actor)
    ledger = _run(ledger._replace(items=tuple(items)), run,
                  _complete_units(ledger.runs[run], **units))
    return _cancel_wins(ledger, run, actor, moves)


def _cancel_wins(ledger: Ledger, run: int, actor: str, moves: Moves) -> tuple[Ledger, Moves]:
    """base.py ``_cancel_wins``: in a cancelled run, what a write left pending is skipped."""
    if not ledger.runs[run].cancelled:
        return ledger, moves
    ledger, late = _cancel_pending(ledger, run, "cancel_late", actor)
    return ledger, moves + late


def _cancel_pending(ledger: Ledger, run: int, name: str, actor: str) -> tuple[Ledger, Moves]:
    """``items_cancel_pending`` and the skipped units it adds (the closing entry is no unit)."""
    items, moves = list(ledger.items), []
    for i, it in enumerate(items):
        if it.run == run and it.state == "pending":
            _moved(items, moves, i, name, actor, "skipped", reason="cancelled")
    units = sum(1 for mv in moves if items[mv[4]].stage != CLOSE)
    ledger = ledger._replace(items=tuple(items))
    return _run(ledger, run, _complete_units(ledger.runs[run], skipped=units)), moves
