"""Sign-in sessions kept by the server, and the throttle on failed token attempts.

A session is a random id (the cookie) that names a principal until it expires or its user
signs out: the token itself never travels in a cookie. Both tables live in the server's memory
(a restart signs everyone out) and are bounded, so no client can grow them without limit.
"""

from __future__ import annotations

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
FAILURE_WINDOW = 60.0  # ... within this many seconds before it is told to wait (429)
MAX_CLIENTS = 10_000  # clients whose failures are remembered at once


def client_of(request: Request) -> str:
    """The client's address (the proxy's, unless it is trusted with --forwarded-allow-ips)."""
    return request.client.host if request.client is not None else "-"


def too_many(request: Request, wait: float) -> Response:
    response = error_json(429, f"too many wrong tokens from {client_of(request)}: try again "
                               f"in {max(wait, 1):.0f} s")
    response.headers["retry-after"] = str(max(int(wait + 0.999), 1))
    return response


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


class Throttle:
    """Per client, the times of its recent wrong tokens; a client with ``allowed`` of them in
    the last ``window`` seconds waits until the oldest is that old."""

    def __init__(self, allowed: int = FAILURES_ALLOWED, window: float = FAILURE_WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.allowed, self.window, self.clock = allowed, window, clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def wait(self, client: str) -> float:
        """Seconds ``client`` must wait before its next token is looked at (0: none)."""
        with self._lock:
            times = self._recent(client)
            if times is None or len(times) < self.allowed:
                return 0.0
            return max(times[0] + self.window - self.clock(), 0.001)

    def failed(self, client: str) -> None:
        with self._lock:
            times = self._recent(client)
            if times is None:
                times = self._failures[client] = deque(maxlen=self.allowed)
            times.append(self.clock())
            self._failures.move_to_end(client)
            while len(self._failures) > MAX_CLIENTS:
                self._failures.popitem(last=False)

    def _recent(self, client: str) -> deque[float] | None:
        times = self._failures.get(client)
        if times is None:
            return None
        cutoff = self.clock() - self.window
        while times and times[0] <= cutoff:
            times.popleft()
        return times
