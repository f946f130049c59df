"""Leases renewed from a thread of their own, for what a chunk's wait loop does not hold: an
item whose handler ran past its time limit and has not ended yet, and a closing hook's entry
while its hook runs (docs/design.md, invariant 5: every item a holder holds is renewed while
it holds it, whatever it is waiting for).

The thread renews every third of the lease and stops when nothing is held; a renewal that
fails (an outage) is tried again at the next period, and the fenced write is what decides:
a lease that was taken back meanwhile is not extended (its token no longer matches).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from workledger.storage.port import LeaseParams, Store

log = logging.getLogger("workledger.worker")


class Renewal:
    """The leases this holder keeps: ``(run_id, token) -> item ids``."""

    def __init__(self, store: Store, lease: float, name: str = "wl-renewal",
                 on_wake: Callable[[], None] | None = None) -> None:
        self.store = store
        self.lease = lease
        self.name = name
        self.on_wake = on_wake  # called at every wake-up, before the renewal (poke wakes it)
        self._held: dict[tuple[int, int], set[int]] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, run_id: int, token: int, ids: Iterable[int]) -> None:
        with self._lock:
            self._held.setdefault((run_id, token), set()).update(ids)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def drop(self, run_id: int, token: int, ids: Iterable[int]) -> None:
        with self._lock:
            held = self._held.get((run_id, token))
            if held is None:
                return
            held.difference_update(ids)
            if not held:
                del self._held[(run_id, token)]
                self._changed.set()

    def poke(self) -> None:
        """Wake the thread now: ``on_wake`` has something to do."""
        self._changed.set()

    def renew(self) -> None:
        """Renew everything held now (the thread's period's work)."""
        with self._lock:
            held = [(key, sorted(ids)) for key, ids in self._held.items()]
        for (run_id, token), ids in held:
            try:
                self.store.items_heartbeat(LeaseParams(run_id, ids, token, self.lease))
            except Exception as exc:  # noqa: BLE001 - the next period tries again
                log.warning("run %s: could not renew %d lease(s): %s", run_id, len(ids), exc)

    def _run(self) -> None:
        due = time.monotonic() + self.lease / 3
        while True:
            self._changed.wait(max(0.0, due - time.monotonic()))
            self._changed.clear()
            if self.on_wake is not None:
                try:
                    self.on_wake()
                except Exception:  # noqa: BLE001 - logged; the next wake-up tries again
                    log.exception("%s: could not write what it was woken for", self.name)
            with self._lock:
                if not self._held:
                    self._thread = None
                    return
            if time.monotonic() >= due:
                self.renew()
                due = time.monotonic() + self.lease / 3


@contextmanager
def renewing(store: Store, lease: float, run_id: int, token: int, ids: Iterable[int]
             ) -> Iterator[Renewal]:
    """Hold ``ids``'s leases renewed for the duration of the block."""
    renewal = Renewal(store, lease, name="wl-hook-lease")
    ids = list(ids)
    renewal.hold(run_id, token, ids)
    try:
        yield renewal
    finally:
        renewal.drop(run_id, token, ids)
