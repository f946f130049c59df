"""Every interleaving of a small world, explored exhaustively: the invariants hold in every
reachable state, every quiescent state has each run settled or waiting for a person, and the
moves the model makes are exactly the rows of ``core/states.py`` ``MOVES``.

The world (tests/model/world.py): runs of 3 units through 2 stages, 2 workers (chunks of 2),
1 sweeper, 1 operator and a clock; faults and the operator's actions are bounded by a budget.
Handlers follow a script per unit, chosen so that together they end every way a handler can
(processed, retried, failed, skipped, in doubt) and reach every row of ``MOVES``.

Two runs do not share items, so every invariant checked here is about one run; everything the
other run does reaches this one only as workers, the sweeper, the operator or the fault budget
busy elsewhere, which is one of the interleavings of a world with this run alone. So the
2 runs x 3 units world is checked as each run alone under faults (``verified``, ``plain``),
plus both runs together without faults, where the runs' interleavings themselves are explored.
``WORKLEDGER_MODEL_FULL=1`` adds the larger budgets whose figures README.md reports.
"""

from __future__ import annotations

import os

import pytest

from workledger.core.states import MOVES

from .adapter import JOBS
from .explore import explore
from .world import Budget, Setup

pytestmark = pytest.mark.unit

VERIFIED = {  # run 0 of job verified: a (verify hook), b (idempotent), a closing hook
    (0, "a", 0): ("processed",), (0, "b", 0): ("processed",),
    (0, "a", 1): ("unknown",), (0, "b", 1): ("retry", "processed"),
    (0, "a", 2): ("processed",), (0, "b", 2): ("skipped",),
}
PLAIN = {  # job plain: a (idempotent), b (neither); unit 2 is skipped at decomposition
    (0, "a", 0): ("processed",), (0, "b", 0): ("failed",),
    (0, "a", 1): ("retry", "processed"), (0, "b", 1): ("retry", "processed"),
}
BOTH = {**VERIFIED, **{(1, stage, seq): script for (_, stage, seq), script in PLAIN.items()}}


def verified(budget: Budget) -> Setup:
    return Setup(JOBS, (("verified", 3, frozenset()),), budget=budget, scripts=VERIFIED)


def plain(budget: Budget) -> Setup:
    return Setup(JOBS, (("plain", 3, frozenset({2})),), budget=budget, scripts=PLAIN)


def both(budget: Budget, broker: bool = False) -> Setup:
    return Setup(JOBS, (("verified", 3, frozenset()), ("plain", 3, frozenset({2}))),
                 budget=budget, scripts=BOTH, broker=broker)


def delivered(budget: Budget) -> Setup:
    """Broker tasks beside workers: each item a message names is claimed by identity."""
    return Setup(JOBS, (("plain", 3, frozenset({2})),), budget=budget, scripts=PLAIN,
                 broker=True)


def rows(*names: str, actor: str | None = None) -> set[tuple[str, str | None, str, str]]:
    """Rows of MOVES (all of them when no name is given), made by ``actor`` if given."""
    return {(m.name, m.source and m.source.value, m.target.value, m.actor.value) for m in MOVES
            if (m.name in names or not names) and actor in (None, m.actor.value)}


# (world, budget: lease expiries under a live holder, crashes and stops, operator actions;
#  the MOVES rows it must make)
WORLDS = {
    "verified, a lease expiring under its holder, 2 operator actions": (
        verified, Budget(1, 0, 2),
        rows() - rows("insert") - rows("release") - rows(actor="broker")),
    "verified, a crash or a stop, 2 operator actions": (
        verified, Budget(0, 1, 2), rows("release", "lease_expired", "lease_expired_unknown",
                                        "verify_done", "verify_not_done", "verify_unsure",
                                        "cancel_late")),
    "plain, an expiry and a crash or stop, 2 operator actions": (
        plain, Budget(1, 1, 2), rows("insert", "redrive", "cancel")
        | rows("fail", "release", actor="worker")),
    "broker tasks, a crash or a stop, 1 operator action": (
        delivered, Budget(0, 1, 1), rows(actor="broker")),
    "both runs, no fault, no operator": (
        both, Budget(0, 0, 0), rows("insert", "handoff", "claim", "complete", "skip", "fail",
                                    "retry_later", "outcome_unknown", actor="worker")
        | rows("insert")),
}
FULL = {
    "verified, one of each fault, 1 operator action": (verified, Budget(1, 1, 1), set()),
    "plain, two of each fault, 2 operator actions": (plain, Budget(2, 2, 2), set()),
    "both runs, no fault, 1 operator action": (both, Budget(0, 0, 1), set()),
}


def test_the_worlds_together_make_every_move_of_the_table() -> None:
    assert set().union(*(need for _, _, need in WORLDS.values())) == rows()


@pytest.mark.parametrize("name", [*WORLDS, *(FULL if os.environ.get("WORKLEDGER_MODEL_FULL")
                                             else [])])
def test_every_reachable_state_keeps_the_invariants(name: str) -> None:
    make, budget, need = {**WORLDS, **FULL}[name]
    found = explore(make(budget))
    assert not found.violations, "\n\n".join(found.violations)
    assert found.moves <= rows(), f"moves outside MOVES: {found.moves - rows()}"
    assert need <= found.moves, f"never made: {sorted(need - found.moves, key=str)}"
    assert found.final > 0 and found.states > 1000, found  # it explored something real
    print(f"{name}: {found.states:,} states, {found.transitions:,} transitions, "
          f"{found.final:,} quiescent, depth {found.depth}")
