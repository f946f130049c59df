"""The plan for what a broker task's claim of a limited stage left (``core/rates.py``,
``hold_plan``): held-back messages are due when their bucket can serve them, one after
another at the rate, never all at once."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workledger.core.rates import CAP_WAIT, SHORT_WAIT, HoldPlan, hold_plan

pytestmark = pytest.mark.unit


def test_held_back_items_are_due_one_token_apart_at_a_burst_of_one() -> None:
    plan = hold_plan(3, 0.0, -math.inf, 10.0, 1.0, capped=False)
    assert [n for n, _ in plan.groups] == [1, 1, 1]
    assert [round(w, 6) for _, w in plan.groups] == [0.1, 0.2, 0.3]
    assert plan.horizon == pytest.approx(0.3) and plan.wait == 0


def test_a_bucket_serves_held_back_items_a_burst_at_a_time() -> None:
    plan = hold_plan(12, 0.0, -math.inf, 20.0, 5.0, capped=False)
    assert [n for n, _ in plan.groups] == [5, 5, 2]
    assert [round(w, 6) for _, w in plan.groups] == [0.25, 0.5, 0.6]


def test_the_next_message_held_back_waits_behind_those_held_before_it() -> None:
    first = hold_plan(2, 0.0, -math.inf, 10.0, 1.0, capped=False)
    assert first.horizon is not None
    second = hold_plan(2, 0.0, first.horizon, 10.0, 1.0, capped=False)
    assert [round(w, 6) for _, w in second.groups] == [0.3, 0.4]


def test_a_part_token_counts_and_a_past_horizon_promises_nothing() -> None:
    plan = hold_plan(1, 0.5, -3.0, 10.0, 1.0, capped=False)
    assert [round(w, 6) for _, w in plan.groups] == [0.05]


def test_a_full_cap_holds_everything_a_moment_and_promises_no_refill() -> None:
    assert hold_plan(7, 3.0, 5.0, 10.0, 5.0, capped=True) == HoldPlan(groups=((7, CAP_WAIT),))
    assert hold_plan(7, 7.0, -math.inf, None, 1.0, capped=False).groups == ((7, CAP_WAIT),)


def test_a_held_message_short_by_a_moment_waits_for_its_token_in_place() -> None:
    # held for now, the bucket 0.9 tokens: a hundredth of a second short, no new message
    assert hold_plan(1, 0.9, 2.0, 10.0, 1.0, capped=False, may_wait=True) == HoldPlan(
        wait=pytest.approx(0.01))
    # short by more than its own interval: held again behind the horizon
    late = hold_plan(1, 0.0, 2.0, 1.0, 1.0, capped=False, may_wait=True)
    assert late.wait == 0 and late.groups == ((1, 3.0),)
    # never longer than SHORT_WAIT, however slow the rate
    assert hold_plan(1, 0.5, 0.0, 0.1, 1.0, capped=False, may_wait=True).wait == 0
    assert SHORT_WAIT < 1


@given(n=st.integers(1, 500), tokens=st.floats(0, 0.999), rate=st.floats(0.01, 1e4),
       burst=st.integers(1, 50), horizon=st.floats(-10, 100))
def test_held_back_groups_never_outrun_the_bucket(n: int, tokens: float, rate: float,
                                                   burst: int, horizon: float) -> None:
    """However the items are split, by each group's due time the bucket has refilled, past
    what was promised before, every token of that group and of those before it."""
    plan = hold_plan(n, tokens, horizon, rate, float(burst), capped=False)
    assert sum(k for k, _ in plan.groups) == n
    start = max(horizon, -tokens / rate)
    total = 0
    for k, wait in plan.groups:
        total += k
        assert 1 <= k <= burst
        assert wait >= max(0.001, start + total / rate) - 1e-9
    assert plan.horizon == pytest.approx(start + n / rate)
