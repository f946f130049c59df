"""uvicorn's h11 protocol with two bounds a server left running needs and uvicorn lacks.

- A client has ``read_timeout`` seconds to send a request's head and body; one that has not
  (a half-open request, a body trickling a byte at a time) is disconnected.
- Past ``limit`` open connections, a new one closes the oldest connection whose client is
  still sending (a head or a body still arriving) or idle between keep-alive requests, so
  slow clients cannot take every file descriptor, nor every place uvicorn's
  ``limit_concurrency`` counts, while a health check waits. A request the application is
  answering is never closed.

h11 also refuses a head over ``h11_max_incomplete_event_size`` with 400 (httptools buffers
any size); uvicorn's ``limit_concurrency`` answers 503 past as many requests in progress.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR, h11.SWITCHED_PROTOCOL)
WAITING_FOR_CLIENT = (h11.IDLE, h11.SEND_BODY)


class BoundedH11Protocol(H11Protocol):
    read_timeout = 10.0  # set by ``bounded`` for each server
    limit = 1000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading: asyncio.TimerHandle | None = None
        self.opened = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.opened = self.loop.time()
        self._arm()
        if len(self.connections) > self.limit:
            self._close_oldest_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._reading is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state in RECEIVED:
            self._disarm()

    def evictable(self) -> bool:
        """Nothing to lose but what the client has yet to send: idle between requests, or a
        head or body still arriving (a body the application waits for counts too)."""
        return self.conn.their_state in WAITING_FOR_CLIENT

    def _arm(self) -> None:
        self._disarm()
        self._reading = self.loop.call_later(self.read_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None

    def _too_slow(self) -> None:
        self._reading = None
        if self.conn.their_state not in RECEIVED and not self.transport.is_closing():
            self.transport.close()

    def _close_oldest_waiting(self) -> None:
        waiting = [c for c in self.connections
                   if isinstance(c, BoundedH11Protocol) and c is not self and c.evictable()]
        if waiting:
            oldest = min(waiting, key=lambda c: c.opened)
            if not oldest.transport.is_closing():
                oldest.transport.close()


def bounded(read_timeout: float, limit: int) -> type[BoundedH11Protocol]:
    """The protocol class for one server (uvicorn takes a class, not an instance)."""
    return type("BoundedH11", (BoundedH11Protocol,),
                {"read_timeout": read_timeout, "limit": limit})
