"""Loaded only by a worker the campaign runs with a skewed clock (processes.faketime_env).

Debian's libfaketime 0.9.10 breaks ``time.sleep`` when only the wall clock is faked
(``FAKETIME_DONT_FAKE_MONOTONIC=1``): CPython sleeps with ``clock_nanosleep(CLOCK_MONOTONIC,
TIMER_ABSTIME, ...)``, libfaketime moves that absolute deadline by the wall clock's offset, and
the call fails with EINVAL. Faking the monotonic clock as well is worse: every timed wait of a
lock or an event then hangs. So the wall clock alone is faked and ``time.sleep`` waits in
``select``, which libfaketime leaves alone: the same sleep, on the same monotonic clock, as on
a host whose wall clock is wrong. Nothing else of the process is changed.
"""

from __future__ import annotations

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
