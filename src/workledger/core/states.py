"""Item states and the transitions allowed between them (docs/design.md, "Item states").

Each state's docstring-like entry in ``MOVED_BY`` names the part of the system that moves an
item out of it, so nothing is stranded without a named way back in.
"""

from __future__ import annotations

from enum import StrEnum


class ItemState(StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"
    PROCESSED = "processed"
    FAILED = "failed"
    SKIPPED = "skipped"
    UNKNOWN = "unknown"


TERMINAL: frozenset[ItemState] = frozenset(
    {ItemState.PROCESSED, ItemState.FAILED, ItemState.SKIPPED}
)

MOVED_BY: dict[ItemState, str] = {
    ItemState.PENDING: "workers claim it",
    ItemState.CLAIMED: "its holder finishes it; after lease expiry, the sweeper",
    ItemState.PROCESSED: "nobody: terminal",
    ItemState.FAILED: "a person: retry (redrive)",
    ItemState.SKIPPED: "nobody: terminal",
    ItemState.UNKNOWN: "the stage's verify hook, or a person: resolve",
}


class Transition(StrEnum):
    """Named reasons for a state change; every write of a state carries one."""

    CLAIM = "claim"
    COMPLETE = "complete"
    FAIL = "fail"
    SKIP = "skip"
    RETRY_LATER = "retry_later"
    LEASE_EXPIRED = "lease_expired"
    LEASE_EXPIRED_UNKNOWN = "lease_expired_unknown"
    VERIFY_DONE = "verify_done"
    VERIFY_NOT_DONE = "verify_not_done"
    RESOLVE = "resolve"
    REDRIVE = "redrive"
    CANCEL = "cancel"


# (from, transition) -> to. Anything absent is refused.
_TABLE: dict[tuple[ItemState, Transition], ItemState] = {
    (ItemState.PENDING, Transition.CLAIM): ItemState.CLAIMED,
    (ItemState.PENDING, Transition.CANCEL): ItemState.SKIPPED,
    (ItemState.CLAIMED, Transition.COMPLETE): ItemState.PROCESSED,
    (ItemState.CLAIMED, Transition.FAIL): ItemState.FAILED,
    (ItemState.CLAIMED, Transition.SKIP): ItemState.SKIPPED,
    (ItemState.CLAIMED, Transition.RETRY_LATER): ItemState.PENDING,
    (ItemState.CLAIMED, Transition.LEASE_EXPIRED): ItemState.PENDING,
    (ItemState.CLAIMED, Transition.LEASE_EXPIRED_UNKNOWN): ItemState.UNKNOWN,
    (ItemState.CLAIMED, Transition.VERIFY_DONE): ItemState.PROCESSED,
    (ItemState.UNKNOWN, Transition.VERIFY_DONE): ItemState.PROCESSED,
    (ItemState.UNKNOWN, Transition.VERIFY_NOT_DONE): ItemState.PENDING,
    (ItemState.UNKNOWN, Transition.RESOLVE): ItemState.PROCESSED,
    (ItemState.FAILED, Transition.REDRIVE): ItemState.PENDING,
}
_RESOLVE_TARGETS = {ItemState.PROCESSED, ItemState.FAILED, ItemState.PENDING}


class IllegalTransition(ValueError):
    pass


def apply(state: ItemState, transition: Transition, target: ItemState | None = None) -> ItemState:
    """Return the state after ``transition``; raise :class:`IllegalTransition` if not allowed.

    ``target`` chooses the outcome of a ``resolve`` (processed, failed or pending).

    >>> apply(ItemState.CLAIMED, Transition.COMPLETE)
    <ItemState.PROCESSED: 'processed'>
    """
    if transition is Transition.RESOLVE and state is ItemState.UNKNOWN:
        if target not in _RESOLVE_TARGETS:
            raise IllegalTransition(f"resolve must target one of {sorted(_RESOLVE_TARGETS)}")
        assert target is not None
        return target
    try:
        return _TABLE[(state, transition)]
    except KeyError:
        raise IllegalTransition(f"{transition.value} is not allowed from {state.value}") from None


def is_terminal(state: ItemState) -> bool:
    return state in TERMINAL
