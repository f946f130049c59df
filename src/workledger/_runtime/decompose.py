"""Decompose a run's payload into item rows, in batches, before anything is dispatched."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from workledger.core import limits
from workledger.core.limits import text_problem
from workledger.core.outcomes import Item, Permanent, Skip
from workledger.core.states import ItemState
from workledger.core.status import PERMANENT_DECOMPOSITION
from workledger.core.text import Undecodable, Unstorable, json_text, reason_text, safe_text
from workledger.errors import DecompositionFailed
from workledger.jobs import Job
from workledger.storage.port import ItemsInsert, NewItem, RunRow, Store

_BEYOND = 2**62
_SKIPPED = ItemState.SKIPPED.value  # a unit the decomposer skips is inserted skipped


def _key(key: Any) -> str | None:
    return None if key is None else safe_text(str(key))


def to_row(seq: int, unit: Any) -> NewItem:
    """One decomposer output as a row; anything unusable becomes a skipped row, never dropped."""
    if isinstance(unit, Skip):
        return NewItem(seq, _key(unit.key), None, _SKIPPED, reason_text(unit.reason))
    if not isinstance(unit, Item):
        return NewItem(seq, None, None, _SKIPPED,
                       f"decomposer yielded {type(unit).__name__}, not Item or Skip")
    try:
        data = None if unit.data is None else json_text(unit.data)
    except Unstorable as exc:
        return NewItem(seq, _key(unit.key), None, _SKIPPED, f"data {exc}")
    key = _key(unit.key)
    if key is not None and key != str(unit.key):
        return NewItem(seq, key, data, _SKIPPED, "key contains a NUL or invalid character")
    if unit.concurrency_key is None:
        return NewItem(seq, key, data)
    given = unit.concurrency_key
    if isinstance(given, bool) or not isinstance(given, str | int):
        return NewItem(seq, key, data, _SKIPPED, "concurrency key must be text or a whole "
                       f"number, not {type(given).__name__}")
    ckey = str(given)
    problem = text_problem("concurrency key", ckey, limits.CONCURRENCY_KEY_BYTES)
    if problem is not None:
        return NewItem(seq, key, data, _SKIPPED, problem)
    return NewItem(seq, key, data, concurrency_key=ckey)


def _rows(job: Job, payload: Any) -> Iterator[NewItem]:
    assert job.decomposer is not None
    for seq, unit in enumerate(job.decomposer(payload)):
        yield to_row(seq, unit)


class OutputChanged(Exception):
    pass


def _check_same(store: Store, run_id: int, stage: str, chunk: list[NewItem]) -> None:
    """A repeated decomposition must yield the same (seq, key) list as the rows already kept."""
    lo, hi = chunk[0].seq, chunk[-1].seq + 1
    existing = store.items_keys(run_id, stage, lo, hi)
    for row in chunk:
        if row.seq in existing and existing[row.seq] != row.key:
            raise OutputChanged(
                f"seq {row.seq} was key {existing[row.seq]!r}, now {row.key!r}")


def _pull(rows: Iterator[NewItem], batch: int) -> tuple[list[NewItem], Exception | None]:
    """Up to ``batch`` rows, and the decomposer's exception if it raised while producing them."""
    chunk: list[NewItem] = []
    try:
        for row in rows:
            chunk.append(row)
            if len(chunk) >= batch:
                break
    except Exception as exc:  # the user's decomposer failed: keep what it yielded so far
        return chunk, exc
    return chunk, None


def failure_of(error: Exception) -> str:
    """The run's error for a decomposer that raised; ``Permanent`` marks it as one no retry
    can mend (the run fails now instead of being decomposed again)."""
    if isinstance(error, Permanent):
        return f"{PERMANENT_DECOMPOSITION}: {error.reason}"
    return f"decomposer raised {type(error).__name__}: {error}"


def decompose(store: Store, job: Job, run: RunRow, batch: int | None = None, *,
              check_existing: bool = False, actor: str | None = None) -> RunRow:
    """Write every item of ``run`` (existing rows are kept), then mark the run decomposed.

    Memory stays flat: rows are produced lazily and written ``batch`` at a time. If the
    decomposer raises, the rows it yielded so far are written, the error is recorded on the
    run, the run stays ``accepted`` (nothing is claimable) and :class:`DecompositionFailed` is
    raised. With ``check_existing`` (a re-decomposition), a decomposer whose output differs
    from the rows already written marks the run failed permanently instead of adding rows.
    Storage errors propagate unchanged: they are not the decomposer's fault.
    """
    if isinstance(run.payload, Undecodable):  # retained by something else, too deep to read
        _changed(store, run, f"its retained payload cannot be read: {run.payload}", actor,
                 "the run cannot be decomposed")
    first = job.stages[0].name
    size = batch or job.batch_size
    rows = _rows(job, run.payload)
    count = 0
    while True:
        chunk, error = _pull(rows, size)
        if chunk:
            _write(store, run, first, chunk, check_existing, actor)
            count = chunk[-1].seq + 1
        if error is not None:
            message = failure_of(error)
            store.run_record_error(run.id, reason_text(message), actor)
            raise DecompositionFailed(message, run.id) from error
        if len(chunk) < size:
            break
    if check_existing and store.items_keys(run.id, first, count, _BEYOND):
        _changed(store, run, f"it now yields {count} units but more rows were kept", actor)
    return store.run_mark_decomposed(run.id, first)


def _write(store: Store, run: RunRow, stage: str, chunk: list[NewItem], check: bool,
           actor: str | None) -> None:
    if check:
        try:
            _check_same(store, run.id, stage, chunk)
        except OutputChanged as exc:
            _changed(store, run, str(exc), actor)
    store.items_insert_many(ItemsInsert(run.id, stage, chunk))


def _changed(store: Store, run: RunRow, why: str, actor: str | None,
             what: str = "the decomposer's output changed") -> None:
    message = f"{PERMANENT_DECOMPOSITION}: {what}: {why}"
    store.run_record_error(run.id, reason_text(message), actor)
    raise DecompositionFailed(message, run.id)
