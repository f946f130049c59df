"""Runs on a calendar: what a schedule declares (``@job.schedule``) and when it plans to fire.

A public module, like :mod:`workledger.jobs`: the declaration and its planned times, with none
of the firing (``_runtime/repair/calendar.py``, run by the sweeper that leads). A spec is a
5-field cron expression, read by `cronsim <https://pypi.org/project/cronsim/>`_ (which follows
Debian's cron, daylight saving included: a time that a clock change skips fires when the clock
jumps past it, a time it repeats fires once), or ``"every 30s"``, ``"every 5m"``, ``"every
2h"``, ``"every 1d"``: whole multiples of the interval since the Unix epoch (in UTC, whatever
the time zone). Every planned time is a timezone-aware datetime.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from workledger.core.durations import BadDuration, parse_duration
from workledger.core.limits import KEY_BYTES, NAME_BYTES, text_problem
from workledger.errors import BadInput, UsageError

CATCH_UP = ("all", "latest", "none")
OVERLAP = ("skip", "allow", "wait")
_EVERY = re.compile(r"^\s*every\s+(\d+)\s*([smhd])\s*$", re.IGNORECASE)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_TICK = timedelta(microseconds=1)
LONGEST = 366 * 86400  # seconds: the longest "every" interval and catch-up window declared

# what a schedule's function returns: a payload, (payload, key), or None (no run this time)
ScheduleFn = Callable[[datetime], Any]


@dataclass(frozen=True)
class Schedule:
    """One declared schedule of a job (see :meth:`workledger.jobs.Job.schedule`)."""

    name: str
    job: str
    spec: str
    tz: str
    catch_up: str
    overlap: str
    catch_up_window: float  # seconds: firings missed longer ago than this are not submitted
    fn: ScheduleFn
    every: int | None = None  # seconds, for an "every N" spec; None for a cron expression

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def times_from(self, start: datetime) -> Iterator[datetime]:
        """The planned times at or after ``start``, in order, in the schedule's time zone."""
        zone = self.zone
        if self.every is not None:
            step = self.every
            epoch = start.timestamp()
            first = -(-int(epoch // 1) // step) * step
            if first < epoch:
                first += step
            t = first
            while True:
                yield datetime.fromtimestamp(t, UTC).astimezone(zone)
                t += step
        else:
            yield from CronSim(self.spec, (start - _TICK).astimezone(zone))

    def last_at_or_before(self, moment: datetime) -> datetime:
        """The last planned time at or before ``moment`` (what catch_up "latest" wants after a
        long downtime, without walking every time in between)."""
        if self.every is not None:
            t = int(moment.timestamp() // self.every) * self.every
            return datetime.fromtimestamp(t, UTC).astimezone(self.zone)
        return next(CronSim(self.spec, (moment + _TICK).astimezone(self.zone), reverse=True))

    def next_after(self, moment: datetime) -> datetime:
        """The first planned time strictly after ``moment``."""
        return next(self.times_from(moment + _TICK))

    def default_key(self, fire: datetime) -> str:
        """``<name>@<the fire time, ISO 8601 in UTC>``: one run per period by construction."""
        return f"{self.name}@{fire.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"

    def call(self, fire: datetime) -> tuple[Any, str] | None:
        """What the function asks for this firing: ``(payload, key)``, or None (no run). A key
        ``submit`` would refuse is refused here too (:class:`BadInput`)."""
        answer = self.fn(fire.astimezone(self.zone))
        if answer is None:
            return None
        if isinstance(answer, tuple):
            if len(answer) != 2:
                raise UsageError(f"schedule {self.name!r}: its function returned a tuple of "
                                 f"{len(answer)}; return a payload, (payload, key), or None")
            payload, key = answer
            key = self.default_key(fire) if key is None else str(key)
        else:
            payload, key = answer, self.default_key(fire)
        problem = text_problem("key", key, KEY_BYTES)
        if problem is not None:
            raise BadInput(f"schedule {self.name!r}: {problem}")
        return payload, key

    def same_as(self, spec: str, tz: str) -> bool:
        """Whether a recorded schedule is this declaration (its spec and time zone)."""
        return (spec, tz) == (self.spec, self.tz)


def declare(fn: ScheduleFn, job: str, spec: str, *, tz: str = "UTC", catch_up: str = "latest",
            overlap: str = "skip", catch_up_window: str = "1d",
            name: str | None = None) -> Schedule:
    """A checked declaration; :class:`UsageError` naming the field for anything it refuses."""
    found = name if name is not None else getattr(fn, "__name__", None)
    what = f"schedule {found!r} of job {job!r}"
    if not isinstance(found, str):
        raise UsageError(f"{what}: name: give name= (the function has no __name__)")
    problem = text_problem("schedule name", found, NAME_BYTES)
    if problem is not None:
        raise UsageError(f"{what}: name: {problem}")
    if not callable(fn):
        raise UsageError(f"{what}: the schedule decorates a function, not {type(fn).__name__}")
    if catch_up not in CATCH_UP:
        raise UsageError(f"{what}: catch_up must be one of {', '.join(CATCH_UP)}, "
                         f"not {catch_up!r}")
    if overlap not in OVERLAP:
        raise UsageError(f"{what}: overlap must be one of {', '.join(OVERLAP)}, not {overlap!r}")
    try:
        window = parse_duration(catch_up_window)
    except BadDuration as exc:
        raise UsageError(f"{what}: catch_up_window: {exc}") from None
    if not 0 < window <= LONGEST:
        raise UsageError(f"{what}: catch_up_window: above 0 and at most 366d, "
                         f"not {catch_up_window!r}")
    if not isinstance(tz, str):
        raise UsageError(f"{what}: tz must be a time zone name like 'Europe/Berlin', "
                         f"not {tz!r}")
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise UsageError(f"{what}: tz: unknown time zone {tz!r}") from None
    every = _every(spec, what)
    if every is None:
        _check_cron(spec, zone, what)
    return Schedule(found, job, spec.strip(), tz, catch_up, overlap, window, fn, every)


def _every(spec: object, what: str) -> int | None:
    if not isinstance(spec, str):
        raise UsageError(f"{what}: spec must be a cron expression or 'every N<s|m|h|d>', "
                         f"not {spec!r}")
    found = _EVERY.match(spec)
    if found is None:
        if spec.strip().lower().startswith("every"):
            raise UsageError(f"{what}: spec {spec!r}: expected 'every' and a whole number with "
                             "a unit: every 30s, every 5m, every 2h, every 1d")
        return None
    seconds = int(found.group(1)) * _UNIT[found.group(2).lower()]
    if not 0 < seconds <= LONGEST:
        raise UsageError(f"{what}: spec {spec!r}: the interval must be above 0 and at most "
                         "366 days")
    return seconds


def _check_cron(spec: str, zone: ZoneInfo, what: str) -> None:
    if len(spec.split()) != 5:
        raise UsageError(f"{what}: spec {spec!r}: a cron expression has 5 fields (minute hour "
                         "day-of-month month day-of-week)")
    try:
        next(iter(CronSim(spec, datetime(2000, 1, 1, tzinfo=zone))))
    except CronSimError as exc:
        raise UsageError(f"{what}: spec {spec!r}: {exc}") from None
    except StopIteration:
        raise UsageError(f"{what}: spec {spec!r} never fires") from None
