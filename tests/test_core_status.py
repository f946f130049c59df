"""derive(): a run's state and unit counters come from its item counts and markers (invariant 7)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workledger.core.status import RunFacts, Units, derive, failures_allowed, units_of

pytestmark = pytest.mark.unit

ONE = ["apply"]
TWO = ["generate", "deliver"]
COMPLETE_STATES = {"completed", "completed_with_failures", "failed"}


def facts(counts: dict[str, dict[str, int]], stages: list[str] = ONE, **kw: Any) -> RunFacts:
    kw.setdefault("decomposed", True)
    return RunFacts(stages=stages, counts=counts, **kw)


# -- states ----------------------------------------------------------------------------------


def test_undecomposed_run_is_accepted_and_owned_by_the_sweeper() -> None:
    d = derive(facts({"apply": {"pending": 3}}, decomposed=False))
    assert d.state == "accepted"
    assert d.complete is False
    assert d.next == "sweeper"


def test_undecomposed_run_is_not_complete_even_if_its_rows_so_far_are_terminal() -> None:
    d = derive(facts({"apply": {"processed": 3}}, decomposed=False, error="decomposer raised"))
    assert d.state == "accepted"
    assert d.complete is False


def test_decomposed_run_with_pending_work_is_running_for_workers() -> None:
    d = derive(facts({"apply": {"pending": 2, "claimed": 1, "processed": 4}}))
    assert d.state == "running"
    assert d.next == "workers"
    assert d.complete is False
    assert d.unsettled == 3
    assert d.units == Units(total=7, processed=4, failed=0, skipped=0)


def test_paused_run_is_paused_until_an_operator_resumes_it() -> None:
    d = derive(facts({"apply": {"pending": 2, "processed": 1}}, paused=True))
    assert d.state == "paused"
    assert "resume" in d.next
    assert d.complete is False


def test_run_with_expired_leases_is_recovery_pending_for_the_sweeper() -> None:
    d = derive(facts({"apply": {"claimed": 2, "pending": 1}}, expired_leases=2))
    assert d.state == "recovery_pending"
    assert d.next == "sweeper"


def test_run_whose_only_remaining_items_wait_for_a_retry_is_recovery_pending() -> None:
    d = derive(facts({"apply": {"pending": 2, "processed": 5}}, retries_waiting=2))
    assert d.state == "recovery_pending"
    assert d.next == "workers"


def test_run_with_ready_work_besides_waiting_retries_is_running() -> None:
    d = derive(facts({"apply": {"pending": 3, "processed": 5}}, retries_waiting=2))
    assert d.state == "running"


def test_run_with_an_unknown_item_awaits_repair_by_a_person() -> None:
    d = derive(facts({"apply": {"unknown": 1, "processed": 5, "pending": 2}}))
    assert d.state == "awaiting_repair"
    assert "resolve" in d.next and "1" in d.next
    assert d.complete is False


def test_unknown_item_in_a_later_stage_also_awaits_repair() -> None:
    d = derive(
        facts({"generate": {"processed": 2}, "deliver": {"unknown": 1, "processed": 1}}, stages=TWO)
    )
    assert d.state == "awaiting_repair"


def test_all_processed_is_completed() -> None:
    d = derive(facts({"apply": {"processed": 10}}))
    assert d.state == "completed"
    assert d.complete is True
    assert d.unsettled == 0
    assert d.next.startswith("nobody")


def test_all_skipped_is_completed() -> None:
    d = derive(facts({"apply": {"skipped": 4}}))
    assert (d.state, d.complete) == ("completed", True)


@pytest.mark.parametrize(
    ("tolerate", "failed", "state"),
    [
        (0.1, 10, "completed_with_failures"),  # a fraction: 10% of 100
        (0.1, 11, "failed"),
        (3, 3, "completed_with_failures"),  # a count
        (3, 4, "failed"),
        (0, 1, "failed"),  # the default tolerates nothing
    ],
)
def test_failures_within_tolerance_complete_with_failures_and_over_it_fail(
    tolerate: float | int, failed: int, state: str
) -> None:
    d = derive(facts({"apply": {"processed": 100 - failed, "failed": failed}}, tolerate=tolerate))
    assert d.state == state
    assert d.complete is True
    assert d.units.failed == failed


def test_failed_run_names_the_redrive_as_its_way_back() -> None:
    d = derive(facts({"apply": {"processed": 1, "failed": 2}}))
    assert d.state == "failed"
    assert "retry" in d.next and "2" in d.next


def test_cancelled_run_is_cancelled_whatever_its_items() -> None:
    d = derive(facts({"apply": {"skipped": 3, "processed": 2}}, cancelled=True))
    assert d.state == "cancelled"
    assert d.next.startswith("nobody")
    still_settling = derive(facts({"apply": {"claimed": 1, "skipped": 3}}, cancelled=True))
    assert still_settling.state == "cancelled"
    assert still_settling.unsettled == 1


def test_two_stage_run_is_not_complete_while_last_stage_rows_are_missing() -> None:
    d = derive(facts({"generate": {"processed": 4}}, stages=TWO))
    assert d.complete is False
    assert d.state not in COMPLETE_STATES
    assert d.units.processed == 0


def test_two_stage_run_completes_when_every_unit_ended_in_its_last_stage() -> None:
    counts = {"generate": {"processed": 3, "failed": 1}, "deliver": {"processed": 3}}
    d = derive(facts(counts, stages=TWO, tolerate=1))
    assert d.state == "completed_with_failures"
    assert d.complete is True
    assert d.units == Units(total=4, processed=3, failed=1, skipped=0)


@given(
    pending=st.integers(0, 5),
    claimed=st.integers(0, 5),
    unknown=st.integers(0, 5),
    processed=st.integers(0, 50),
    failed=st.integers(0, 5),
    skipped=st.integers(0, 5),
    paused=st.booleans(),
    expired=st.integers(0, 3),
)
def test_run_is_complete_exactly_when_every_item_is_terminal(
    pending: int,
    claimed: int,
    unknown: int,
    processed: int,
    failed: int,
    skipped: int,
    paused: bool,
    expired: int,
) -> None:
    counts = {
        "apply": {
            "pending": pending,
            "claimed": claimed,
            "unknown": unknown,
            "processed": processed,
            "failed": failed,
            "skipped": skipped,
        }
    }
    d = derive(facts(counts, paused=paused, expired_leases=expired, tolerate=0.5))
    settled = pending + claimed + unknown == 0
    assert d.complete is settled
    assert d.unsettled == pending + claimed + unknown
    assert (d.state in COMPLETE_STATES) is settled


# -- units -----------------------------------------------------------------------------------


def test_units_of_two_stages_count_units_not_rows() -> None:
    counts = {
        "generate": {"processed": 7, "failed": 2, "skipped": 1},
        "deliver": {"processed": 5, "failed": 1, "skipped": 1},
    }
    assert units_of(TWO, counts) == Units(total=10, processed=5, failed=3, skipped=2)


def test_units_follow_the_job_stage_order_not_the_counts_order() -> None:
    counts = {"deliver": {"processed": 2}, "generate": {"processed": 3, "pending": 1}}
    assert units_of(TWO, counts) == Units(total=4, processed=2, failed=0, skipped=0)


def test_stages_seen_only_in_rows_are_counted_after_the_known_ones() -> None:
    counts = {"generate": {"processed": 2}, "legacy": {"processed": 1}}
    assert units_of(["generate"], counts) == Units(total=2, processed=1, failed=0, skipped=0)
    assert units_of([], {"apply": {"processed": 3}}) == Units(3, 3, 0, 0)


def test_units_of_nothing_are_zero() -> None:
    assert units_of([], {}) == Units(0, 0, 0, 0)
    assert units_of(ONE, {}) == Units(0, 0, 0, 0)


def test_finished_units_add_processed_failed_and_skipped() -> None:
    assert Units(total=9, processed=4, failed=2, skipped=1).finished == 7


# -- tolerance -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "tolerate", "allowed"),
    [(100, 0.1, 10), (95, 0.1, 9), (5, 0.5, 2), (10, 0.0, 0), (10, 3, 3), (10, 0, 0), (10, 2.0, 2)],
)
def test_failures_allowed_by_fraction_or_count(
    total: int, tolerate: float | int, allowed: int
) -> None:
    assert failures_allowed(total, tolerate) == allowed


@pytest.mark.parametrize("tolerate", [-1, -0.1, True, False])
def test_failures_allowed_refuses_negative_or_boolean_tolerance(tolerate: Any) -> None:
    with pytest.raises(ValueError):
        failures_allowed(10, tolerate)


# -- the state words: one enum each, every list derived -----------------------------------------


def test_the_state_lists_keep_their_words_and_order() -> None:
    """Str-valued enums, so what `items --state`, `runs --state`, the pages and the JSON say is
    byte for byte what it was when these lists were written out by hand."""
    from workledger.core.states import ITEM_STATES, ItemState
    from workledger.core.status import RUN_STATES, RunState

    assert ITEM_STATES == ("pending", "claimed", "unknown", "processed", "failed", "skipped")
    assert RUN_STATES == ("accepted", "running", "paused", "recovery_pending", "awaiting_repair",
                          "completed", "completed_with_failures", "failed", "cancelled")
    assert all(isinstance(s, str) and f"{s}" == s.value for s in [*ItemState, *RunState])


@given(st.booleans(), st.integers(0, 20), st.integers(1, 20),
       st.one_of(st.integers(0, 5), st.floats(0, 0.99)))
def test_a_complete_run_is_in_the_state_finished_state_gives(
        cancelled: bool, failed: int, total: int, tolerate: float) -> None:
    """The metrics count complete runs in groups by ``finished_state``; ``derive`` agrees."""
    from workledger.core.status import finished_state

    failed = min(failed, total)
    counts = {"s": {"processed": total - failed, "failed": failed}}
    d = derive(RunFacts(["s"], counts, decomposed=True, cancelled=cancelled, tolerate=tolerate))
    assert d.complete
    assert d.state is finished_state(cancelled, failed, total, tolerate)
