"""Sign-in sessions kept by the server, the one-time sign-in codes serve prints, and the
throttle on wrong tokens.

A session is a random id (the cookie) that names a principal until it expires or its user
signs out: the token itself never travels in a cookie. A sign-in code is exchanged for a session
once, within minutes: the address serve prints (and the browser's history keeps) carries no
token. These tables live in the server's memory (a restart signs everyone out) and are bounded,
so no client can grow them without limit.

The throttle slows wrong tokens down and never refuses a right one: on loopback every client
is 127.0.0.1, so refusing an address would let anyone on the machine lock the operator out.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from workledger.http.auth import Principal
from workledger.http.errors import error_json

COOKIE = "workledger_session"  # over plain HTTP (a cookie named __Host- needs Secure)
SECURE_COOKIE = "__Host-workledger_session"  # over HTTPS: this host only, path /, Secure

SESSION_SECONDS = 12 * 3600.0  # a sign-in lasts a working day, then the form asks again
MAX_SESSIONS = 10_000  # past this, the oldest session ends first
FAILURES_ALLOWED = 10  # wrong tokens a client may send ...
FAILURE_WINDOW = 60.0  # ... within this many seconds; past that each wrong one is answered
PAUSE = 1.0  # ... 429 after this pause, so a client guessing one token at a time is slowed
MAX_PAUSED = 100  # answers paused at once: the pauses cannot hold the server's connections
MAX_CLIENTS = 10_000  # clients whose failures are remembered at once
CODE_SECONDS = 600.0  # a sign-in code works once, within ten minutes of serve's start


def client_of(request: Request) -> str:
    """The client's address (the proxy's, unless it is trusted with --forwarded-allow-ips)."""
    return request.client.host if request.client is not None else "-"


def too_many(request: Request, wait: float) -> Response:
    response = error_json(429, f"too many wrong tokens from {client_of(request)}: each is "
                               f"answered slowly for {max(wait, 1):.0f} s")
    response.headers["retry-after"] = str(max(int(wait + 0.999), 1))
    return response


async def wrong_token(request: Request) -> Response | None:
    """Count a wrong token against its client: None while within the allowance (the caller
    answers 401), past it a 429 after a pause."""
    throttle: Throttle = request.app.state.throttle
    client = client_of(request)
    if not throttle.failed(client):
        return None
    await throttle.pause()
    return too_many(request, throttle.wait(client))


def session_of(request: Request) -> str | None:
    return request.cookies.get(SECURE_COOKIE) or request.cookies.get(COOKIE)


def cookie_for(request: Request) -> str:
    """The session cookie's name for this request: ``__Host-`` behind TLS (seen directly, or
    through a proxy trusted with ``--forwarded-allow-ips``)."""
    return SECURE_COOKIE if request.url.scheme == "https" else COOKIE


class Sessions:
    """Session id -> (principal, when it ends)."""

    def __init__(self, lifetime: float = SESSION_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime, self.clock = lifetime, clock
        self._by_id: OrderedDict[str, tuple[Principal, float]] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, principal: Principal) -> str:
        sid = secrets.token_urlsafe(32)
        with self._lock:
            self._by_id[sid] = (principal, self.clock() + self.lifetime)
            while len(self._by_id) > MAX_SESSIONS:
                self._by_id.popitem(last=False)
        return sid

    def who(self, sid: str | None) -> Principal | None:
        if not sid:
            return None
        with self._lock:
            found = self._by_id.get(sid)
            if found is None:
                return None
            if found[1] <= self.clock():
                del self._by_id[sid]
                return None
            return found[0]

    def end(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)


class SignInCodes:
    """Code -> (principal, when it stops working); each is exchanged for a session once."""

    def __init__(self, lifetime: float = CODE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime, self.clock = lifetime, clock
        self._by_code: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    def issue(self, principal: Principal) -> str:
        code = secrets.token_urlsafe(24)
        with self._lock:
            self._by_code[code] = (principal, self.clock() + self.lifetime)
        return code

    def redeem(self, code: str) -> Principal | None:
        """The code's principal, once: the code is spent whatever the answer."""
        with self._lock:
            found = self._by_code.pop(code, None)
        if found is None or found[1] <= self.clock():
            return None
        return found[0]


class Throttle:
    """Per client, the times of its recent wrong tokens; a client with more than ``allowed``
    of them in the last ``window`` seconds has each further wrong one answered after a pause
    (at most ``MAX_PAUSED`` at once), until the oldest is that old. A right token is never
    counted nor paused."""

    def __init__(self, allowed: int = FAILURES_ALLOWED, window: float = FAILURE_WINDOW,
                 clock: Callable[[], float] = time.monotonic, pause: float = PAUSE) -> None:
        self.allowed, self.window, self.clock, self.pause_seconds = allowed, window, clock, pause
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()
        self._paused = 0  # touched by the event loop only

    def wait(self, client: str) -> float:
        """Seconds until ``client``'s wrong tokens are answered at once again (0: now)."""
        with self._lock:
            times = self._recent(client)
            if times is None or len(times) < self.allowed:
                return 0.0
            return max(times[0] + self.window - self.clock(), 0.001)

    def failed(self, client: str) -> bool:
        """Count a wrong token; whether the client is past its allowance with it."""
        with self._lock:
            times = self._recent(client)
            past = times is not None and len(times) >= self.allowed
            if times is None:
                times = self._failures[client] = deque(maxlen=self.allowed)
            times.append(self.clock())
            self._failures.move_to_end(client)
            while len(self._failures) > MAX_CLIENTS:
                self._failures.popitem(last=False)
            return past

    async def pause(self) -> None:
        """Hold one answer back; none when ``MAX_PAUSED`` already are."""
        if self._paused >= MAX_PAUSED:
            return
        self._paused += 1
        try:
            await asyncio.sleep(self.pause_seconds)
        finally:
            self._paused -= 1

    def _recent(self, client: str) -> deque[float] | None:
        times = self._failures.get(client)
        if times is None:
            return None
        cutoff = self.clock() - self.window
        while times and times[0] <= cutoff:
            times.popleft()
        return times
