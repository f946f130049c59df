"""Item states and transitions (docs/design.md): the table, refusals, one-way terminals."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workledger.core.states import (
    MOVED_BY,
    TERMINAL,
    IllegalTransition,
    ItemState,
    Transition,
    apply,
    is_terminal,
)

pytestmark = pytest.mark.unit

S = ItemState
T = Transition

# Written out from docs/design.md ("Item states"), independently of the module's own table.
ALLOWED: dict[tuple[ItemState, Transition], ItemState] = {
    (S.PENDING, T.CLAIM): S.CLAIMED,
    (S.PENDING, T.CANCEL): S.SKIPPED,  # run cancelled: reason 'cancelled'
    (S.CLAIMED, T.COMPLETE): S.PROCESSED,
    (S.CLAIMED, T.FAIL): S.FAILED,
    (S.CLAIMED, T.SKIP): S.SKIPPED,
    (S.CLAIMED, T.RETRY_LATER): S.PENDING,
    (S.CLAIMED, T.LEASE_EXPIRED): S.PENDING,  # idempotent stage
    (S.CLAIMED, T.LEASE_EXPIRED_UNKNOWN): S.UNKNOWN,
    (S.CLAIMED, T.VERIFY_DONE): S.PROCESSED,  # verify hook asked at lease expiry
    (S.UNKNOWN, T.VERIFY_DONE): S.PROCESSED,
    (S.UNKNOWN, T.VERIFY_NOT_DONE): S.PENDING,
    (S.FAILED, T.REDRIVE): S.PENDING,  # the audited redrive
}
RESOLVE_TARGETS = (S.PROCESSED, S.FAILED, S.PENDING)

REFUSED = [
    (state, transition)
    for state, transition in itertools.product(ItemState, Transition)
    if (state, transition) not in ALLOWED and transition is not T.RESOLVE
]


@pytest.mark.parametrize(("state", "transition"), list(ALLOWED))
def test_allowed_transition_reaches_the_documented_state(
    state: ItemState, transition: Transition
) -> None:
    assert apply(state, transition) is ALLOWED[(state, transition)]


@pytest.mark.parametrize(("state", "transition"), REFUSED)
def test_transition_absent_from_the_table_is_refused(
    state: ItemState, transition: Transition
) -> None:
    with pytest.raises(IllegalTransition) as raised:
        apply(state, transition)
    assert transition.value in str(raised.value)
    assert state.value in str(raised.value)


@pytest.mark.parametrize("target", RESOLVE_TARGETS)
def test_resolve_moves_unknown_to_the_chosen_outcome(target: ItemState) -> None:
    assert apply(S.UNKNOWN, T.RESOLVE, target) is target


@pytest.mark.parametrize("target", [None, S.CLAIMED, S.SKIPPED, S.UNKNOWN])
def test_resolve_to_anything_but_processed_failed_or_pending_is_refused(
    target: ItemState | None,
) -> None:
    with pytest.raises(IllegalTransition):
        apply(S.UNKNOWN, T.RESOLVE, target)


@pytest.mark.parametrize(
    ("state", "target"),
    [(s, t) for s in ItemState if s is not S.UNKNOWN for t in (None, *RESOLVE_TARGETS)],
)
def test_resolve_is_refused_from_every_state_but_unknown(
    state: ItemState, target: ItemState | None
) -> None:
    with pytest.raises(IllegalTransition):
        apply(state, T.RESOLVE, target)


def test_illegal_transition_is_a_value_error() -> None:
    assert issubclass(IllegalTransition, ValueError)


def test_terminal_states_are_processed_failed_and_skipped() -> None:
    assert TERMINAL == {S.PROCESSED, S.FAILED, S.SKIPPED}
    assert [s for s in ItemState if is_terminal(s)] == [S.PROCESSED, S.FAILED, S.SKIPPED]


def test_every_state_names_who_moves_items_out_of_it() -> None:
    assert set(MOVED_BY) == set(ItemState)
    assert all(text.strip() for text in MOVED_BY.values())
    assert "redrive" in MOVED_BY[S.FAILED]
    assert "resolve" in MOVED_BY[S.UNKNOWN]


@pytest.mark.parametrize("state", [S.PROCESSED, S.SKIPPED])
def test_processed_and_skipped_refuse_every_transition(state: ItemState) -> None:
    for transition in Transition:
        for target in (None, *ItemState):
            with pytest.raises(IllegalTransition):
                apply(state, transition, target)


def test_failed_leaves_only_by_redrive_to_pending() -> None:
    ways_out = []
    for transition in Transition:
        for target in (None, *ItemState):
            try:
                ways_out.append((transition, apply(S.FAILED, transition, target)))
            except IllegalTransition:
                pass
    assert set(ways_out) == {(T.REDRIVE, S.PENDING)}


steps = st.lists(
    st.tuples(st.sampled_from(Transition), st.none() | st.sampled_from(ItemState)), max_size=60
)


@given(start=st.sampled_from(ItemState), walk=steps)
def test_no_sequence_of_transitions_leaves_a_terminal_state_except_by_redrive(
    start: ItemState, walk: list[tuple[Transition, ItemState | None]]
) -> None:
    state = start
    for transition, target in walk:
        try:
            after = apply(state, transition, target)
        except IllegalTransition:
            continue  # refused: the item stays where it was
        if is_terminal(state):
            assert (state, transition, after) == (S.FAILED, T.REDRIVE, S.PENDING)
        state = after


@given(start=st.sampled_from([S.PROCESSED, S.SKIPPED]), walk=steps)
def test_processed_and_skipped_are_absorbing_under_any_sequence(
    start: ItemState, walk: list[tuple[Transition, ItemState | None]]
) -> None:
    state = start
    for transition, target in walk:
        try:
            state = apply(state, transition, target)
        except IllegalTransition:
            pass
    assert state is start


def _successors(state: ItemState) -> set[ItemState]:
    found = set()
    for transition in Transition:
        for target in (None, *ItemState):
            try:
                found.add(apply(state, transition, target))
            except IllegalTransition:
                pass
    return found


@pytest.mark.parametrize("start", [s for s in ItemState if s not in TERMINAL])
def test_every_non_terminal_state_can_still_reach_a_terminal_state(start: ItemState) -> None:
    seen, frontier = {start}, [start]
    while frontier:
        for nxt in _successors(frontier.pop()) - seen:
            seen.add(nxt)
            frontier.append(nxt)
    assert seen & TERMINAL
