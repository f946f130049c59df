"""Cluster-wide limits of a stage (``@job.stage(rate_limit="50/s", max_in_flight=K)``): the
parsing of a rate and the token bucket's arithmetic, as plain functions.

The bucket itself is a row of ``wl_stage_limits`` taken under its row lock in the claim
transaction (docs/design.md, "How a worker runs": rate limits and caps); these functions
decide, from what that row holds and the database clock, how many items a claim may take. A
bucket holds at most ``burst`` tokens and gains ``rate`` tokens a second; one claimed item
spends one token. So in any window of ``T`` seconds at most ``burst + rate * T`` items are
claimed, and in any window of one unit of the rate (a second for ``"50/s"``) at most
``N + burst - 1``: with a burst of 1, never more than ``N``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from workledger.core.durations import UNIT_SECONDS

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([smh])\s*$")


@dataclass(frozen=True)
class Rate:
    """``count`` items per ``per`` seconds, e.g. ``Rate(50, 1.0)`` for ``"50/s"``."""

    count: float
    per: float
    text: str

    @property
    def per_second(self) -> float:
        return self.count / self.per


def parse_rate(text: object) -> Rate:
    """``"50/s"``, ``"600/m"``, ``"1000/h"`` (a positive number per second, minute or hour);
    ValueError with the accepted forms for anything else."""
    found = _RATE.match(text) if isinstance(text, str) else None
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(f"rate_limit must look like '50/s', '600/m' or '1000/h' (a positive "
                         f"number per second, minute or hour), not {text!r}")
    return Rate(float(found.group(1)), UNIT_SECONDS[found.group(2)], found.group(0).strip())


def tokens_now(tokens: float, elapsed: float, rate: float | None, burst: float) -> float:
    """The bucket's tokens after ``elapsed`` seconds of refill, never above ``burst`` (and with
    no rate, always ``burst``: a stage limited only by ``max_in_flight``). A clock that went
    back (``elapsed`` below 0) refills nothing."""
    if rate is None:
        return burst
    return min(burst, tokens + rate * max(0.0, elapsed))


def allowance(tokens: float, in_flight: int, max_in_flight: int | None, want: int) -> int:
    """How many items a claim may take: whole tokens, the room under the cap, what it wants."""
    room = want if max_in_flight is None else max(0, max_in_flight - in_flight)
    return max(0, min(want, room, math.floor(tokens + 1e-9)))



# -- a broker's held-back messages ------------------------------------------------------------

CAP_WAIT = 0.1  # seconds a message held back by a full cap waits: nothing says when a slot frees
SHORT_WAIT = 0.25  # at most this long a held message short of its token waits for it in place


@dataclass(frozen=True)
class HoldPlan:
    """What becomes of the items a broker task's claim of a limited stage left.

    ``wait`` above 0: the message was held for now and is short of its tokens by a moment (the
    bucket lost what a late message before it could not spend); its task waits that long and
    claims again, holding nothing. Otherwise ``groups``: ``(items, seconds from now)``, each
    one message held by the broker until then, and ``horizon``: seconds from now until which
    the bucket's refill is promised to held messages (None: unchanged)."""

    wait: float = 0.0
    groups: tuple[tuple[int, float], ...] = ()
    horizon: float | None = None


def hold_plan(n: int, tokens: float, horizon: float, rate: float | None, burst: float, *,
              capped: bool, may_wait: bool = False) -> HoldPlan:
    """The plan for ``n`` held-back items of a stage whose bucket holds ``tokens`` now and has
    promised its refill until ``horizon`` seconds from now (at or below 0: to nobody).

    A cap (``capped``, or no rate) holds them all ``CAP_WAIT``. A bucket serves them in groups
    of ``burst`` items (what it holds at most), each due when the bucket will have refilled
    its tokens after every message held before it: one message per group, delivered when it
    can be served, so successive held-back messages are spaced at the rate instead of all
    trying again at once. ``may_wait``: the items' own message was the one held for now."""
    if n <= 0:
        return HoldPlan()
    if capped or rate is None:
        return HoldPlan(groups=((n, CAP_WAIT),))
    size = max(1, int(burst))
    first = min(size, n)
    short = (first - tokens) / rate
    if may_wait and short <= min(SHORT_WAIT, first / rate):
        return HoldPlan(wait=max(0.001, short))
    at = max(horizon, -tokens / rate)  # when the tokens not promised yet were (or will be) 0
    groups = []
    while n > 0:
        take = min(size, n)
        at += take / rate
        groups.append((take, max(0.001, at)))
        n -= take
    return HoldPlan(groups=tuple(groups), horizon=at)


# A claim of a stage with max_per_key reads up to this many times its chunk of pending rows
# (past the keys already full) to find its chunk: rows of a key beyond its free slots are
# passed over, so a run's first rows of one busy key do not keep the other keys behind them.
KEYED_WINDOW = 10

def pick_by_key(rows: Iterable[tuple[int, str | None]], busy: Mapping[str, int],
                max_per_key: int, want: int) -> list[int]:
    """The ids a claim of a stage with ``max_per_key`` takes, in the rows' (id) order: a row
    without a key always, a row of a key while the key's claimed rows (``busy``, counted from
    the claimed rows themselves) and the ones taken here are fewer than ``max_per_key``;
    ``want`` at most. A row of a full key is passed over, never a stop: the rows behind it
    are still taken."""
    taken: list[int] = []
    used: dict[str, int] = {}
    for item_id, key in rows:
        if len(taken) >= want:
            break
        if key is not None:
            n = used.get(key, busy.get(key, 0))
            if n >= max_per_key:
                continue
            used[key] = n + 1
        taken.append(item_id)
    return taken
