"""Decompose a run's payload into item rows, in batches, before anything is dispatched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import islice
from typing import Any

from workledger.core.outcomes import Item, Skip
from workledger.errors import DecompositionFailed
from workledger.runtime.jobs import Job
from workledger.storage.port import ItemsInsert, NewItem, RunRow, Store

BATCH = 5000


def _key(key: Any) -> str | None:
    return None if key is None else str(key)


def to_row(seq: int, unit: Any) -> NewItem:
    """One decomposer output as a row; anything unusable becomes a skipped row, never dropped."""
    if isinstance(unit, Skip):
        return NewItem(seq, _key(unit.key), None, "skipped", unit.reason)
    if not isinstance(unit, Item):
        return NewItem(seq, None, None, "skipped",
                       f"decomposer yielded {type(unit).__name__}, not Item or Skip")
    try:
        data = None if unit.data is None else json.dumps(unit.data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return NewItem(seq, _key(unit.key), None, "skipped", f"data is not JSON-serialisable: {exc}")
    return NewItem(seq, _key(unit.key), data)


def _rows(job: Job, payload: Any) -> Iterator[NewItem]:
    assert job.decomposer is not None
    for seq, unit in enumerate(job.decomposer(payload)):
        yield to_row(seq, unit)


def decompose(store: Store, job: Job, run: RunRow, batch: int = BATCH) -> RunRow:
    """Write every item of ``run`` (existing rows are kept), then mark the run decomposed.

    Memory stays flat: rows are produced lazily and written ``batch`` at a time. If the
    decomposer raises, the error is recorded on the run, its rows so far are kept, the run
    stays ``accepted`` (nothing is claimable) and :class:`DecompositionFailed` is raised.
    """
    first = job.stages[0].name
    rows = _rows(job, run.payload)
    try:
        while chunk := list(islice(rows, batch)):
            store.items_insert_many(ItemsInsert(run.id, first, chunk))
    except Exception as exc:
        message = f"decomposer raised {type(exc).__name__}: {exc}"
        store.run_record_error(run.id, message)
        raise DecompositionFailed(message, run.id) from exc
    return store.run_mark_decomposed(run.id, first)
