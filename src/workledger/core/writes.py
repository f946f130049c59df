"""Outcome writes: what one finish or settle writes for an item, made only from a row of
:data:`~workledger.core.states.MOVES` (docs/design.md "The transition table").

A :class:`Write` carries the move, the state it writes, the unit counter it adds to (or takes
from) and the event kind it records, so those four never disagree. Only the named constructors
below make one (river's ``JobSetStateCompleted`` habit); the storage port calls :func:`check`
on every write it is given and refuses, with :class:`IllegalTransition`, one made any other way
or written by a query its row does not name. The rule for which unit counter a move adds to is
:func:`unit_of`, here and nowhere else.

>>> w = completed(Actor.WORKER, "send", last=True)
>>> (w.state, w.unit, w.event)
('processed', <Unit.PROCESSED: 'processed'>, None)
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache
from typing import Any, final

from workledger.core.states import MOVES, Actor, IllegalTransition, ItemState, Move, move
from workledger.core.status import CLOSE_STAGE


class Unit(StrEnum):
    """A run's unit counters (``wl_runs`` columns of the same names)."""

    PROCESSED = "processed"
    FAILED = "failed"
    SKIPPED = "skipped"


_SEAL = object()  # only this module holds it: a Write made elsewhere is refused at once
_MADE: set[Write] = set()  # every write a constructor made (by identity): what check() accepts


@final
class Write:
    """One outcome write: a row of MOVES with its unit counter and event kind. Made by the
    constructors of this module only, each value once (they are cached), so the port's check
    is a set lookup."""

    __slots__ = ("event", "move", "state", "unit", "unit_removed")
    move: Move
    state: str  # the row's target, as stored (the port passes it to SQL as is)
    unit: Unit | None  # the unit counter this adds to
    unit_removed: Unit | None  # the unit counter this takes from (a redriven failure)
    event: str | None  # the wl_events kind recorded with it; None: none (the hot path)

    def __init__(self, seal: object, row: Move, unit: Unit | None, unit_removed: Unit | None,
                 event: str | None) -> None:
        if seal is not _SEAL:
            raise IllegalTransition("a Write is made by a constructor of workledger.core.writes")
        for name, value in (("move", row), ("state", row.target.value), ("unit", unit),
                            ("unit_removed", unit_removed), ("event", event)):
            object.__setattr__(self, name, value)
        _MADE.add(self)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Write is immutable")

    def __copy__(self) -> Write:
        return self  # a value: a copy is itself (and so still one the check accepts)

    def __deepcopy__(self, memo: dict[int, Any]) -> Write:
        return self

    def __reduce__(self) -> str | tuple[Any, ...]:
        raise TypeError("a Write is not pickled: make it again with its constructor")

    def __repr__(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in (("unit", self.unit), ("removes",
                        self.unit_removed), ("event", self.event)) if v is not None)
        return f"<Write {self.move.name} by {self.move.actor.value} -> {self.state}{extra}>"


def check(write: object, where: str) -> Write:
    """``write`` if a constructor made it and its row is written by the query ``where``;
    :class:`IllegalTransition` otherwise. The port calls this for every finish and settle."""
    try:
        made = write in _MADE
    except TypeError:  # unhashable: certainly not one of ours
        made = False
    if not made:
        what = repr(write) if isinstance(write, str) else f"a {type(write).__name__}"
        raise IllegalTransition(f"not a write made from a row of MOVES: {what}")
    assert isinstance(write, Write)
    if write.move.where != where:
        raise IllegalTransition(f"{write.move.name} is written by {write.move.where}, "
                                f"not {where}")
    return write


def unit_of(target: ItemState, stage: str, last: bool) -> Unit | None:
    """The unit counter a move into ``target`` adds to: a unit is processed when its last stage
    is (``last``), and fails or is skipped at any stage. The closing entry (``@close``) is no
    unit (``units_of`` leaves it out), so a move of it adds to no counter, by any path."""
    if stage == CLOSE_STAGE:
        return None
    if target is ItemState.PROCESSED:
        return Unit.PROCESSED if last else None
    if target is ItemState.FAILED:
        return Unit.FAILED
    if target is ItemState.SKIPPED:
        return Unit.SKIPPED
    return None


def _write(name: str, actor: Actor, target: ItemState | None, stage: str, last: bool,
           event: str | None, removed: Unit | None = None) -> Write:
    row = move(name, actor, target)
    return Write(_SEAL, row, unit_of(row.target, stage, last), removed, event)


# -- a finish: a claimed item's outcome (items_finish_if_leased) ----------------------------------


@cache
def completed(actor: Actor, stage: str, last: bool = True, record: bool = False) -> Write:
    """Processed. ``record``: a full-history job records it (``processed``); the closing entry
    is recorded either way (``closed``, or ``processed`` with full history)."""
    event = "processed" if record else ("closed" if stage == CLOSE_STAGE else None)
    return _write("complete", actor, None, stage, last, event)


@cache
def failed(actor: Actor, stage: str, last: bool = True, record: bool = False) -> Write:
    """Failed, for good (a person may redrive it): always recorded."""
    return _write("fail", actor, None, stage, last, "failed")


@cache
def skipped(actor: Actor, stage: str, last: bool = True, record: bool = False) -> Write:
    """Skipped with a reason: always recorded."""
    return _write("skip", actor, None, stage, last, "skipped")


@cache
def retried(actor: Actor, stage: str = "", last: bool = False, record: bool = False) -> Write:
    """Back to pending, to run again after its delay: always recorded."""
    return _write("retry_later", actor, None, stage, last, "retry_scheduled")


@cache
def left_unknown(actor: Actor, stage: str = "", last: bool = False,
                 record: bool = False) -> Write:
    """In doubt: the verify hook or a person settles it. Always recorded."""
    return _write("outcome_unknown", actor, None, stage, last, "unknown")


# the finish constructors by the name of their row (core.outcomes.Decision.move)
FINISHED = {"complete": completed, "fail": failed, "skip": skipped, "retry_later": retried,
            "outcome_unknown": left_unknown}


# -- a settle: a move out of unknown or failed (items_settle) -------------------------------------


@cache
def verified_done(stage: str, last: bool) -> Write:
    return _write("verify_done", Actor.SWEEPER, None, stage, last, "verified")


@cache
def verified_not_done() -> Write:
    return _write("verify_not_done", Actor.SWEEPER, None, "", False, "verified")


@cache
def verify_unsure() -> Write:
    return _write("verify_unsure", Actor.SWEEPER, None, "", False, "unknown")


# what `resolve --as` may say happened: the targets of the table's resolve rows
RESOLVE_TARGETS: tuple[ItemState, ...] = tuple(
    m.target for m in MOVES if m.name == "resolve" and m.actor is Actor.OPERATOR)


@cache
def resolved(target: ItemState, stage: str, last: bool) -> Write:
    """A person's decision on an unknown item: one of :data:`RESOLVE_TARGETS`."""
    return _write("resolve", Actor.OPERATOR, target, stage, last, "resolved")


@cache
def redriven(stage: str) -> Write:
    """A failed item back to pending with fresh attempts: its failed unit is taken back."""
    removed = unit_of(ItemState.FAILED, stage, True)
    return _write("redrive", Actor.OPERATOR, None, stage, False, "redriven", removed)
