"""Run one handler for one claimed item and turn what happened into a fenced :class:`Finish`."""

from __future__ import annotations

import inspect
import json
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from workledger.core import writes
from workledger.core.outcomes import (
    Decision,
    Failed,
    Outcome,
    Permanent,
    Processed,
    Retry,
    RetryLater,
    Skip,
    decide,
    outcome_of_exception,
)
from workledger.core.states import Actor, ItemState
from workledger.core.text import Undecodable, Unstorable, json_text, reason_text
from workledger.jobs import BatchContext, Context, ItemView, Job, Stage
from workledger.storage.port import ClaimedItem, Finish

_PROCESSED_NONE = Processed(None)  # immutable: one shared value for every handler that returns None

TRACE_LIMIT = 4096  # characters of a failure's traceback kept in its event (the last frames)


def context_for(job: Job, item: ClaimedItem | Any, attempt: int, worker_id: str) -> Context:
    return Context(item.run_id, job.name, item.stage, attempt,
                   f"{item.run_id}/{item.stage}/{item.seq}", worker_id, item.lease_token or 0)


def view_of(item: ClaimedItem | Any) -> ItemView:
    return ItemView(item.id, item.run_id, item.stage, item.seq, item.key, item.data)


def run_handler(
    job: Job, stage: Stage, item: ClaimedItem, attempt: int, worker_id: str,
    call: Callable[[], Any] | None = None,
) -> Outcome:
    """Run ``stage``'s handler (or ``call``) and classify what happened as an outcome."""
    if type(item.data) is Undecodable:  # written by something else, too deep to read back
        return _unreadable(item)
    try:
        if call is not None:
            value = call()
        else:
            value = stage.handler(view_of(item), context_for(job, item, attempt, worker_id))
    except Exception as exc:  # a handler's failure is data, never a worker crash
        return failure_outcome(exc)
    return result_outcome(value)


async def run_handler_async(
    job: Job, stage: Stage, item: ClaimedItem, attempt: int, worker_id: str,
) -> Outcome:
    """:func:`run_handler` for an ``async def`` handler: the same outcomes, awaited. A
    cancellation (its time limit) is not an outcome: it propagates, and the worker has
    already settled the item."""
    if type(item.data) is Undecodable:
        return _unreadable(item)
    try:
        value = await stage.handler(view_of(item), context_for(job, item, attempt, worker_id))
    except Exception as exc:  # CancelledError is a BaseException: it is not caught here
        return failure_outcome(exc)
    return result_outcome(value)


def _unreadable(item: ClaimedItem) -> Outcome:
    return Failed(f"its data cannot be read back: {item.data}")


def failure_outcome(exc: Exception) -> Outcome:
    """What a handler's exception means, with its traceback where one is kept."""
    return outcome_of_exception(exc, trace_of(exc))


def result_outcome(value: Any) -> Outcome:
    """What a handler's return value means: a result to store (or one that cannot be)."""
    if value is None:
        return _PROCESSED_NONE
    try:
        return Processed(json_text(value))
    except Unstorable as exc:
        if inspect.iscoroutine(value):  # a plain function that returned a coroutine
            value.close()  # never awaited, and never warned about at garbage collection
            return Failed("the handler returned a coroutine instead of awaiting it: declare "
                          "it with async def, and the worker awaits it")
        return Failed(f"handler returned a result that cannot be stored: {exc}")


class BatchCall(NamedTuple):
    """One call of a batch handler, before it is made: the outcomes already known (items
    whose data cannot be read back), and what the handler is given for the others."""

    known: list[Outcome | None]  # one per item; None: the handler's to say
    views: list[ItemView]
    ctx: BatchContext | None  # None: nothing left to call the handler for


def batch_call(job: Job, stage: Stage, items: Sequence[ClaimedItem], worker_id: str
               ) -> BatchCall:
    known: list[Outcome | None] = [
        _unreadable(i) if type(i.data) is Undecodable else None for i in items]
    todo = [i for i, o in zip(items, known, strict=True) if o is None]
    if not todo:
        return BatchCall(known, [], None)
    ctx = BatchContext(todo[0].run_id, job.name, stage.name,
                       tuple(i.attempts + 1 for i in todo),
                       tuple(f"{i.run_id}/{i.stage}/{i.seq}" for i in todo),
                       worker_id, todo[0].lease_token or 0)
    return BatchCall(known, [view_of(i) for i in todo], ctx)


def batch_outcomes(call: BatchCall, values: Any = None, error: Exception | None = None
                   ) -> list[Outcome]:
    """Each item's outcome, from what the call returned (or raised): an exception, or a list
    of the wrong length, is every item's outcome."""
    n = len(call.views)
    if error is not None:  # the whole batch failed the same way
        every: list[Outcome] = [failure_outcome(error)] * n
    elif not isinstance(values, list | tuple) or len(values) != n:
        what = (f"{len(values)} entries" if isinstance(values, list | tuple)
                else f"a {type(values).__name__}")
        every = [RetryLater(f"the batch handler returned {what}, not a list of "
                            f"{n} entries, one per item")] * n
    else:
        every = [entry_outcome(v) for v in values]
    it = iter(every)
    return [o if o is not None else next(it) for o in call.known]


def run_batch(job: Job, stage: Stage, items: Sequence[ClaimedItem], worker_id: str
              ) -> list[Outcome]:
    """Run a batch stage's handler once for ``items`` (one run, one stage) and classify each
    entry it returned; an exception, or a list of the wrong length, is every item's outcome."""
    call = batch_call(job, stage, items, worker_id)
    if call.ctx is None:
        return batch_outcomes(call, [])
    try:
        values = stage.handler(call.views, call.ctx)
    except Exception as exc:
        return batch_outcomes(call, error=exc)
    return batch_outcomes(call, values)


async def run_batch_async(job: Job, stage: Stage, items: Sequence[ClaimedItem], worker_id: str
                          ) -> list[Outcome]:
    """:func:`run_batch` for an ``async def`` batch handler."""
    call = batch_call(job, stage, items, worker_id)
    if call.ctx is None:
        return batch_outcomes(call, [])
    try:
        values = await stage.handler(call.views, call.ctx)
    except Exception as exc:  # CancelledError is a BaseException: it is not caught here
        return batch_outcomes(call, error=exc)
    return batch_outcomes(call, values)


async def run_unit_async(job: Job, items: Sequence[ClaimedItem], worker_id: str,
                         stopping: Callable[[], bool]
                         ) -> list[tuple[ClaimedItem, Outcome | None]]:
    """One async task of a chunk: one item, or one batch of a batch stage (tasks are cheap on
    an event loop: items never share one). None: not started, the worker was stopping."""
    if stopping():
        return [(item, None) for item in items]
    stage = job.stage_named(items[0].stage)
    if stage.batch:
        outcomes = await run_batch_async(job, stage, items, worker_id)
        return list(zip(items, outcomes, strict=True))
    item = items[0]
    return [(item, await run_handler_async(job, stage, item, item.attempts + 1, worker_id))]


def entry_outcome(value: Any) -> Outcome:
    """One entry of a batch handler's list: an outcome (``Retry``, ``Permanent``, ``Skip``,
    or any exception: retried) or a result."""
    if isinstance(value, BaseException):
        return outcome_of_exception(value, None)
    return result_outcome(value)


def trace_of(exc: BaseException) -> str | None:
    """The last frames of ``exc``'s traceback (at most :data:`TRACE_LIMIT` characters), for
    an unclassified exception, or for ``Retry``/``Permanent`` raised while handling another
    one; None for a deliberate ``Retry``/``Permanent``/``Skip`` with nothing behind it."""
    if isinstance(exc, Skip) or (isinstance(exc, Retry | Permanent)
                                 and exc.__cause__ is None and exc.__context__ is None):
        return None
    text = "".join(traceback.format_exception(exc))
    if len(text) > TRACE_LIMIT:
        text = "...\n" + text[-(TRACE_LIMIT - 4):]
    return reason_text(text)


def to_finish(
    job: Job, item: ClaimedItem, outcome: Outcome, attempt: int, jitter: float, charge: int,
    actor: Actor = Actor.WORKER,
) -> Finish:
    """The pure decision plus what the finish transaction must also write: its write (state,
    unit counter, event kind) from the constructor of the decision's row (core/writes.py)."""
    if type(outcome) is Processed and not job.full_history:  # the hot path: no event
        nxt, write = job.after_processed(item.stage, actor)
        return Finish(item.id, item.lease_token, write, outcome.result, None, None, charge, nxt)
    stage = job.stage_named(item.stage)
    decision: Decision = decide(outcome, attempt, stage.policy, jitter)
    nxt = job.next_stage(item.stage) if decision.state is ItemState.PROCESSED else None
    write = writes.FINISHED[decision.move](actor, item.stage, nxt is None, job.full_history)
    detail = None
    if write.event is not None:
        facts = {"attempt": attempt, "error": decision.error, "delay": decision.delay}
        if decision.trace is not None:
            facts["traceback"] = decision.trace
        detail = json.dumps(facts)
    return Finish(
        id=item.id, lease_token=item.lease_token, write=write, result=decision.result,
        error=decision.error, delay=decision.delay, charge=charge, next_stage=nxt,
        detail=detail,
    )
