"""Sign-in sessions end when they expire or are ended, and the throttle holds a client that
sent too many wrong tokens only until the window has passed (a clock passed in)."""

from __future__ import annotations

import pytest

from workledger.http.auth import Principal
from workledger.http.sessions import MAX_SESSIONS, Sessions, Throttle

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


def test_a_client_waits_after_too_many_wrong_tokens_until_the_window_passes() -> None:
    clock = Clock()
    throttle = Throttle(allowed=3, window=60, clock=clock)
    for _ in range(3):
        assert throttle.wait("10.0.0.1") == 0
        throttle.failed("10.0.0.1")
    assert throttle.wait("10.0.0.1") == pytest.approx(60)
    assert throttle.wait("10.0.0.2") == 0  # another client
    clock.now += 30
    assert throttle.wait("10.0.0.1") == pytest.approx(30)
    clock.now += 30
    assert throttle.wait("10.0.0.1") == 0
