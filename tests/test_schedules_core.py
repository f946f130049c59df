"""Schedules without a database: planned times (months, time zones, daylight saving), the
catch-up rule (core/calendar.py) and the declaration's checks, on an injected clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from workledger import Ledger
from workledger.core.calendar import LATE, plan
from workledger.errors import UsageError
from workledger.schedules import declare

pytestmark = pytest.mark.unit

BERLIN = ZoneInfo("Europe/Berlin")


def _fn(fire: datetime) -> dict[str, str]:
    return {"period": fire.strftime("%Y-%m")}


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_a_monthly_cron_in_berlin_fires_at_six_local_on_the_25th_summer_and_winter() -> None:
    s = declare(_fn, "payroll", "0 6 25 * *", tz="Europe/Berlin")
    times = s.times_from(utc(2026, 5, 1))
    assert [next(times) for _ in range(3)] == [
        datetime(2026, 5, 25, 6, tzinfo=BERLIN), datetime(2026, 6, 25, 6, tzinfo=BERLIN),
        datetime(2026, 7, 25, 6, tzinfo=BERLIN)]
    december = s.next_after(utc(2026, 11, 26))
    assert december.astimezone(UTC) == utc(2026, 12, 25, 5)  # CET: UTC+1
    assert s.next_after(utc(2026, 6, 1)).astimezone(UTC) == utc(2026, 6, 25, 4)  # CEST: UTC+2


def test_a_time_the_spring_clock_change_skips_fires_when_the_clock_jumps_past_it() -> None:
    s = declare(_fn, "nightly", "30 2 * * *", tz="Europe/Berlin")
    # 2026-03-29: 02:00 becomes 03:00 in Berlin; cronsim (like Debian's cron) fires at 03:00
    found = s.next_after(datetime(2026, 3, 29, 1, 0, tzinfo=BERLIN))
    assert found.astimezone(UTC) == utc(2026, 3, 29, 1, 0)
    # a time the autumn change repeats (02:30 twice on 2026-10-25) fires once
    autumn = list(_take(s.times_from(datetime(2026, 10, 24, 12, tzinfo=BERLIN)), 3))
    assert [t.date().day for t in autumn] == [25, 26, 27]


def _take(it, n):  # type: ignore[no-untyped-def]
    for _ in range(n):
        yield next(it)


def test_every_is_aligned_to_multiples_of_its_interval_since_the_epoch() -> None:
    s = declare(_fn, "j", "every 5m")
    assert s.next_after(utc(2026, 1, 1, 10, 2, 30)) == utc(2026, 1, 1, 10, 5)
    assert s.next_after(utc(2026, 1, 1, 10, 5)) == utc(2026, 1, 1, 10, 10)
    assert list(_take(s.times_from(utc(2026, 1, 1, 10, 5)), 2)) == [
        utc(2026, 1, 1, 10, 5), utc(2026, 1, 1, 10, 10)]
    day = declare(_fn, "d", "every 1d", tz="Europe/Berlin")
    assert day.next_after(utc(2026, 1, 1, 10)).astimezone(UTC) == utc(2026, 1, 2)


def test_the_default_key_is_the_name_at_the_fire_time_in_utc() -> None:
    s = declare(_fn, "payroll", "0 6 25 * *", tz="Europe/Berlin", name="monthly")
    fire = datetime(2026, 12, 25, 6, tzinfo=BERLIN)
    assert s.default_key(fire) == "monthly@2026-12-25T05:00:00Z"
    assert s.call(fire) == ({"period": "2026-12"}, "monthly@2026-12-25T05:00:00Z")
    keyed = declare(lambda f: ({"p": 1}, f.strftime("%Y-%m")), "payroll", "every 1d",
                    name="k", tz="Europe/Berlin")
    assert keyed.call(fire) == ({"p": 1}, "2026-12")
    assert declare(lambda f: None, "payroll", "every 1d", name="n").call(fire) is None


def _times(spec: str):  # type: ignore[no-untyped-def]
    return declare(_fn, "j", spec).times_from


def test_catch_up_latest_submits_only_the_most_recent_missed_firing() -> None:
    now = utc(2026, 1, 1, 10, 0, 7)
    got = plan(utc(2026, 1, 1, 10, 0, 0), now, _times("every 2s"), "latest", 86400)
    assert [(s.fire_at, s.expected, s.next_at, s.missed) for s in got.steps] == [
        (utc(2026, 1, 1, 10, 0, 6), utc(2026, 1, 1, 10, 0, 0), utc(2026, 1, 1, 10, 0, 8), 3)]


def test_catch_up_all_submits_each_missed_firing_once_oldest_first_chained() -> None:
    now = utc(2026, 1, 1, 10, 0, 7)
    got = plan(utc(2026, 1, 1, 10, 0, 0), now, _times("every 2s"), "all", 86400)
    assert [s.fire_at.second for s in got.steps] == [0, 2, 4, 6]
    # each firing moves the schedule on from where the one before left it
    assert [(s.expected.second, s.next_at.second) for s in got.steps] == [
        (0, 2), (2, 4), (4, 6), (6, 8)]
    few = plan(utc(2026, 1, 1, 10, 0, 0), now, _times("every 2s"), "all", 86400, per_pass=2)
    assert [s.fire_at.second for s in few.steps] == [0, 2]
    assert few.steps[-1].next_at == utc(2026, 1, 1, 10, 0, 4)  # the rest at the next pass


def test_catch_up_none_submits_only_a_firing_found_on_time() -> None:
    times = _times("every 1h")
    on_time = plan(utc(2026, 1, 1, 10), utc(2026, 1, 1, 10, 0, 5), times, "none", 86400)
    assert [s.fire_at for s in on_time.steps] == [utc(2026, 1, 1, 10)]
    late = plan(utc(2026, 1, 1, 7), utc(2026, 1, 1, 10, 5), times, "none", 86400)
    assert late.steps == () and late.skip_to == utc(2026, 1, 1, 11) and late.missed == 4
    # downtime that passed over a firing: not even the latest, however recent
    down = plan(utc(2026, 1, 1, 9), utc(2026, 1, 1, 10, 0, 1), times, "none", 86400)
    assert down.steps == () and down.missed == 2
    slow = plan(utc(2026, 1, 1, 10), utc(2026, 1, 1, 10, 2), times, "none", 86400)
    assert slow.steps == () and slow.missed == 1  # found two minutes late
    assert LATE == 60.0


def test_firings_older_than_the_window_are_missed_whatever_the_rule() -> None:
    times = _times("every 1h")
    got = plan(utc(2026, 1, 1, 0), utc(2026, 1, 3, 0, 30), times, "all", 3600)
    assert [s.fire_at for s in got.steps] == [utc(2026, 1, 3, 0)]
    assert got.steps[0].missed == 48


@pytest.mark.parametrize("spec", ["every 1s", "* * * * *"])
def test_latest_after_a_long_downtime_jumps_to_the_last_time_without_walking_them_all(
        spec: str) -> None:
    s = declare(_fn, "j", spec)
    walked = []

    def times(t: datetime):  # type: ignore[no-untyped-def]
        for x in s.times_from(t):
            walked.append(x)
            yield x

    now = utc(2026, 1, 1, 0, 0, 30, 500)
    start = now - timedelta(days=300)
    got = plan(start, now, times, "latest", 366 * 86400, last=s.last_at_or_before)
    last = utc(2026, 1, 1, 0, 0, 30) if spec == "every 1s" else utc(2026, 1, 1)
    [step] = got.steps
    assert (step.fire_at, step.expected) == (last, start)
    assert step.next_at == s.next_after(now) and step.missed >= 100_000
    assert len(walked) <= 100_002  # not 26 million seconds
    none = plan(start, now, times, "none", 366 * 86400, last=s.last_at_or_before)
    assert none.steps == () and none.skip_to == s.next_after(now)


def test_the_last_planned_time_at_or_before_a_moment() -> None:
    cron = declare(_fn, "j", "0 6 25 * *", tz="Europe/Berlin")
    assert cron.last_at_or_before(utc(2026, 12, 25, 5)) == utc(2026, 12, 25, 5)
    assert cron.last_at_or_before(utc(2026, 12, 25, 4, 59)) == utc(2026, 11, 25, 5)
    every = declare(_fn, "j", "every 10s")
    assert every.last_at_or_before(utc(2026, 1, 1, 0, 0, 19)) == utc(2026, 1, 1, 0, 0, 10)


def test_a_key_submit_would_refuse_is_refused_by_the_schedule_too() -> None:
    from workledger.errors import BadInput

    s = declare(lambda fire: ({"a": 1}, "k" * 10_000), "j", "every 1s")
    with pytest.raises(BadInput, match="key"):
        s.call(utc(2026, 1, 1))
    bad = declare(lambda fire: ({"a": 1}, "bad\x00key"), "j", "every 1s")
    with pytest.raises(BadInput):
        bad.call(utc(2026, 1, 1))


def test_nothing_is_due_before_the_next_fire_time() -> None:
    got = plan(utc(2026, 1, 1, 11), utc(2026, 1, 1, 10), _times("every 1h"), "all", 86400)
    assert got.steps == () and got.skip_to is None


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"spec": "61 * * * *"}, "spec"),
    ({"spec": "0 6 25 *"}, "spec"),
    ({"spec": "0 0 6 25 * *"}, "spec"),
    ({"spec": "every 0s"}, "spec"),
    ({"spec": "every five minutes"}, "spec"),
    ({"spec": "every 1s", "tz": "Mars/Olympus"}, "tz"),
    ({"spec": "every 1s", "catch_up": "some"}, "catch_up"),
    ({"spec": "every 1s", "overlap": "queue"}, "overlap"),
    ({"spec": "every 1s", "catch_up_window": "forever"}, "catch_up_window"),
    ({"spec": "every 367d"}, "spec"),
    ({"spec": "every 99999999999999d"}, "spec"),
    ({"spec": "every 1s", "catch_up_window": "400d"}, "catch_up_window"),
    ({"spec": "every 1s", "catch_up_window": "0s"}, "catch_up_window"),
])
def test_a_declaration_the_parser_or_the_rules_refuse_names_its_field(
        kwargs: dict[str, str], field: str) -> None:
    spec = kwargs.pop("spec")
    with pytest.raises(UsageError) as caught:
        declare(_fn, "j", spec, **kwargs)
    assert field in str(caught.value)


def test_two_schedules_of_one_name_in_a_ledger_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    a, b = ledger.job("a"), ledger.job("b")
    a.schedule("every 1h")(_fn)
    with pytest.raises(UsageError, match="name"):
        b.schedule("every 2h")(_fn)
    b.schedule("every 2h", name="other")(_fn)
    assert [s.name for s in b.schedules] == ["other"]
    with pytest.raises(UsageError, match="deadline"):
        ledger.job("c", deadline="soon")


def test_a_job_deadline_is_a_duration(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    job = ledger.job("p", deadline="6h", deadline_warning="30m")
    assert (job.deadline, job.deadline_warning) == (6 * 3600, 1800)
    assert timedelta(seconds=job.deadline) == timedelta(hours=6)
