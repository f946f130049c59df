"""Waiting out a database outage: what every long-lived process does instead of exiting.

A worker, its sweeper, ``status --watch`` and the HTTP server call the store through
:class:`PatientStore`: a call that finds the database unavailable (a dropped connection, a
restart, a failover) is tried again with capped exponential backoff and jitter, for as long as
the outage lasts up to ``retry_for`` seconds. The outage is logged once when it starts and once
when it ends, not per attempt. Only :class:`~workledger.errors.DatabaseUnavailable` is waited
out; a :class:`~workledger.errors.Contention` (a statement or lock timeout, a deadlock) is tried
again up to ``CONTENTION_TRIES`` times; any other error is the caller's.

Every port method is one transaction, so trying one again is safe: a transaction that failed
before its commit left nothing behind, and one whose COMMIT was sent but whose answer was lost
is asked about by the store before the call fails (``storage/doubt.py``): had it committed, the
call returns its result and is not tried at all. What cannot be learned within ``retry_for``
seconds is :class:`~workledger.errors.CommitInDoubt`, never tried again (it may have done
its work); what cannot be trusted (a failover) is tried again, and the fencing every write
carries finds it out (a finish written twice is stale the second time).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from workledger.errors import CommitInDoubt, Contention, DatabaseUnavailable
from workledger.storage.delegate import DelegatingStore
from workledger.storage.port import Store

log = logging.getLogger("workledger.db")

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
FIRST_DELAY = 0.1  # seconds before the first retry
MAX_DELAY = 5.0  # the backoff's cap
CONTENTION_TRIES = 5  # tries of a call that timed out on a statement or a lock


class OutageTooLong(DatabaseUnavailable):
    """The database stayed unavailable for longer than the process was told to wait."""


class Patience:
    """Retry a call while the database is unavailable, for at most ``retry_for`` seconds of
    continuous outage. Shared by every thread of a process, so an outage is one outage."""

    def __init__(self, retry_for: float = 600.0, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        self.retry_for = retry_for
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._back_at: float | None = None  # when the last outage ended
        self.outages = 0

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def recovering(self, window: float) -> bool:
        """Down now, or back for less than ``window`` seconds."""
        back = self._back_at
        return self.down or (back is not None and self.clock() - back < window)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        delay = FIRST_DELAY
        contended = 0
        while True:
            try:
                result = fn(*args, **kwargs)
            except (OutageTooLong, CommitInDoubt):
                raise  # waited long enough; or trying again could do its work twice
            except Contention as exc:  # rolled back whole: safe to try again, a few times
                contended += 1
                if contended >= CONTENTION_TRIES:
                    raise
                log.warning("%s; trying again (%d of %d)", exc, contended + 1,
                            CONTENTION_TRIES)
                self.sleep(delay * (0.5 + self.rng.random() / 2))
                delay = min(delay * 2, MAX_DELAY)
                continue
            except DatabaseUnavailable as exc:
                waited = self._failed(exc)
                if waited > self.retry_for:
                    raise OutageTooLong(f"gave up after {waited:.0f} s without the database "
                                        f"(--db-retry-for {self.retry_for:g}): {exc}") from exc
                self.sleep(delay * (0.5 + self.rng.random() / 2))
                delay = min(delay * 2, MAX_DELAY)
                continue
            self._succeeded()
            return result

    def _failed(self, exc: DatabaseUnavailable) -> float:
        now = self.clock()
        with self._lock:
            if self._down_since is None:
                self._down_since = now
                self.outages += 1
                log.warning("database unavailable: %s; retrying for up to %g s", exc,
                            self.retry_for)
            return now - self._down_since

    def _succeeded(self) -> None:
        if self._down_since is None:  # the usual case: no lock
            return
        with self._lock:
            if self._down_since is not None:
                self._back_at = self.clock()
                log.warning("database back after %.1f s", self._back_at - self._down_since)
                self._down_since = None


class PatientStore(DelegatingStore):
    """A store whose every method but ``close`` waits out a database outage (see
    :class:`Patience`)."""

    def __init__(self, store: Store, patience: Patience) -> None:
        super().__init__(store)
        self._patience = patience
        adapter = self.innermost()
        if hasattr(adapter, "doubt_for"):  # a lost COMMIT's outcome is waited for as long
            adapter.doubt_for = patience.retry_for

    def _call(self, method: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        return self._patience.call(method, *args, **kwargs)

    @property
    def patience(self) -> Patience:
        return self._patience


def patient(store: Store, patience: Patience) -> Store:
    """``store`` with every method waiting out an outage (a no-op if it already does)."""
    if isinstance(store, PatientStore):
        return store
    return PatientStore(store, patience)
