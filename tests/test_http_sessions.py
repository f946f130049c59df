"""Sign-in sessions end when they expire or are ended, a sign-in code works once and for
minutes, and the throttle slows a client that sent too many wrong tokens only until the window
has passed (a clock passed in)."""

from __future__ import annotations

import asyncio

import pytest

from workledger.http.auth import Principal
from workledger.http.sessions import MAX_PAUSED, MAX_SESSIONS, Sessions, SignInCodes, Throttle

pytestmark = pytest.mark.unit
ALICE = Principal("alice", True)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_names_its_principal_until_it_expires_or_is_ended() -> None:
    clock = Clock()
    sessions = Sessions(lifetime=60, clock=clock)
    sid = sessions.start(ALICE)
    assert sessions.who(sid) == ALICE and sessions.who("guess") is None
    clock.now += 59
    assert sessions.who(sid) == ALICE
    clock.now += 1
    assert sessions.who(sid) is None
    other = sessions.start(ALICE)
    sessions.end(other)
    assert sessions.who(other) is None and sessions.start(ALICE) != other


def test_past_the_limit_the_oldest_session_ends_first() -> None:
    sessions = Sessions()
    first = sessions.start(ALICE)
    for _ in range(MAX_SESSIONS):
        sessions.start(ALICE)
    assert sessions.who(first) is None


def test_past_its_allowance_a_client_is_slowed_until_the_window_passes() -> None:
    clock = Clock()
    throttle = Throttle(allowed=3, window=60, clock=clock)
    assert [throttle.failed("10.0.0.1") for _ in range(4)] == [False, False, False, True]
    assert throttle.wait("10.0.0.1") == pytest.approx(60)
    assert throttle.wait("10.0.0.2") == 0 and not throttle.failed("10.0.0.2")  # another
    clock.now += 30
    assert throttle.wait("10.0.0.1") == pytest.approx(30)
    clock.now += 30
    assert throttle.wait("10.0.0.1") == 0
    assert not throttle.failed("10.0.0.1")


def test_no_more_than_so_many_answers_are_paused_at_once() -> None:
    """The pauses hold connections: past MAX_PAUSED of them, a wrong token is answered at
    once rather than let wrong tokens take the server's connections."""
    throttle = Throttle(pause=60)

    async def one_more_past_the_cap() -> None:
        held = [asyncio.create_task(throttle.pause()) for _ in range(MAX_PAUSED)]
        await asyncio.sleep(0)  # each has begun its pause
        try:
            await asyncio.wait_for(throttle.pause(), timeout=10)
        finally:
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)

    asyncio.run(one_more_past_the_cap())


def test_a_sign_in_code_works_once_and_only_within_its_lifetime() -> None:
    clock = Clock()
    codes = SignInCodes(lifetime=600, clock=clock)
    first, second = codes.issue(ALICE), codes.issue(ALICE)
    assert first != second and len(first) >= 32
    assert codes.redeem("guess") is None
    assert codes.redeem(first) == ALICE
    assert codes.redeem(first) is None  # spent
    clock.now += 600
    assert codes.redeem(second) is None  # expired
