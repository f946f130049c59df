"""Firing schedules: a step of every sweeper pass (docs/design.md, "Schedules and deadlines").

The sweeper that leads calls :meth:`Firer.fire_due` first in its pass, so the runs it records
are decomposed by the same pass (they are recorded deferred, like a run submitted inside the
caller's transaction). Each firing is one transaction with the schedule's next fire time
(``Store.schedule_fire``): two sweepers, two machines or a restart never record one firing
twice, and the run's key (``<schedule>@<fire time>`` by default) makes a second run of one
period impossible even by hand. The same step notes the runs that passed their deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from workledger.core import calendar
from workledger.core.text import reason_text
from workledger.errors import BadInput, DatabaseUnavailable, UnknownSchedule
from workledger.jobs import Job, canonical_json
from workledger.results import ScheduleStatus
from workledger.schedules import Schedule
from workledger.storage.port import (
    Deadline,
    Fired,
    Firing,
    NewRun,
    ScheduleDecl,
    ScheduleRow,
    Store,
)

log = logging.getLogger("workledger.schedules")

DEADLINES_PER_PASS = 100
FIRE_BUDGET = 2.0  # seconds of schedule functions per pass: the sweep's other steps come next


@dataclass
class FireReport:
    submitted: int = 0
    skipped: int = 0  # blocked by an open run (or a firing already waiting)
    waiting: int = 0
    none: int = 0
    failed: int = 0  # the schedule's function raised
    missed: int = 0
    deadlines_missed: int = 0
    runs: list[int] = field(default_factory=list)

    def add(self, fired: Fired) -> None:
        if fired.state in ("submitted", "skipped", "waiting", "none"):
            setattr(self, fired.state, getattr(self, fired.state) + 1)
        if fired.state == "submitted" and fired.run_id is not None:
            self.runs.append(fired.run_id)


def new_run(job: Job, schedule: Schedule, fire: datetime) -> NewRun | None:
    """The run a firing asks for (None: the function said no run); the job's deadline counts
    from the planned time."""
    asked = schedule.call(fire)
    if asked is None:
        return None
    payload, key = asked
    deadline = None
    if job.deadline is not None:
        deadline = Deadline(at=fire + timedelta(seconds=job.deadline),
                            warn_before=job.deadline_warning)
    return NewRun(job.name, key, canonical_json(payload), float(job.tolerate),
                  closing=job.closing is not None, deadline=deadline)


def _owed_since(row: ScheduleRow | None) -> datetime:
    """The oldest time a schedule's row owes (its waiting firing or its next one)."""
    times = [] if row is None else [t for t in (row.waiting_fire_at, row.next_fire_at) if t]
    return min(times, default=datetime.max.replace(tzinfo=UTC))


def declarations(jobs: Mapping[str, Job], now: datetime) -> list[ScheduleDecl]:
    found = []
    for s in (s for job in jobs.values() for s in job.schedules):
        try:
            found.append(ScheduleDecl(s.name, s.job, s.spec, s.tz, s.next_after(now)))
        except (StopIteration, ValueError, OverflowError) as exc:  # never fires again
            log.warning("schedule %s: no planned time after %s (%s); not recorded", s.name,
                        now.isoformat(), exc)
    return found


class Firer:
    """The schedules of a sweeper's jobs, fired by the pass that finds them due."""

    def __init__(self, store: Store, jobs: Mapping[str, Job], actor: str) -> None:
        self.store = store
        self.jobs = dict(jobs)
        self.actor = actor
        self.schedules = [s for job in self.jobs.values() for s in job.schedules]
        self._declared = False
        # whether this process's declarations replace recorded ones: only a worker's long-lived
        # sweep loop (SweepLoop sets it), never a hand sweep, the CLI, the API or serve, whose
        # app may be older than the workers'
        self.replace = False
        self._other: set[str] = set()  # schedules recorded by another declaration (warned)
        self.next_due: float | None = None  # seconds from the last pass to the next firing

    def fire_due(self) -> FireReport:
        report = FireReport()
        if self.schedules:
            self._fire_schedules(report)
        ids = self.store.runs_mark_deadline_missed(self.actor, DEADLINES_PER_PASS)
        for run_id in ids:
            log.warning("run %s missed its deadline", run_id)
        report.deadlines_missed = len(ids)
        return report

    def _fire_schedules(self, report: FireReport) -> None:
        now = self.store.db_now()
        if not self._declared:
            # a worker's declarations replace what was recorded (a deploy changed a spec); a
            # process still on another declaration then leaves the schedule to this one
            self.store.schedules_declare(declarations(self.jobs, now), replace=self.replace)
            self._declared = True
        rows = {r.name: r for r in self.store.schedules_all()}
        budget = time.monotonic() + FIRE_BUDGET
        # the longest owed first: a slow function that spends the budget every pass is last
        # at the next, so it never starves the schedules after it
        owed = sorted(self.schedules, key=lambda s: _owed_since(rows.get(s.name)))
        for schedule in owed:
            row = rows.get(schedule.name)
            if row is None or row.paused_at is not None or not self._mine(schedule, row):
                continue
            if time.monotonic() > budget:  # slow functions: the rest at the next pass
                log.warning("schedules: firing took over %gs this pass; the rest waits for "
                            "the next", FIRE_BUDGET)
                break
            try:
                self._fire_one(schedule, row, now, report, budget)
            except DatabaseUnavailable:
                raise
            except Exception:  # one schedule must not stop the others; the next pass retries
                log.exception("schedule %s: firing failed", schedule.name)
        upcoming = [r.next_fire_at for r in self.store.schedules_all()
                    if r.name in rows and r.paused_at is None and r.next_fire_at is not None
                    and any(s.name == r.name and self._mine(s, r, quiet=True)
                            for s in self.schedules)]
        self.next_due = (max((min(upcoming) - now).total_seconds(), 0.0) if upcoming else None)

    def overdue(self) -> list[ScheduleRow]:
        """This process's schedules (as it declares them) whose next firing is due: what a
        leading sweeper fires (or records skipped) now."""
        now = self.store.db_now()
        declared = {s.name: s for s in self.schedules}
        return [r for r in self.store.schedules_all()
                if r.name in declared and self._mine(declared[r.name], r, quiet=True)
                and r.paused_at is None
                and r.next_fire_at is not None and r.next_fire_at <= now]

    def _mine(self, schedule: Schedule, row: ScheduleRow, quiet: bool = False) -> bool:
        """Whether the recorded schedule is this process's declaration; another process (on
        another version of the app) may have declared it since: that one fires it."""
        if row.job == schedule.job and schedule.same_as(row.spec, row.tz):
            return True
        if not quiet and schedule.name not in self._other:
            self._other.add(schedule.name)
            log.warning("schedule %s is recorded as %r (%s) of job %s, not as this process "
                        "declares it (%r, %s): a process with that declaration fires it; "
                        "this one does not", schedule.name, row.spec, row.tz, row.job,
                        schedule.spec, schedule.tz)
        return False

    def _fire_one(self, schedule: Schedule, row: ScheduleRow, now: datetime,
                  report: FireReport, budget: float) -> None:
        job = self.jobs[schedule.job]
        if row.waiting_fire_at is not None and (
                self.store.schedule_open_run(schedule.name, schedule.job) is None):
            self._record(job, schedule, row.waiting_fire_at, report, from_waiting=True)
        if row.next_fire_at is None:
            return
        steps = calendar.plan(row.next_fire_at, now, schedule.times_from, schedule.catch_up,
                              schedule.catch_up_window, last=schedule.last_at_or_before)
        if not steps.steps and steps.skip_to is not None:
            if self.store.schedule_advance(schedule.name, row.next_fire_at, steps.skip_to,
                                           steps.missed):
                report.missed += steps.missed
                if steps.missed:
                    log.info("schedule %s: %d firing(s) missed (catch_up=%s, window %gs)",
                             schedule.name, steps.missed, schedule.catch_up,
                             schedule.catch_up_window)
            return
        for step in steps.steps:
            if time.monotonic() > budget:
                return  # the rest at the next pass: the schedule waits where it is
            if not self._record(job, schedule, step.fire_at, report,
                                advance=(step.expected, step.next_at), missed=step.missed):
                return  # another sweeper moved it, or the function failed: stop here
            report.missed += step.missed

    def _record(self, job: Job, schedule: Schedule, fire: datetime, report: FireReport, *,
                advance: tuple[datetime, datetime] | None = None, missed: int = 0,
                from_waiting: bool = False) -> bool:
        """Record one firing; False if nothing was written (a race, a failed function)."""
        try:
            run = new_run(job, schedule, fire)
        except Exception as exc:  # the user's function: recorded, tried again next pass
            error = reason_text(f"the schedule's function raised {type(exc).__name__}: {exc}")
            log.warning("schedule %s, firing %s: %s", schedule.name, fire.isoformat(), error)
            self.store.schedule_firing_failed(schedule.name, fire, error, self.actor)
            report.failed += 1
            return False
        fired = self.store.schedule_fire(Firing(
            schedule.name, job.name, fire, self.actor, run, schedule.overlap, advance, missed,
            from_waiting))
        report.add(fired)
        if fired.state == "submitted":
            log.info("schedule %s fired at %s: run %s%s", schedule.name, fire.isoformat(),
                     fired.run_id, "" if fired.created else " (its key named it already)")
        elif fired.state in ("skipped", "waiting"):
            log.info("schedule %s, firing %s %s: run %s of the schedule is not complete",
                     schedule.name, fire.isoformat(), fired.state, fired.run_id)
        return fired.state != "raced"


def fire_by_hand(store: Store, job: Job, schedule: Schedule, times: Sequence[datetime],
                 actor: str, overlap: str | None = None) -> list[tuple[datetime, Fired]]:
    """``schedule fire`` and ``schedule backfill``: each time recorded at most once (a time
    recorded before answers ``recorded``); a function that raises is recorded as failed."""
    done: list[tuple[datetime, Fired]] = []
    for fire in times:
        try:
            run = new_run(job, schedule, fire)
        except Exception as exc:
            error = reason_text(f"the schedule's function raised {type(exc).__name__}: {exc}")
            store.schedule_firing_failed(schedule.name, fire, error, actor)
            done.append((fire, Fired("failed", was=error)))
            continue
        done.append((fire, store.schedule_fire(Firing(
            schedule.name, job.name, fire, actor, run, overlap or schedule.overlap))))
    return done


# -- what the operator asks (the facade's schedule methods) ------------------------------------


BACKFILL_MAX = 10_000  # firings one backfill records without --yes (and at most over HTTP)
BACKFILL_LIMIT = 1_000_000  # firings one backfill records even with --yes: split the interval


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(UTC).isoformat()


def declared(jobs: Mapping[str, Job]) -> dict[str, Schedule]:
    return {s.name: s for job in jobs.values() for s in job.schedules}


def statuses(store: Store, jobs: Mapping[str, Job],
             state_of: Callable[[int], str | None]) -> list[ScheduleStatus]:
    """Every schedule the ledger recorded or the app declares, by name."""
    mine = declared(jobs)
    rows = {r.name: r for r in store.schedules_all()}
    now = store.db_now() if set(mine) - set(rows) else None
    found = []
    for name in sorted(set(mine) | set(rows)):
        s, r = mine.get(name), rows.get(name)
        if r is None:
            assert s is not None and now is not None
            found.append(ScheduleStatus(name, s.job, s.spec, s.tz, s.catch_up, s.overlap, True,
                                        False, False, None, None, _iso(s.next_after(now)),
                                        None, None, None, None, 0))
            continue
        found.append(ScheduleStatus(
            name, r.job, r.spec, r.tz, s.catch_up if s else None, s.overlap if s else None,
            s is not None, True, r.paused_at is not None, r.paused_at, r.paused_by,
            _iso(r.next_fire_at), _iso(r.last_fire_at), r.last_run_id,
            state_of(r.last_run_id) if r.last_run_id is not None else None,
            _iso(r.waiting_fire_at), r.missed))
    return found


def named(jobs: Mapping[str, Job], name: str) -> Schedule:
    """The loaded app's schedule called ``name``; :class:`UnknownSchedule` otherwise."""
    found = declared(jobs).get(name)
    if found is None:
        known = ", ".join(sorted(declared(jobs))) or "none"
        raise UnknownSchedule(f"unknown schedule {name!r} (declared by the loaded app: {known})")
    return found


def declare_all(store: Store, jobs: Mapping[str, Job]) -> None:
    """Record the schedules never recorded yet; one recorded already is left as it is (the
    CLI's or the API's app may be older than the workers')."""
    store.schedules_declare(declarations(jobs, store.db_now()), replace=False)


def set_paused(store: Store, jobs: Mapping[str, Job], name: str, paused: bool,
               actor: str) -> bool:
    """Pause or resume (audited on the schedule's row: when and by whom); False if it was so
    already. A resumed schedule applies its catch-up rule to what it missed meanwhile."""
    named(jobs, name)
    declare_all(store, jobs)
    changed = store.schedule_set_paused(name, paused, actor)
    if changed:
        log.warning("schedule %s %s by %s", name, "paused" if paused else "resumed", actor)
    return changed


def fire_now(store: Store, jobs: Mapping[str, Job], name: str,
             actor: str) -> tuple[datetime, Fired]:
    """One firing now, keyed by now (to the second), under the schedule's overlap rule."""
    schedule = named(jobs, name)
    declare_all(store, jobs)
    now = store.db_now().replace(microsecond=0)
    return fire_by_hand(store, jobs[schedule.job], schedule, [now], actor)[0]


def backfill_times(jobs: Mapping[str, Job], name: str, start: datetime, end: datetime,
                   limit: int | None) -> list[datetime]:
    """Every planned time from ``start`` to ``end`` (both included); BadInput past ``limit``."""
    schedule = named(jobs, name)
    if start > end:
        raise BadInput(f"backfill: --from {start.isoformat()} is after --to {end.isoformat()}")
    cap = BACKFILL_LIMIT if limit is None else min(limit, BACKFILL_LIMIT)
    found: list[datetime] = []
    times = schedule.times_from(start)
    while True:
        try:
            t = next(times)
        except (StopIteration, ValueError, OverflowError):  # past year 9999: no more times
            if found and found[-1] < end:
                raise BadInput(f"backfill: no planned time of {name!r} after "
                               f"{found[-1].isoformat()} that a date can hold; give an "
                               f"earlier --to than {end.isoformat()}") from None
            break
        if t > end:
            break
        found.append(t)
        if len(found) > cap:
            more = ("give --yes to record them all (the CLI, the library), or record the "
                    "interval in parts" if cap < BACKFILL_LIMIT else "record the interval in parts")
            raise BadInput(f"backfill: more than {cap:,} firings from {start.isoformat()} to "
                           f"{end.isoformat()}; {more}")
    return found


def backfill(store: Store, jobs: Mapping[str, Job], name: str, times: Sequence[datetime],
             actor: str) -> list[tuple[datetime, Fired]]:
    """Every time once: a time recorded before (by a sweeper or an earlier backfill) answers
    ``recorded`` and adds nothing. Backfilled firings do not wait for each other (overlap
    ``allow``): they are history being filled in."""
    schedule = named(jobs, name)
    declare_all(store, jobs)
    return fire_by_hand(store, jobs[schedule.job], schedule, times, actor, overlap="allow")
