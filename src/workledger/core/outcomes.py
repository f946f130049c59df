"""What a handler says, and the one pure function that turns it into a transition.

Handlers signal by returning (success) or raising one of :class:`Retry`, :class:`Permanent` or
:class:`Skip`; any other exception is an unclassified error and is retried. The runtime
converts that into an :data:`Outcome` value and :func:`decide` turns it into a
:class:`Decision` without touching a database, a clock or a random source.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from workledger.core.retry import RetryPolicy, backoff_delay
from workledger.core.states import Actor, ItemState, move
from workledger.core.text import reason_text

# -- what user code raises or yields -------------------------------------------------------


class Item(NamedTuple):
    """One unit yielded by a decomposer: its business identity and a little data.
    (An immutable named tuple: a decomposer makes one per unit, millions per run.)
    ``concurrency_key``: the account, customer or resource the unit acts on; a stage with
    ``max_per_key=N`` has at most N items of one key claimed at once, and the unit's later
    stages keep the key."""

    key: str | int | None = None
    data: Any = None
    concurrency_key: str | int | None = None


class Skip(Exception):  # noqa: N818 - a public, user-facing name
    """Yielded by a decomposer or raised by a handler: the unit ends ``skipped`` with a reason."""

    def __init__(self, reason: str = "skipped", *, key: str | int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.key = key


class Retry(Exception):  # noqa: N818
    """Raised by a handler: try again later (after ``delay`` seconds if given)."""

    def __init__(self, reason: str = "retry requested", *, delay: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay


class Permanent(Exception):  # noqa: N818
    """Raised by a handler: the item fails now, without further attempts."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- outcome values -------------------------------------------------------------------------


@dataclass(frozen=True)
class Processed:
    result: Any = None


@dataclass(frozen=True)
class RetryLater:
    reason: str
    delay: float | None = None
    trace: str | None = None  # the last frames of the exception's traceback, if one was kept


@dataclass(frozen=True)
class Failed:
    reason: str
    trace: str | None = None


@dataclass(frozen=True)
class Skipped:
    reason: str


@dataclass(frozen=True)
class Unknown:
    evidence: str


Outcome = Processed | RetryLater | Failed | Skipped | Unknown


@dataclass(frozen=True)
class Decision:
    """The transition to write for one finished execution."""

    state: ItemState
    move: str  # the name of its row in core.states.MOVES
    result: Any = None
    error: str | None = None
    delay: float | None = None  # seconds until the item may be claimed again (pending only)
    event: str | None = None  # wl_events kind to record, None on the happy path
    trace: str | None = None  # a failure's traceback, kept in the event's detail


def outcome_of_exception(exc: BaseException, trace: str | None = None) -> Outcome:
    """Classify an exception raised by a handler; ``trace`` is its formatted traceback."""
    if isinstance(exc, Skip):
        return Skipped(exc.reason)
    if isinstance(exc, Permanent):
        return Failed(exc.reason, trace)
    if isinstance(exc, Retry):
        return RetryLater(exc.reason, exc.delay, trace)
    text = str(exc)
    return RetryLater(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, None,
                      trace)


# What each outcome does to a claimed item: rows of core.states.MOVES (checked at import).
_COMPLETE, _SKIP, _FAIL, _RETRY, _UNKNOWN = (
    move(name, Actor.WORKER) for name in
    ("complete", "skip", "fail", "retry_later", "outcome_unknown"))


def decide(outcome: Outcome, attempt: int, policy: RetryPolicy, jitter: float) -> Decision:
    """Turn an outcome of execution number ``attempt`` (1-based) into a transition.

    ``jitter`` is a number in [0, 1) drawn by the caller, so this stays deterministic.

    >>> decide(RetryLater("boom"), 5, RetryPolicy(max_attempts=5), 0.5).state
    <ItemState.FAILED: 'failed'>
    """
    decision = _decide(outcome, attempt, policy, jitter)
    if decision.error is not None:
        decision = replace(decision, error=reason_text(decision.error))
    return decision


def _decide(outcome: Outcome, attempt: int, policy: RetryPolicy, jitter: float) -> Decision:
    match outcome:
        case Processed(result):
            return Decision(_COMPLETE.target, _COMPLETE.name, result=result)
        case Skipped(reason):
            return Decision(_SKIP.target, _SKIP.name, error=reason, event="skipped")
        case Failed(reason, trace):
            return Decision(_FAIL.target, _FAIL.name, error=reason, event="failed", trace=trace)
        case Unknown(evidence):
            return Decision(_UNKNOWN.target, _UNKNOWN.name, error=evidence, event="unknown")
        case RetryLater(reason, delay, trace):
            if attempt >= policy.max_attempts:
                why = f"retries exhausted after {attempt} attempts: {reason}"
                return Decision(_FAIL.target, _FAIL.name, error=why, event="failed", trace=trace)
            wait = delay if delay is not None else backoff_delay(attempt, policy, jitter)
            return Decision(_RETRY.target, _RETRY.name, error=reason, delay=max(0.0, wait),
                            event="retry_scheduled", trace=trace)
    raise TypeError(f"not an outcome: {outcome!r}")
