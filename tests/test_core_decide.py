"""decide(): a handler's outcome becomes one transition; retries back off, capped, with jitter."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workledger.core.outcomes import (
    Failed,
    Permanent,
    Processed,
    Retry,
    RetryLater,
    Skip,
    Skipped,
    Unknown,
    decide,
    outcome_of_exception,
)
from workledger.core.retry import RetryPolicy, backoff_delay
from workledger.core.states import ItemState

pytestmark = pytest.mark.unit

POLICY = RetryPolicy(max_attempts=5, base_delay=2.0, max_delay=60.0, jitter=0.0)

draws = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)
policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(min_value=1, max_value=50),
    # realistic bases: the exponent is capped at 62 doublings, far beyond any max_delay here
    base_delay=st.just(0.0) | st.floats(min_value=0.001, max_value=1000.0),
    max_delay=st.floats(min_value=0.0, max_value=100_000.0),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)


def test_processed_completes_with_its_result_and_no_event() -> None:
    d = decide(Processed('{"ok": true}'), 1, POLICY, 0.5)
    assert d.state is ItemState.PROCESSED
    assert d.move == "complete"
    assert d.result == '{"ok": true}'
    assert (d.error, d.delay, d.event) == (None, None, None)  # happy path: no history row


def test_skipped_ends_skipped_with_its_reason() -> None:
    d = decide(Skipped("not in scope"), 1, POLICY, 0.5)
    assert (d.state, d.move) == (ItemState.SKIPPED, "skip")
    assert d.error == "not in scope"
    assert d.event == "skipped"
    assert d.delay is None


@pytest.mark.parametrize("attempt", [1, 2, 5, 9])
def test_failed_fails_at_once_whatever_the_attempt(attempt: int) -> None:
    d = decide(Failed("account closed"), attempt, POLICY, 0.5)
    assert (d.state, d.move) == (ItemState.FAILED, "fail")
    assert d.error == "account closed"
    assert d.event == "failed"
    assert d.delay is None


def test_unknown_outcome_awaits_repair_with_its_evidence() -> None:
    d = decide(Unknown("timeout after send"), 1, POLICY, 0.5)
    assert (d.state, d.move) == (ItemState.UNKNOWN, "outcome_unknown")
    assert d.error == "timeout after send"
    assert d.event == "unknown"


def test_retry_without_delay_backs_off_exponentially() -> None:
    # base 2 s, no jitter: 2, 4, 8, 16 s after attempts 1..4
    delays = [decide(RetryLater("busy"), a, POLICY, 0.9).delay for a in (1, 2, 3, 4)]
    assert delays == [2.0, 4.0, 8.0, 16.0]
    d = decide(RetryLater("busy"), 1, POLICY, 0.9)
    assert (d.state, d.move) == (ItemState.PENDING, "retry_later")
    assert d.error == "busy"
    assert d.event == "retry_scheduled"


def test_retry_with_explicit_delay_uses_that_delay() -> None:
    d = decide(RetryLater("rate limited", delay=7.5), 2, POLICY, 0.3)
    assert d.state is ItemState.PENDING
    assert d.delay == 7.5


def test_retry_with_negative_delay_is_due_now_not_in_the_past() -> None:
    assert decide(RetryLater("x", delay=-3.0), 1, POLICY, 0.3).delay == 0.0


@pytest.mark.parametrize("delay", [None, 1.0])
def test_retry_at_max_attempts_fails_as_exhausted(delay: float | None) -> None:
    d = decide(RetryLater("busy", delay), 5, POLICY, 0.5)
    assert (d.state, d.move) == (ItemState.FAILED, "fail")
    assert d.error is not None
    assert "exhausted" in d.error and "5 attempts" in d.error and "busy" in d.error
    assert d.delay is None
    assert d.event == "failed"


def test_retry_just_below_max_attempts_is_still_retried() -> None:
    assert decide(RetryLater("busy"), 4, POLICY, 0.5).state is ItemState.PENDING


def test_single_attempt_policy_fails_on_first_retry() -> None:
    d = decide(RetryLater("busy"), 1, RetryPolicy(max_attempts=1), 0.0)
    assert d.state is ItemState.FAILED


@given(policy=policies, attempt=st.integers(min_value=1, max_value=200), draw=draws)
def test_retry_decision_is_pending_until_max_attempts_then_failed(
    policy: RetryPolicy, attempt: int, draw: float
) -> None:
    d = decide(RetryLater("boom"), attempt, policy, draw)
    if attempt < policy.max_attempts:
        assert d.state is ItemState.PENDING
        assert d.delay is not None and 0.0 <= d.delay <= policy.max_delay
    else:
        assert d.state is ItemState.FAILED
        assert d.delay is None


@given(policy=policies, attempt=st.integers(min_value=1, max_value=10_000), draw=draws)
def test_backoff_is_capped_and_within_jitter_bounds(
    policy: RetryPolicy, attempt: int, draw: float
) -> None:
    delay = backoff_delay(attempt, policy, draw)
    full = min(policy.max_delay, policy.base_delay * 2.0 ** min(attempt - 1, 1000))
    assert math.isfinite(delay)
    assert delay <= policy.max_delay + 1e-9
    assert full * (1 - policy.jitter) - 1e-9 <= delay <= full + 1e-9


@given(policy=policies, attempt=st.integers(min_value=1, max_value=100), draw=draws)
def test_backoff_never_shrinks_as_attempts_grow(
    policy: RetryPolicy, attempt: int, draw: float
) -> None:
    assert backoff_delay(attempt + 1, policy, draw) >= backoff_delay(attempt, policy, draw)


def test_backoff_without_jitter_ignores_the_draw() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=60.0, jitter=0.0)
    assert backoff_delay(3, policy, 0.0) == backoff_delay(3, policy, 0.99) == 4.0


def test_backoff_with_full_jitter_spans_zero_to_the_capped_delay() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=10.0, jitter=1.0)
    assert backoff_delay(20, policy, 0.0) == 10.0
    assert backoff_delay(20, policy, 0.5) == 5.0


def test_huge_attempt_numbers_stay_at_the_cap() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=300.0, jitter=0.0)
    assert backoff_delay(10**9, policy, 0.5) == 300.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base_delay": -1.0},
        {"max_delay": -1.0},
        {"jitter": 1.5},
        {"jitter": -0.1},
    ],
)
def test_retry_policy_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_exceptions_classify_into_outcomes() -> None:
    assert outcome_of_exception(Skip("dup")) == Skipped("dup")
    assert outcome_of_exception(Permanent("gone")) == Failed("gone")
    assert outcome_of_exception(Retry("later", delay=3.0)) == RetryLater("later", 3.0)
    assert outcome_of_exception(Retry("later")) == RetryLater("later", None)


def test_unclassified_exception_is_retried_with_its_type_and_message() -> None:
    assert outcome_of_exception(ValueError("bad row")) == RetryLater("ValueError: bad row")
    assert outcome_of_exception(RuntimeError()) == RetryLater("RuntimeError")


def test_decide_refuses_something_that_is_not_an_outcome() -> None:
    with pytest.raises(TypeError):
        decide("processed", 1, POLICY, 0.0)  # type: ignore[arg-type]
