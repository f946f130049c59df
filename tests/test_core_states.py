"""Item states and the table of moves (docs/design.md "The transition table"): one-way terminals,
who moves what, refusals. ``tests/test_transitions_sql.py`` checks the SQL against the table."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workledger.core.states import (
    MOVES,
    TERMINAL,
    Actor,
    IllegalTransition,
    ItemState,
    Move,
    move,
)

pytestmark = pytest.mark.unit

S = ItemState

# Written out from docs/design.md "The transition table", independently of the module's own table.
DOCUMENTED: set[tuple[ItemState | None, ItemState]] = {
    (None, S.PENDING), (None, S.SKIPPED),
    (S.PENDING, S.CLAIMED), (S.PENDING, S.SKIPPED),
    (S.CLAIMED, S.PROCESSED), (S.CLAIMED, S.FAILED), (S.CLAIMED, S.SKIPPED),
    (S.CLAIMED, S.PENDING), (S.CLAIMED, S.UNKNOWN),
    (S.UNKNOWN, S.PROCESSED), (S.UNKNOWN, S.FAILED), (S.UNKNOWN, S.PENDING),
    (S.UNKNOWN, S.UNKNOWN),
    (S.FAILED, S.PENDING),
}


def out_of(state: ItemState) -> list[Move]:
    return [m for m in MOVES if m.source is state]


def test_the_table_allows_exactly_the_documented_pairs() -> None:
    assert {(m.source, m.target) for m in MOVES} == DOCUMENTED


@pytest.mark.parametrize(("name", "actor"), sorted({(m.name, m.actor) for m in MOVES}))
def test_move_refuses_every_target_its_row_does_not_name(name: str, actor: Actor) -> None:
    """A move is looked up with ``move`` only: a target outside its rows is no move at all."""
    targets = {m.target for m in MOVES if (m.name, m.actor) == (name, actor)}
    for target in set(ItemState) - targets:
        with pytest.raises(IllegalTransition):
            move(name, actor, target)


def test_every_row_is_unique_by_name_actor_and_target() -> None:
    keys = [(m.name, m.actor, m.target) for m in MOVES]
    assert len(keys) == len(set(keys))


def test_a_name_means_one_pair_except_insert_and_resolve_which_name_their_outcome() -> None:
    for name in {m.name for m in MOVES}:
        pairs = {(m.source, m.target) for m in MOVES if m.name == name}
        if name == "resolve":
            assert pairs == {(S.UNKNOWN, S.PROCESSED), (S.UNKNOWN, S.FAILED),
                             (S.UNKNOWN, S.PENDING)}
        elif name == "insert":
            assert pairs == {(None, S.PENDING), (None, S.SKIPPED)}
        else:
            assert len(pairs) == 1, name


def test_the_design_documents_exactly_the_table_of_moves() -> None:
    """docs/design.md's transition table and core/states.py's MOVES are the same rows."""
    design = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    rows = set()
    for line in design.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[3] in {a.value for a in Actor}:
            rows.add((cells[0], None if cells[1] == "(none)" else cells[1], cells[2], cells[3]))
    code = {(m.name, None if m.source is None else m.source.value, m.target.value,
             m.actor.value) for m in MOVES}
    assert rows == code


def test_move_finds_the_row_for_its_actor_and_refuses_another_actor() -> None:
    assert move("redrive", Actor.OPERATOR).target is S.PENDING
    assert move("redrive", Actor.OPERATOR).from_state is S.FAILED
    with pytest.raises(IllegalTransition, match="worker cannot make the move redrive"):
        move("redrive", Actor.WORKER)
    with pytest.raises(IllegalTransition):
        move("no_such_move", Actor.OPERATOR)


@pytest.mark.parametrize("target", [S.PROCESSED, S.FAILED, S.PENDING])
def test_resolve_takes_an_unknown_item_to_the_chosen_outcome(target: ItemState) -> None:
    found = move("resolve", Actor.OPERATOR, target)
    assert (found.source, found.target) == (S.UNKNOWN, target)


@pytest.mark.parametrize("target", [S.CLAIMED, S.SKIPPED, S.UNKNOWN])
def test_resolve_to_anything_but_processed_failed_or_pending_is_refused(
    target: ItemState,
) -> None:
    with pytest.raises(IllegalTransition):
        move("resolve", Actor.OPERATOR, target)


def test_an_insert_moves_no_item_out_of_a_state() -> None:
    with pytest.raises(IllegalTransition):
        _ = move("insert", Actor.DECOMPOSER).from_state


def test_illegal_transition_is_a_value_error() -> None:
    assert issubclass(IllegalTransition, ValueError)


def test_terminal_states_are_processed_failed_and_skipped() -> None:
    assert TERMINAL == {S.PROCESSED, S.FAILED, S.SKIPPED}


def test_processed_and_skipped_have_no_way_out() -> None:
    assert out_of(S.PROCESSED) == [] == out_of(S.SKIPPED)


def test_failed_leaves_only_by_an_operators_redrive_to_pending() -> None:
    assert {(m.name, m.actor, m.target) for m in out_of(S.FAILED)} == {
        ("redrive", Actor.OPERATOR, S.PENDING)}


def test_every_open_state_has_someone_who_moves_items_out_of_it() -> None:
    ways = {(m.source, m.actor, m.name) for m in MOVES if m.target is not m.source}
    assert (S.FAILED, Actor.OPERATOR, "redrive") in ways
    assert (S.UNKNOWN, Actor.OPERATOR, "resolve") in ways
    assert (S.UNKNOWN, Actor.SWEEPER, "verify_done") in ways
    assert (S.PENDING, Actor.WORKER, "claim") in ways
    assert (S.CLAIMED, Actor.SWEEPER, "lease_expired") in ways


def test_only_a_person_and_the_sweepers_verify_take_an_item_out_of_unknown() -> None:
    actors = {m.actor for m in out_of(S.UNKNOWN)}
    assert actors == {Actor.OPERATOR, Actor.SWEEPER}
    assert {m.name for m in out_of(S.UNKNOWN) if m.actor is Actor.SWEEPER} == {
        "verify_done", "verify_not_done", "verify_unsure"}


walks = st.lists(st.sampled_from(MOVES), max_size=60)


@given(start=st.sampled_from(ItemState), walk=walks)
def test_no_sequence_of_moves_leaves_a_terminal_state_except_by_redrive(
    start: ItemState, walk: list[Move]
) -> None:
    state = start
    for m in walk:
        if m.source is not state:
            continue  # not a move from here: the item stays where it was
        if state in TERMINAL:
            assert (m.name, state) == ("redrive", S.FAILED)
        state = m.target


@pytest.mark.parametrize("start", [s for s in ItemState if s not in TERMINAL])
def test_every_non_terminal_state_can_still_reach_a_terminal_state(start: ItemState) -> None:
    seen, frontier = {start}, [start]
    while frontier:
        for nxt in {m.target for m in out_of(frontier.pop())} - seen:
            seen.add(nxt)
            frontier.append(nxt)
    assert seen & TERMINAL
