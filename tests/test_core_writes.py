"""Outcome writes come from rows of ``MOVES`` only (core/writes.py): each named constructor
gives the state, the unit counter and the event kind together, and the port refuses a write
made any other way. The unit-counter rule is written once and pinned here, the closing entry
included."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from workledger.core import writes
from workledger.core.states import MOVES, Actor, IllegalTransition, ItemState
from workledger.core.status import CLOSE_STAGE
from workledger.core.writes import Unit, Write
from workledger.storage.port import Finish, FinishParams, Settle, SettleParams

pytestmark = pytest.mark.unit

S = ItemState
FINISH, SETTLE = "items_finish_if_leased", "items_settle"


def forged(like: Write) -> Write:
    """A Write with the very fields of ``like``, made around its constructors."""
    w = object.__new__(Write)
    for name in Write.__slots__:
        object.__setattr__(w, name, getattr(like, name))
    return w


def test_a_copy_of_a_write_is_itself() -> None:
    w = writes.completed(Actor.WORKER, "send", True)
    assert copy.copy(w) is w and copy.deepcopy(w) is w


def every_write() -> list[Write]:
    """One write of every constructor, for a last stage, a middle stage and the closing entry."""
    out: list[Write] = []
    for actor in (Actor.WORKER, Actor.SWEEPER):
        for stage, last in (("send", True), ("render", False), (CLOSE_STAGE, True)):
            for record in (False, True):
                out += [writes.completed(actor, stage, last, record),
                        writes.failed(actor, stage, record), writes.skipped(actor, stage),
                        writes.retried(actor)]
    out += [writes.left_unknown(Actor.WORKER)]
    for stage, last in (("send", True), ("render", False), (CLOSE_STAGE, True)):
        out += [writes.verified_done(stage, last), writes.redriven(stage)]
        out += [writes.resolved(t, stage, last) for t in writes.RESOLVE_TARGETS]
    out += [writes.verified_not_done(), writes.verify_unsure()]
    return out


@pytest.mark.parametrize("w", every_write(), ids=repr)
def test_every_write_is_a_row_of_the_table_with_its_state(w: Write) -> None:
    assert w.move in MOVES
    assert w.state == w.move.target.value
    assert w.move.where in (FINISH, SETTLE)
    writes.check(w, w.move.where)  # accepted where its row says it is written


def test_a_write_is_made_by_its_constructors_only() -> None:
    with pytest.raises(IllegalTransition):
        Write(object(), MOVES[0], None, None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("forge", [
    lambda: "processed",  # a bare state word, as the port took before
    lambda: object.__new__(Write),
    lambda: forged(writes.completed(Actor.WORKER, "send", True)),
], ids=["a state word", "an instance made around __init__", "a field by field copy"])
def test_the_check_refuses_a_write_made_any_other_way(forge: object) -> None:
    with pytest.raises(IllegalTransition):
        writes.check(forge(), FINISH)  # type: ignore[operator]


def test_the_check_refuses_a_write_where_its_row_does_not_write_it() -> None:
    with pytest.raises(IllegalTransition):
        writes.check(writes.redriven("send"), FINISH)  # a settle is not a finish


def test_the_store_refuses_a_finish_or_settle_not_built_from_the_table(tmp_path: Path) -> None:
    from workledger.storage import open_store

    store = open_store(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        store.migrate()
        forged = Finish(1, 1, "processed")  # type: ignore[arg-type]
        with pytest.raises(IllegalTransition):
            store.items_finish_if_leased(FinishParams(1, [forged]))
        with pytest.raises(IllegalTransition):
            store.items_settle(SettleParams(1, "unknown", [Settle(1, "processed")]))  # type: ignore[arg-type]
        wrong_guard = Settle(1, writes.redriven("send"))  # moves failed items, not unknown ones
        with pytest.raises(IllegalTransition):
            store.items_settle(SettleParams(1, "unknown", [wrong_guard]))
    finally:
        store.close()


# -- the unit-counter rule, once -----------------------------------------------------------------


@pytest.mark.parametrize(("target", "stage", "last", "unit"), [
    (S.PROCESSED, "send", True, Unit.PROCESSED),  # a unit is processed when its last stage is
    (S.PROCESSED, "render", False, None),  # ... and handed on before that
    (S.FAILED, "render", False, Unit.FAILED),  # it fails, or is skipped, at any stage
    (S.SKIPPED, "render", False, Unit.SKIPPED),
    (S.PENDING, "send", True, None),
    (S.UNKNOWN, "send", True, None),
    # the closing entry is no unit (units_of leaves it out): it adds to no counter, whoever
    # moves it (the sweeper's finish, a person's resolve, a redrive of its failure)
    (S.PROCESSED, CLOSE_STAGE, True, None),
    (S.FAILED, CLOSE_STAGE, True, None),
    (S.SKIPPED, CLOSE_STAGE, True, None),
])
def test_the_unit_a_move_adds_to(target: ItemState, stage: str, last: bool,
                                 unit: Unit | None) -> None:
    assert writes.unit_of(target, stage, last) == unit


def test_the_closing_entry_moves_no_counter_by_any_path() -> None:
    for w in (writes.completed(Actor.SWEEPER, CLOSE_STAGE, True),
              writes.failed(Actor.SWEEPER, CLOSE_STAGE),
              writes.resolved(S.PROCESSED, CLOSE_STAGE, True),
              writes.resolved(S.FAILED, CLOSE_STAGE, True),
              writes.verified_done(CLOSE_STAGE, True),
              writes.redriven(CLOSE_STAGE)):
        assert (w.unit, w.unit_removed) == (None, None), w


def test_a_redrive_takes_back_the_failed_unit() -> None:
    assert writes.redriven("render").unit_removed is Unit.FAILED


@pytest.mark.parametrize(("w", "kind"), [
    (writes.completed(Actor.WORKER, "send", True), None),  # the hot path records nothing
    (writes.completed(Actor.WORKER, "send", True, record=True), "processed"),
    (writes.completed(Actor.SWEEPER, CLOSE_STAGE, True), "closed"),
    (writes.completed(Actor.SWEEPER, CLOSE_STAGE, True, record=True), "processed"),
    (writes.failed(Actor.WORKER, "send"), "failed"),
    (writes.skipped(Actor.WORKER, "send"), "skipped"),
    (writes.retried(Actor.WORKER), "retry_scheduled"),
    (writes.left_unknown(Actor.WORKER), "unknown"),
    (writes.verified_done("send", True), "verified"),
    (writes.verified_not_done(), "verified"),
    (writes.verify_unsure(), "unknown"),
    (writes.resolved(S.FAILED, "send", True), "resolved"),
    (writes.redriven("send"), "redriven"),
], ids=repr)
def test_each_write_names_its_event_kind(w: Write, kind: str | None) -> None:
    assert w.event == kind
