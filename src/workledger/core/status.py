"""Derive a run's state, its unit counters and who moves it next, from ledger facts.

Everything here is computed from item counts and run markers; nothing stored is trusted on
its own (docs/design.md, invariant 7).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from workledger.core.states import TERMINAL, ItemState


class RunState(StrEnum):
    """A run's state, derived by :func:`derive` (never stored), in the order lists show them.
    Str-valued: a member is the very word printed and answered."""

    ACCEPTED = "accepted"  # recorded, not yet decomposed: the decomposer (or sweeper) moves it
    RUNNING = "running"  # workers finish its items
    PAUSED = "paused"  # a person resumes it
    RECOVERY_PENDING = "recovery_pending"  # the sweeper takes back leases; retries fall due
    AWAITING_REPAIR = "awaiting_repair"  # unknown items: the verify hook or a person
    COMPLETED = "completed"  # finished
    COMPLETED_WITH_FAILURES = "completed_with_failures"  # finished, failures tolerated
    FAILED = "failed"  # finished, or its decomposer failed: a person redrives or resubmits
    CANCELLED = "cancelled"  # a person cancelled it


RUN_STATES: tuple[str, ...] = tuple(s.value for s in RunState)  # `runs --state`, the pages

Counts = Mapping[str, Mapping[str, int]]  # stage -> state -> n

# The closing hook is a ledger entry of its own, in this reserved stage; it is not a unit.
CLOSE_STAGE = "@close"
PERMANENT_DECOMPOSITION = "decomposition failed permanently"
# A decomposer that failed this many times is a person's to fix (the sweeper keeps trying, less
# and less often). Each failure is a wl_events row of this kind.
DECOMPOSE_PATIENCE = 3
DECOMPOSITION_FAILED = "decomposition_failed"


def work_counts(counts: Counts) -> dict[str, Mapping[str, int]]:
    """The counts of the job's own stages, without the closing entry."""
    return {stage: states for stage, states in counts.items() if stage != CLOSE_STAGE}


@dataclass(frozen=True)
class RunFacts:
    stages: Sequence[str]  # the job's stages in order; stages seen only in rows are appended
    counts: Counts
    decomposed: bool
    paused: bool = False
    cancelled: bool = False
    error: str | None = None
    expired_leases: int = 0  # claimed items whose lease has run out
    retries_waiting: int = 0  # pending items whose not_before is in the future
    verifying: int = 0  # unknown items awaiting their verify hook (the sweeper asks it)
    decompose_failures: int = 0  # times the decomposer raised, while not decomposed
    tolerate: float | int = 0


@dataclass(frozen=True)
class Units:
    total: int
    processed: int
    failed: int
    skipped: int

    @property
    def finished(self) -> int:
        return self.processed + self.failed + self.skipped


@dataclass(frozen=True)
class Derived:
    state: RunState
    complete: bool
    units: Units
    next: str
    unsettled: int = 0  # items not in a terminal state
    notes: list[str] = field(default_factory=list)


def _n(counts: Counts, stage: str, state: ItemState) -> int:
    return int(counts.get(stage, {}).get(state.value, 0))


def units_of(stages: Sequence[str], counts: Counts) -> Units:
    """Count in units: total is first-stage items; processed means the last stage processed."""
    order = list(stages) + [s for s in counts if s not in stages]
    if not order:
        return Units(0, 0, 0, 0)
    total = sum(counts.get(order[0], {}).values())
    processed = _n(counts, order[-1], ItemState.PROCESSED)
    failed = sum(_n(counts, s, ItemState.FAILED) for s in order)
    skipped = sum(_n(counts, s, ItemState.SKIPPED) for s in order)
    return Units(total, processed, failed, skipped)


def count_differences(stored: Counts, ledger: Counts) -> dict[str, tuple[int, int]]:
    """``{"stage.state": (stored, ledger)}`` wherever the two disagree (0 when absent)."""
    keys = {(st, s) for st, states in stored.items() for s in states}
    keys |= {(st, s) for st, states in ledger.items() for s in states}
    out: dict[str, tuple[int, int]] = {}
    for stage, state in sorted(keys):
        a = stored.get(stage, {}).get(state, 0)
        b = ledger.get(stage, {}).get(state, 0)
        if a != b:
            out[f"{stage}.{state}"] = (a, b)
    return out


def failures_allowed(total: int, tolerate: float | int) -> int:
    """How many failed units a run of ``total`` units may have and still complete."""
    if isinstance(tolerate, bool) or tolerate < 0:
        raise ValueError("tolerate must be a non-negative count or fraction")
    if isinstance(tolerate, float) and tolerate < 1:
        return int(total * tolerate)
    return int(tolerate)


def settledness(stages: Sequence[str], counts: Counts, decomposed: bool) -> tuple[Units, int, bool]:
    """Units, the number of items not yet terminal, and whether the run is complete."""
    own = work_counts(counts)
    units = units_of([s for s in stages if s != CLOSE_STAGE], own)
    unsettled = sum(
        n
        for states in own.values()
        for state, n in states.items()
        if state not in TERMINAL
    )
    return units, unsettled, decomposed and unsettled == 0 and units.finished >= units.total


def finished_state(cancelled: bool, failed: int, total: int,
                   tolerate: float | int) -> RunState:
    """The state of a complete run, from its failed units and the tolerance it runs under (the
    metrics count complete runs by this, in groups, without deriving each)."""
    if cancelled:
        return RunState.CANCELLED
    if failed == 0:
        return RunState.COMPLETED
    if failed <= failures_allowed(total, tolerate):
        return RunState.COMPLETED_WITH_FAILURES
    return RunState.FAILED


def decomposer_needs_person(error: str | None, failures: int) -> bool:
    """A run whose decomposer failed permanently, or kept failing, waits for a person."""
    return (error or "").startswith(PERMANENT_DECOMPOSITION) or (
        error is not None and failures >= DECOMPOSE_PATIENCE)


def _decomposer_next(facts: RunFacts) -> str:
    if decomposer_needs_person(facts.error, facts.decompose_failures):
        return (f"operator: the decomposer failed {facts.decompose_failures} times; fix it, "
                "then `workledger sweep` decomposes the run again")
    return "sweeper"


def derive(facts: RunFacts) -> Derived:
    units, unsettled, complete = settledness(facts.stages, facts.counts, facts.decomposed)
    unknown = sum(_n(facts.counts, s, ItemState.UNKNOWN) for s in work_counts(facts.counts))
    if facts.cancelled:
        state = RunState.CANCELLED
        nxt = "nobody: cancelled" if unsettled == 0 else "workers"
    elif not facts.decomposed and (facts.error or "").startswith(PERMANENT_DECOMPOSITION):
        state = RunState.FAILED
        nxt = "operator: fix the decomposer, then resubmit under a new key"
    elif not facts.decomposed:
        state, nxt = RunState.ACCEPTED, _decomposer_next(facts)
    elif complete:
        state = finished_state(False, units.failed, units.total, facts.tolerate)
        nxt = (f"operator: retry {units.failed} failed items" if state is RunState.FAILED
               else "nobody: complete")
    elif unknown:
        state = RunState.AWAITING_REPAIR
        if unknown > facts.verifying:
            nxt = f"operator: resolve {unknown - facts.verifying} unknown items"
        else:
            nxt = f"sweeper: asks the verify hook of {unknown} items"
    elif facts.paused:
        state, nxt = RunState.PAUSED, "operator: resume"
    elif facts.expired_leases or (facts.retries_waiting and facts.retries_waiting == unsettled):
        state, nxt = RunState.RECOVERY_PENDING, "sweeper" if facts.expired_leases else "workers"
    else:
        state, nxt = RunState.RUNNING, "workers"
    return Derived(state=state, complete=complete, units=units, next=nxt, unsettled=unsettled)
