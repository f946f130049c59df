"""Item states and the one table of moves between them (docs/design.md "The transition table").

:data:`MOVES` is the authority: every change of ``wl_items.state`` that any SQL statement or
runtime path makes is a row of it, with the actor that makes it and the query that writes it.
``tests/test_transitions_sql.py`` derives the (from, to) pairs of every statement in both
``.sql`` files and fails on a pair this table lacks; the runtime takes its target states from
here (:func:`move`), never from a string literal of its own.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class ItemState(StrEnum):
    """An item's state (``wl_items.state``), in the order lists show them: in flight, in doubt,
    terminal. Str-valued: a member is the very word stored, printed and answered."""

    PENDING = "pending"  # a worker (or a broker's task) claims it; a cancel skips it
    CLAIMED = "claimed"  # its holder finishes or releases it; the sweeper takes it back
    UNKNOWN = "unknown"  # the sweeper's verify hook, or a person (resolve), settles it
    PROCESSED = "processed"  # terminal
    FAILED = "failed"  # terminal, but a person may redrive it
    SKIPPED = "skipped"  # terminal


class Actor(StrEnum):
    """Who makes a move: the part of the system whose code path runs the statement."""

    DECOMPOSER = "decomposer"  # submit, or the sweeper re-decomposing a run
    WORKER = "worker"  # a worker's claim loop, and what any holder of a chunk writes
    BROKER = "broker"  # a task a broker delivered: claims the items its message names
    SWEEPER = "sweeper"  # expired leases, verify hooks, the closing hook
    OPERATOR = "operator"  # a person: retry, resolve, cancel


# Reasons the ledger itself leaves on items (wl_items.error). An item whose reason starts with
# LEASE_EXPIRED lost its holder while it may have been running: the next claimer treats it as a
# suspect (runs it alone, its attempt charged first), so a poison item charges only itself.
LEASE_EXPIRED = "lease_expired"
RECLAIMED = f"{LEASE_EXPIRED}: its holder stopped renewing the lease"
AWAITING_VERIFY = f"{LEASE_EXPIRED}: awaiting verify"
OUTCOME_UNKNOWN = f"{LEASE_EXPIRED}: outcome unknown; a person must resolve it"
VERIFIED_NOT_DONE = f"{LEASE_EXPIRED}: verify: not done; will run again"
NOT_STARTED = "not started: its holder stopped before running it"
# a suspect of an idempotent stage whose holder vanished again while it had started it: it runs
# alone next time (a suspect lost once runs side by side with the others, charged as it starts)
LOST_TWICE = f"{LEASE_EXPIRED}: again: its holder vanished again while running it"

TERMINAL: frozenset[ItemState] = frozenset(
    {ItemState.PROCESSED, ItemState.FAILED, ItemState.SKIPPED}
)
ITEM_STATES: tuple[str, ...] = tuple(s.value for s in ItemState)  # `items --state`, the pages
# the states a person is alerted to, each listed through an index of its own (items_attention)
ATTENTION: tuple[ItemState, ...] = (ItemState.FAILED, ItemState.UNKNOWN)


class Move(NamedTuple):
    """One allowed change of an item's state. ``source`` None: the row is inserted."""

    name: str
    source: ItemState | None
    target: ItemState
    actor: Actor
    where: str  # the named query (in both .sql files) that writes it

    @property
    def from_state(self) -> ItemState:
        """The state this move takes an item out of (an insert has none)."""
        if self.source is None:
            raise IllegalTransition(f"{self.name} inserts a row; it moves none")
        return self.source


_P, _C, _D, _F, _S, _U = (ItemState.PENDING, ItemState.CLAIMED, ItemState.PROCESSED,
                          ItemState.FAILED, ItemState.SKIPPED, ItemState.UNKNOWN)
_DEC, _WRK, _SWP, _OPR = Actor.DECOMPOSER, Actor.WORKER, Actor.SWEEPER, Actor.OPERATOR
_BRK = Actor.BROKER
_FINISH = "items_finish_if_leased"


def _rows(name: str, source: ItemState | None, target: ItemState, where: str,
          *actors: Actor) -> list[Move]:
    return [Move(name, source, target, actor, where) for actor in actors]


MOVES: tuple[Move, ...] = tuple(
    _rows("insert", None, _P, "items_insert", _DEC)
    + _rows("insert", None, _S, "items_insert", _DEC)
    # the next stage's row, written in the transaction that finishes (or settles) this one;
    # the sweeper inserts a run's '@close' entry the same way it is claimed: as an item
    + _rows("handoff", None, _P, "items_handoff", _WRK, _SWP, _OPR)
    + _rows("insert_close", None, _P, "items_insert", _SWP)
    + _rows("claim", _P, _C, "items_claim", _WRK, _SWP)
    # a broker task claims by identity; what it writes after that is the worker's code
    # (_runtime/worker/chunk.py), so its other moves are the worker's rows
    + _rows("claim", _P, _C, "items_claim_by_identity", _BRK)
    + _rows("complete", _C, _D, _FINISH, _WRK, _SWP)
    + _rows("fail", _C, _F, _FINISH, _WRK, _SWP)
    + _rows("skip", _C, _S, _FINISH, _WRK, _SWP)
    + _rows("retry_later", _C, _P, _FINISH, _WRK, _SWP)
    + _rows("outcome_unknown", _C, _U, _FINISH, _WRK)
    + _rows("release", _C, _P, "items_release", _WRK)
    + _rows("lease_expired", _C, _P, "leases_reclaim_expired", _SWP)
    + _rows("lease_expired_unknown", _C, _U, "leases_reclaim_expired", _SWP)
    + _rows("verify_done", _U, _D, "items_settle", _SWP)
    + _rows("verify_not_done", _U, _P, "items_settle", _SWP)
    + _rows("verify_unsure", _U, _U, "items_settle", _SWP)
    + _rows("resolve", _U, _D, "items_settle", _OPR)
    + _rows("resolve", _U, _F, "items_settle", _OPR)
    + _rows("resolve", _U, _P, "items_settle", _OPR)
    + _rows("redrive", _F, _P, "items_settle", _OPR)
    + _rows("cancel", _P, _S, "items_cancel_pending", _OPR)
    # a write that lands in a run cancelled meanwhile and leaves an item pending (a finish, a
    # settle, a release, a reclaim, a late decomposition batch) skips it in the same transaction
    + _rows("cancel_late", _P, _S, "items_cancel_pending", _WRK, _SWP, _OPR, _DEC)
)

class IllegalTransition(ValueError):
    pass


def move(name: str, actor: Actor, target: ItemState | None = None) -> Move:
    """The row of :data:`MOVES` for ``name`` made by ``actor`` (and ``target``, where a move
    has several, as ``insert`` and ``resolve`` have); :class:`IllegalTransition` when there is none.

    >>> move("redrive", Actor.OPERATOR).target
    <ItemState.PENDING: 'pending'>
    """
    found = [m for m in MOVES if m.name == name and m.actor is actor
             and (target is None or m.target is target)]
    if len(found) != 1:
        what = f"{name}{'' if target is None else ' to ' + target.value}"
        raise IllegalTransition(f"{actor.value} cannot make the move {what}")
    return found[0]

