"""A run's status for a reader: :func:`status_of` is the one place it is computed (for the
CLI, the facade and the sweeper's closing hook), from the projection and the run's markers."""

from __future__ import annotations

from functools import lru_cache

from workledger.core.status import DECOMPOSITION_FAILED, Derived, RunFacts, derive
from workledger.jobs import Job
from workledger.results import RunStatus
from workledger.storage.port import RunRow, Store


def decompose_failures(store: Store, run: RunRow) -> int:
    """How often the run's decomposer raised, while the run is not decomposed (0 otherwise)."""
    if run.decomposed_at is not None or run.error is None:
        return 0
    return len(store.events_list(run.id, kind=DECOMPOSITION_FAILED))


def status_of(store: Store, run: RunRow, job: Job | None) -> RunStatus:
    """``run``'s status from its stage counts, leases and markers (``job``: its definition,
    when loaded, for the order of its stages)."""
    counts = store.run_counts(run.id)
    expired, waiting, verifying = store.run_waits(run.id)
    return _status(run, job, counts, expired, waiting, verifying,
                   decompose_failures(store, run))


def status_of_new(run: RunRow, job: Job, counts: dict[str, dict[str, int]]) -> RunStatus:
    """The status of a run its caller has just recorded and decomposed in one transaction
    (``submit_many``), from the counts of the rows it wrote: no lease, no retry, no failed
    decomposition yet, so nothing to read back. Runs of one shape (10,000 runs of one item)
    share one derivation."""
    shape = tuple((stage, tuple(sorted(states.items()))) for stage, states in counts.items())
    d = _derive_new(tuple(s.name for s in job.stages), shape, _tolerance(run, job),
                    run.decomposed_at is not None)
    return _from(run, counts, d)


@lru_cache(maxsize=64)
def _derive_new(stages: tuple[str, ...], shape: tuple[tuple[str, tuple[tuple[str, int], ...]],
                                                      ...],
                tolerate: float | int, decomposed: bool) -> Derived:
    return derive(RunFacts(stages=stages, counts={st: dict(c) for st, c in shape},
                           decomposed=decomposed, tolerate=tolerate))


def _status(run: RunRow, job: Job | None, counts: dict[str, dict[str, int]], expired: int,
            waiting: int, verifying: int, failures: int) -> RunStatus:
    facts = RunFacts(
        stages=[s.name for s in job.stages] if job else list(counts),
        counts=counts,
        decomposed=run.decomposed_at is not None,
        paused=run.paused_at is not None,
        cancelled=run.cancelled_at is not None,
        error=run.error,
        expired_leases=expired,
        retries_waiting=waiting,
        verifying=verifying,
        decompose_failures=failures,
        tolerate=_tolerance(run, job),
    )
    return _from(run, counts, derive(facts))


def _from(run: RunRow, counts: dict[str, dict[str, int]], d: Derived) -> RunStatus:
    return RunStatus(
        run_id=run.id, job=run.job, key=run.idempotency_key, state=d.state.value,
        total=d.units.total, complete=d.complete, counts=counts,
        processed=d.units.processed, failed=d.units.failed, skipped=d.units.skipped,
        next=d.next, created_at=str(run.created_at),
        decomposed_at=None if run.decomposed_at is None else str(run.decomposed_at),
        completed_at=None if run.completed_at is None else str(run.completed_at),
        error=run.error, priority=run.priority, tenant=run.tenant,
    )


def _tolerance(run: RunRow, job: Job | None) -> float | int:
    """The tolerance the run was submitted under; for runs older than migration 0003, the
    loaded job definition's (0 without one)."""
    if run.tolerate is not None:
        return run.tolerate
    return job.tolerate if job else 0
