"""Reconcile: derive a run's counters from its items and repair the stored projection."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from workledger.core.status import count_differences, settledness
from workledger.storage.port import Projection, Reconciled, RunRow, Store

DeriveFn = Callable[[RunRow, dict[str, dict[str, int]]], Projection]


def derive_projection(stages: Sequence[str]) -> DeriveFn:
    def derive(run: RunRow, counts: dict[str, dict[str, int]]) -> Projection:
        units, _unsettled, complete = settledness(stages, counts, run.decomposed_at is not None)
        return Projection(units.total, units.processed, units.failed, units.skipped, complete)

    return derive


def reconcile(
    store: Store, run_id: int, stages: Sequence[str], *, dry_run: bool, actor: str = "operator"
) -> Reconciled:
    """Compare the stored counters with the ledger; without ``dry_run`` repair them."""
    return store.run_reconcile(run_id, derive_projection(stages), not dry_run, actor)


def differences(r: Reconciled) -> dict[str, tuple[object, object]]:
    """``{field: (stored, derived)}`` for every counter that disagrees: the run's unit counters,
    then each ``stage.state`` count of ``wl_stage_counts``."""
    found: dict[str, tuple[object, object]] = {
        name: (getattr(r.stored, name), getattr(r.derived, name))
        for name in ("total", "processed", "failed", "skipped", "complete")
        if getattr(r.stored, name) != getattr(r.derived, name)
    }
    found.update(count_differences(r.stored_counts, r.ledger_counts))
    return found
