"""Schedules and deadlines on both backends, on the real clock with second-scale schedules
(docs/design.md, "Schedules and deadlines"): real worker processes fire them, sweeper passes
in this process where the order of passes is the point, and the CLI for what an operator types."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_cli import cli_cmd, cli_env

from workledger import Item, Ledger

pytestmark = pytest.mark.integration

APP = "schedule_app:ledger"


def _ledger(url: str, *, spec: str = "every 1s", catch_up: str = "latest",
            overlap: str = "skip", fail: list[bool] | None = None,
            deadline: str | None = None) -> Ledger:
    ledger = Ledger(url)
    job = ledger.job("tick", deadline=deadline)

    @job.decompose
    def split(payload: dict[str, Any]) -> Iterator[Item]:
        for i in range(payload.get("n", 2)):
            yield Item(key=f"t{i}")

    @job.stage("work", idempotent=True)
    def work(item: Any, ctx: Any) -> None:
        return None

    @job.schedule(spec, catch_up=catch_up, overlap=overlap)
    def ticks(fire: datetime) -> dict[str, Any]:
        if fail and fail[0]:
            raise RuntimeError("the calendar service is down")
        return {"n": 2, "at": fire.isoformat()}

    return ledger


def _one_item_job(url: str, **options: Any) -> tuple[Ledger, Any]:
    """A ledger with job ``tick`` of one no-op item, for a test to add its own schedules to."""
    ledger = Ledger(url)
    job = ledger.job("tick", **options)

    @job.decompose
    def split(payload: dict[str, Any]) -> Iterator[Item]:
        yield Item(key="a")

    @job.stage("work", idempotent=True)
    def work(item: Any, ctx: Any) -> None:
        return None

    return ledger, job


def _next(ledger: Ledger) -> datetime:
    row = next(r for r in ledger.store.schedules_all() if r.name == "ticks")
    assert row.next_fire_at is not None
    return row.next_fire_at


def _until_due(ledger: Ledger) -> datetime:
    """Sleep until the schedule's next fire time has passed on the database's clock."""
    due = _next(ledger)
    while (left := (due - ledger.store.db_now()).total_seconds()) > -0.05:
        time.sleep(left + 0.06)
    return due


def _firings(ledger: Ledger) -> list[tuple[datetime, str, int | None]]:
    return [(f.fire_at, f.state, f.run_id)
            for f in reversed(ledger.store.firings_list("ticks", 1000))]


def test_a_firing_records_its_run_keyed_by_the_fire_time_and_decomposed_by_the_pass(
        db_url: str) -> None:
    with _ledger(db_url, overlap="allow") as ledger:
        ledger.sweep()  # declares: the first firing is the first planned time after now
        assert ledger.store.firings_list("ticks", 10) == []
        due = _until_due(ledger)
        report = ledger.sweep()
        assert report.fired == 1 and report.deferred == 1
        [(fire_at, state, run_id)] = _firings(ledger)
        assert (fire_at, state) == (due, "submitted")
        assert run_id is not None
        st = ledger.status(run_id)
        assert st.key == f"ticks@{due.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        assert st.total == 2  # decomposed in the same pass
        events = [e for e in ledger.store.events_list(run_id) if e.kind == "submitted"]
        assert len(events) == 1 and events[0].detail["schedule"] == "ticks"
        assert _next(ledger) == due + timedelta(seconds=1)


def test_overlap_skip_makes_no_run_while_the_previous_is_open(db_url: str) -> None:
    with _ledger(db_url, overlap="skip") as ledger:
        ledger.sweep()
        _until_due(ledger)
        ledger.sweep()
        first = _firings(ledger)[-1][2]
        _until_due(ledger)
        ledger.sweep()  # run `first` has no worker: still open
        assert _firings(ledger)[-1][1:] == ("skipped", first)
        assert len(ledger.runs()) == 1
        ledger.work(until_idle=True, lease=5)
        assert ledger.status(first).complete  # type: ignore[arg-type]
        _until_due(ledger)
        ledger.sweep()
        state, run_id = _firings(ledger)[-1][1:]
        assert state == "submitted" and run_id != first
        assert len(ledger.runs()) == 2


def test_overlap_wait_keeps_one_firing_waiting_and_submits_it_when_the_run_completes(
        db_url: str) -> None:
    with _ledger(db_url, overlap="wait") as ledger:
        ledger.sweep()
        _until_due(ledger)
        ledger.sweep()
        first = _firings(ledger)[-1][2]
        waiting_at = _until_due(ledger)
        ledger.sweep()
        assert _firings(ledger)[-1] == (waiting_at, "waiting", first)
        _until_due(ledger)
        ledger.sweep()  # at most one waits: the next is skipped
        assert _firings(ledger)[-1][1:] == ("skipped", first)
        ledger.work(until_idle=True, lease=5)
        ledger.sweep()
        by_time = {t: (state, run) for t, state, run in _firings(ledger)}
        state, run = by_time[waiting_at]
        assert state == "submitted" and run not in (None, first)
        assert ledger.status(run).key.endswith(  # type: ignore[arg-type]
            waiting_at.strftime("%Y-%m-%dT%H:%M:%SZ"))
        assert ledger.store.schedules_all()[0].waiting_fire_at is None


@pytest.mark.parametrize(("catch_up", "missed_runs"), [("all", 3), ("latest", 1), ("none", 0)])
def test_after_downtime_the_catch_up_rule_says_which_missed_firings_run(
        db_url: str, catch_up: str, missed_runs: int) -> None:
    with _ledger(db_url, catch_up=catch_up, overlap="allow") as ledger:
        ledger.sweep()
        start = _until_due(ledger)
        ledger.sweep()  # the firing at `start`, on time
        time.sleep(3.2)  # no sweeper for three periods
        ledger.sweep()
        later = [(t, s) for t, s, _ in _firings(ledger) if t > start]
        assert [s for _, s in later] == ["submitted"] * missed_runs
        if catch_up == "latest":
            assert later[0][0] == start + timedelta(seconds=3)
        row = ledger.store.schedules_all()[0]
        assert row.missed == 3 - missed_runs
        assert row.next_fire_at == start + timedelta(seconds=4)


def test_a_function_that_raises_is_recorded_failed_and_tried_again_at_the_next_pass(
        db_url: str) -> None:
    fail = [True]
    with _ledger(db_url, overlap="allow", fail=fail) as ledger:
        ledger.sweep()
        due = _until_due(ledger)
        assert ledger.sweep().firing_failures == 1
        assert _firings(ledger) == [(due, "failed", None)]
        assert [f.kind for f in ledger.audit()] == ["firing_failed"]
        assert _next(ledger) == due  # not moved on: the firing is still owed
        fail[0] = False
        ledger.sweep()  # its function works again: the owed firing runs, once
        assert _firings(ledger)[0][:2] == (due, "submitted")
        assert ledger.store.firings_list("ticks", 10)[-1].attempts == 2
        assert [f.kind for f in ledger.audit()] == []


def test_a_key_submit_would_refuse_is_a_failed_firing_and_not_a_stuck_pass(db_url: str) -> None:
    ledger, job = _one_item_job(db_url)

    @job.schedule("every 1s", overlap="allow")
    def ticks(fire: datetime) -> tuple[dict[str, Any], str]:
        return {}, "k" * 5000

    with ledger:
        ledger.sweep()
        due = _until_due(ledger)
        assert ledger.sweep().firing_failures == 1
        [firing] = ledger.store.firings_list("ticks", 10)
        assert (firing.fire_at, firing.state, firing.run_id) == (due, "failed", None)
        assert "key" in (firing.error or "")
        assert ledger.runs() == []


def test_a_slow_function_leaves_the_rest_of_its_firings_to_the_next_pass(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from workledger._runtime.repair import calendar

    monkeypatch.setattr(calendar, "FIRE_BUDGET", 0.2)
    ledger, job = _one_item_job(db_url)

    @job.schedule("every 1s", catch_up="all", overlap="allow")
    def ticks(fire: datetime) -> dict[str, Any]:
        time.sleep(0.3)
        return {}

    with ledger:
        ledger.sweep()
        _until_due(ledger)
        time.sleep(2.1)  # three firings due
        assert ledger.sweep().fired == 1  # the budget is spent after the first
        assert ledger.sweep().fired == 1
        assert ledger.sweep().fired >= 1
        times = [t for t, state, _ in _firings(ledger) if state == "submitted"]
        assert len(times) >= 3 and times == sorted(set(times))  # in order, none twice


def test_a_process_on_another_declaration_leaves_the_schedule_to_the_newer_one(
        db_url: str) -> None:
    with _ledger(db_url, spec="every 1s", overlap="allow") as old:
        running = old.sweeper()  # a worker's sweeper: declares at its first pass
        running.firer.replace = True  # as a worker's sweep loop does (SweepLoop)
        running.sweep()
        with _ledger(db_url, spec="every 2s", overlap="allow") as new:
            deployed = new.sweeper()
            deployed.firer.replace = True
            deployed.sweep()  # a deploy: the worker's first pass replaces the declaration
            [row] = new.store.schedules_all()
            assert row.spec == "every 2s"
            _until_due(new)
            time.sleep(1.1)
            assert running.sweep().fired == 0  # the old process does not fire by its old spec
            assert running.firer.overdue() == []  # nor counts it against the leader
            assert new.sweep().fired == 1
            assert all(t.second % 2 == 0 for t, _, _ in _firings(new))
            new.schedule_pause("ticks")  # the CLI/API's declaration does not replace it
            [row] = old.store.schedules_all()
            assert row.spec == "every 2s"
            old.schedule_resume("ticks")  # nor does an older app's
            assert old.store.schedules_all()[0].spec == "every 2s"


def test_a_hand_sweep_or_serve_from_an_older_app_never_takes_the_schedule_from_a_worker(
        db_url: str) -> None:
    with _ledger(db_url, spec="every 2s", overlap="allow") as new:
        running = new.sweeper()  # the deployed worker's sweeper
        running.firer.replace = True  # as a worker's sweep loop does (SweepLoop)
        running.sweep()
        with _ledger(db_url, spec="every 1s", overlap="allow") as old:
            old.sweep()  # `workledger sweep` by hand, with the old app
            loop = old.schedule_loop()  # `serve --app` with the old app
            assert loop is not None
            loop.sweep_once(fire_only=True)
            loop.stop()
        [row] = new.store.schedules_all()
        assert row.spec == "every 2s"
        _until_due(new)
        assert running.sweep().fired == 1  # the worker still fires it


def test_a_slow_schedule_does_not_starve_the_others(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from workledger._runtime.repair import calendar

    monkeypatch.setattr(calendar, "FIRE_BUDGET", 0.2)
    ledger, job = _one_item_job(db_url)

    @job.schedule("every 1s", overlap="allow", name="a_slow")
    def slow(fire: datetime) -> dict[str, Any]:
        time.sleep(1.05)  # over the budget, and due again by the next pass
        return {}

    @job.schedule("every 1s", overlap="allow", name="b_fast")
    def fast(fire: datetime) -> dict[str, Any]:
        return {}

    with ledger:
        sweeper = ledger.sweeper()
        sweeper.sweep()
        time.sleep(1.1)
        for _ in range(3):
            sweeper.fire()
        counts = {name: len(ledger.store.firings_list(name, 100)) for name in ("a_slow", "b_fast")}
        assert counts["a_slow"] >= 1 and counts["b_fast"] >= 1, counts


def test_a_waiting_firing_survives_a_changed_declaration(db_url: str) -> None:
    with _ledger(db_url, overlap="wait") as ledger:
        ledger.sweep()
        _until_due(ledger)
        ledger.sweep()
        first = _firings(ledger)[-1][2]
        waiting_at = _until_due(ledger)
        ledger.sweep()
        assert _firings(ledger)[-1] == (waiting_at, "waiting", first)
    with _ledger(db_url, spec="every 5s", overlap="wait") as changed:
        deployed = changed.sweeper()
        deployed.firer.replace = True  # a worker's sweep loop, on the new declaration
        deployed.sweep()
        [row] = changed.store.schedules_all()
        assert (row.spec, row.waiting_fire_at) == ("every 5s", waiting_at)
        changed.work(until_idle=True, lease=5)
        changed.sweep()
        state, run = {t: (s, r) for t, s, r in _firings(changed)}[waiting_at]
        assert state == "submitted" and run not in (None, first)


def test_a_paused_schedule_does_not_fire_and_a_resumed_one_catches_up(db_url: str) -> None:
    with _ledger(db_url, catch_up="latest", overlap="allow") as ledger:
        ledger.sweep()
        assert ledger.schedule_pause("ticks") is True
        assert ledger.schedule_pause("ticks") is False
        _until_due(ledger)
        time.sleep(1.1)
        ledger.sweep()
        assert _firings(ledger) == []
        [status] = ledger.schedules()
        assert status.paused and status.paused_by == "operator"
        assert ledger.schedule_resume("ticks") is True
        ledger.sweep()
        assert [s for _, s, _ in _firings(ledger)] == ["submitted"]  # only the latest
        assert ledger.store.schedules_all()[0].missed >= 1


def test_backfill_records_each_firing_once_and_a_repeat_adds_nothing(db_url: str) -> None:
    with _ledger(db_url, spec="0 6 25 * *", overlap="skip") as ledger:
        start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 6, 30, tzinfo=UTC)
        dry = ledger.schedule_backfill("ticks", start, end, dry_run=True)
        assert len(dry) == 6 and all(f is None for _, f in dry)
        assert ledger.runs() == []
        done = ledger.schedule_backfill("ticks", start, end)
        assert [(f.state, f.created) for _, f in done] == [("submitted", True)] * 6  # type: ignore[union-attr]
        again = ledger.schedule_backfill("ticks", start, end)
        assert [f.state for _, f in again] == ["recorded"] * 6  # type: ignore[union-attr]
        assert len(ledger.runs()) == 6


def test_a_backfill_is_bounded_even_with_yes(db_url: str) -> None:
    from workledger.errors import BadInput

    with _ledger(db_url, spec="every 1s") as ledger:
        start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)
        with pytest.raises(BadInput, match="--yes"):
            ledger.schedule_backfill("ticks", start, end, dry_run=True)
        with pytest.raises(BadInput, match="in parts"):
            ledger.schedule_backfill("ticks", start, end, yes=True)
        far = datetime(9999, 12, 31, 23, 59, 50, tzinfo=UTC)
        with pytest.raises(BadInput, match="9999"):  # past the last time a datetime holds
            ledger.schedule_backfill("ticks", far - timedelta(seconds=5),
                                     datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC))
        assert ledger.runs() == [] and ledger.store.firings_list("ticks", 10) == []


def test_a_run_past_its_deadline_is_an_audit_finding_and_one_event(db_url: str) -> None:
    with _ledger(db_url) as ledger:
        sub = ledger.submit("tick", {"n": 3}, key="late", deadline="1s")
        on_time = ledger.submit("tick", {"n": 1}, key="fine", deadline="1h")
        assert [f.kind for f in ledger.audit()] == []
        time.sleep(1.2)
        [finding] = ledger.audit()
        assert (finding.kind, finding.run_id, finding.needs_person) == (
            "deadline_missed", sub.run_id, True)
        assert "3 of 3 units left" in (finding.detail or "")
        ledger.sweep()
        ledger.sweep()
        events = [e for e in ledger.store.events_list(sub.run_id) if e.kind == "deadline_missed"]
        assert len(events) == 1 and events[0].detail["left"] == 3
        assert not [e for e in ledger.store.events_list(on_time.run_id)
                    if e.kind == "deadline_missed"]
        ledger.work(until_idle=True, lease=5)
        assert [f.kind for f in ledger.audit()] == []  # complete: nothing left to report


def test_a_deadline_warning_is_a_finding_that_does_not_alert(db_url: str) -> None:
    ledger, _ = _one_item_job(db_url, deadline="1h", deadline_warning="2h")

    with ledger:
        sub = ledger.submit("tick", {})
        [finding] = ledger.audit()
        assert (finding.kind, finding.run_id, finding.needs_person) == (
            "deadline_near", sub.run_id, False)


# -- real worker processes and the command line ------------------------------------------------


def _cli(db_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_cmd("--db", db_url, "--app", APP, *args), env=cli_env(**env),
                          capture_output=True, text=True, timeout=120)


def _worker(db_url: str, tmp_path: Path, name: str, **env: str) -> subprocess.Popen[bytes]:
    log = (tmp_path / f"{name}.log").open("wb")
    return subprocess.Popen(cli_cmd("--db", db_url, "--app", APP, "worker", "--lease", "2"),
                            env=cli_env(**env), stdout=log, stderr=subprocess.STDOUT,
                            cwd=tmp_path)


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        assert p.wait(60) == 0


def _rows(db_url: str) -> list[dict[str, Any]]:
    done = _cli(db_url, "schedules", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.concurrency
def test_two_workers_firing_one_schedule_make_one_run_per_firing(
        db_url: str, tmp_path: Path) -> None:
    assert _cli(db_url, "init").returncode == 0
    workers = [_worker(db_url, tmp_path, f"w{i}") for i in range(2)]
    try:
        time.sleep(6)
    finally:
        _stop(*workers)
    with Ledger(db_url) as ledger:
        firings = [f for f in ledger.store.firings_list("ticks", 1000)]
        runs = [r for r in ledger.runs(1000) if r.job == "tick"]
    assert len(firings) >= 3
    assert all(f.state == "submitted" for f in firings), firings
    # one run per firing, one firing per planned second, none twice
    assert sorted(f.run_id for f in firings) == sorted(r.run_id for r in runs)  # type: ignore[type-var]
    times = sorted(f.fire_at for f in firings)
    assert len(set(times)) == len(times)
    steps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(step == timedelta(seconds=1) for step in steps), times
    # the last firing's run may be submitted just before the stop (a loaded machine): what a
    # stop left is finished by the next worker, none stranded
    done = _cli(db_url, "worker", "--until-idle", "--lease", "5", TICK_SPEC="every 1h")
    assert done.returncode == 0, done.stderr
    with Ledger(db_url) as ledger:
        assert all(ledger.status(r.run_id).complete for r in runs), [
            ledger.status(r.run_id) for r in runs]
    [row] = [r for r in _rows(db_url) if r["name"] == "ticks"]
    assert row["last_run_id"] == max(r.run_id for r in runs)


@pytest.mark.concurrency
def test_a_worker_stopped_for_three_periods_submits_each_missed_firing_on_restart(
        db_url: str, tmp_path: Path) -> None:
    env = {"TICK_SPEC": "every 2s", "TICK_CATCH_UP": "all"}
    assert _cli(db_url, "init").returncode == 0
    first = _worker(db_url, tmp_path, "first", **env)
    with Ledger(db_url) as ledger:
        deadline = time.monotonic() + 60
        while not ledger.store.firings_list("ticks", 1) and time.monotonic() < deadline:
            time.sleep(0.1)
        _stop(first)
        before = {f.fire_at for f in ledger.store.firings_list("ticks", 1000)}
        assert before
        time.sleep(6.5)  # three periods with no worker
        second = _worker(db_url, tmp_path, "second", **env)
        try:
            time.sleep(3)
        finally:
            _stop(second)
        times = sorted(f.fire_at for f in ledger.store.firings_list("ticks", 1000))
    assert len(set(times)) == len(times)
    assert all((b - a) == timedelta(seconds=2) for a, b in zip(times, times[1:], strict=False))
    assert len([t for t in times if t > max(before)]) >= 3  # the missed ones, each once


def test_the_cli_lists_pauses_fires_and_backfills_and_refuses_bad_input(
        db_url: str, tmp_path: Path) -> None:
    assert _cli(db_url, "init").returncode == 0
    listed = {r["name"]: r for r in _rows(db_url)}
    assert listed["monthly_payroll"]["spec"] == "0 6 25 * *"
    assert listed["monthly_payroll"]["tz"] == "Europe/Berlin"
    assert listed["monthly_payroll"]["declared"] and not listed["monthly_payroll"]["recorded"]
    paused = _cli(db_url, "schedule", "pause", "monthly_payroll")
    assert paused.returncode == 0 and "paused" in paused.stdout
    assert {r["name"]: r for r in _rows(db_url)}["monthly_payroll"]["paused"]
    assert _cli(db_url, "schedule", "resume", "monthly_payroll").returncode == 0
    fired = _cli(db_url, "schedule", "fire", "ticks", "--json")
    assert fired.returncode == 0, fired.stderr
    assert json.loads(fired.stdout)["state"] == "submitted"
    args = ("schedule", "backfill", "monthly_payroll", "--from", "2025-01-01T00:00Z",
            "--to", "2025-12-31T23:59Z")
    one = _cli(db_url, *args)
    assert one.returncode == 0, one.stderr
    assert "12 firing(s)" in one.stdout and "12 new run(s)" in one.stdout
    two = _cli(db_url, *args)
    assert "0 new run(s)" in two.stdout
    for bad, words in [
        (("schedule", "pause", "nope"), "unknown schedule"),
        (("schedule", "backfill", "monthly_payroll", "--from", "2026-02-01T00:00Z",
          "--to", "2026-01-01T00:00Z"), "is after"),
        (("schedule", "backfill", "ticks", "--from", "2026-01-01T00:00Z",
          "--to", "2026-01-02T00:00Z"), "--yes"),
        (("schedule", "backfill", "ticks", "--from", "2026-01-01", "--to", "2026-01-02"),
         "time zone"),
        (("submit", "tick", "--deadline", "tomorrow"), "deadline 'tomorrow'"),
    ]:
        done = _cli(db_url, *bad)
        assert done.returncode == 2, (bad, done.stdout, done.stderr)
        assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1
    with Ledger(db_url) as ledger:
        assert len(ledger.runs(1000)) == 13  # the refusals wrote nothing


def test_a_missed_deadline_makes_audit_exit_1(db_url: str) -> None:
    assert _cli(db_url, "submit", "tick", "--payload", '{"n": 1}', "--deadline",
                "1s").returncode == 0
    time.sleep(1.2)
    done = _cli(db_url, "audit", "--json")
    assert done.returncode == 1
    assert [f["kind"] for f in json.loads(done.stdout)] == ["deadline_missed"]


def _libfaketime() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


@pytest.mark.skipif(_libfaketime() is None and not os.environ.get("CI"),
                    reason="faketime is not installed (apt-get install faketime)")
def test_the_monthly_payroll_fires_on_the_25th_in_berlin_under_faketime(tmp_path: Path) -> None:
    """End to end on a clock that says 05:59:57 in Berlin on 25 December: the worker fires the
    docs' monthly schedule at 06:00, keyed by its period (SQLite: the database's clock is the
    process's). Only the wall clock is faked, as chaos/processes.py does (see its
    faketime_site for why)."""
    library = _libfaketime()
    assert library is not None, "CI installs faketime (.ci/run)"
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert _cli(url, "init").returncode == 0
    site = str(Path(__file__).resolve().parents[1] / "chaos" / "faketime_site")
    env = cli_env(LD_PRELOAD=library, FAKETIME="@2026-12-25 04:59:57",
                  FAKETIME_DONT_FAKE_MONOTONIC="1")
    env["PYTHONPATH"] = os.pathsep.join([site, env["PYTHONPATH"]])
    proc = subprocess.Popen(cli_cmd("--db", url, "--app", APP, "worker", "--lease", "2"),
                            env=env, stdout=(tmp_path / "w.log").open("wb"),
                            stderr=subprocess.STDOUT)
    found = []
    try:
        with Ledger(url) as ledger:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not found:
                time.sleep(0.2)
                found = ledger.store.firings_list("monthly_payroll", 5)
    finally:
        _stop(proc)
    log = (tmp_path / "w.log").read_text()
    assert found, log
    [firing] = found
    assert firing.fire_at == datetime(2026, 12, 25, 5, tzinfo=UTC)
    with Ledger(url) as ledger:
        run = ledger.status(firing.run_id)  # type: ignore[arg-type]
        assert run.key == "2026-12"


def test_the_api_and_the_dashboard_show_and_act_on_schedules_and_deadlines(db_url: str) -> None:
    from fastapi.testclient import TestClient

    from workledger.http import create_app

    with _ledger(db_url, spec="0 6 25 * *", overlap="allow") as ledger, \
            TestClient(create_app(ledger)) as client:
        [listed] = client.get("/api/schedules").json()["schedules"]
        assert listed["name"] == "ticks" and listed["spec"] == "0 6 25 * *"
        assert listed == _rows_of(ledger)[0]
        assert client.post("/api/schedules/ticks/pause").json()["schedules"][0]["paused"]
        assert not client.post("/api/schedules/ticks/resume").json()["schedules"][0]["paused"]
        fired = client.post("/api/schedules/ticks/fire").json()
        assert fired["state"] == "submitted" and fired["created"]
        body = {"from": "2025-01-01T00:00Z", "to": "2025-03-31T00:00Z"}
        first = client.post("/api/schedules/ticks/backfill", json=body).json()["firings"]
        again = client.post("/api/schedules/ticks/backfill", json=body).json()["firings"]
        assert [f["state"] for f in first] == ["submitted"] * 3
        assert [f["state"] for f in again] == ["recorded"] * 3
        bad = client.post("/api/schedules/ticks/backfill",
                          json={"from": "2025-04-01T00:00Z", "to": "2025-01-01T00:00Z"})
        assert bad.status_code == 400
        runs = len(ledger.runs())
        huge = client.post("/api/schedules/ticks/backfill",  # bounded even when asked for more
                           json={"from": "1000-01-01T00:00Z", "to": "2025-01-01T00:00Z",
                                 "yes": True})
        assert huge.status_code == 400 and "10,000" in huge.json()["error"]
        assert len(ledger.runs()) == runs
        assert client.post("/api/schedules/nope/pause").status_code == 404
        late = ledger.submit("tick", {"n": 1}, key="late", deadline="1s")
        by_http = client.post("/api/jobs/tick/runs?deadline=1s", json={"n": 2},
                              headers={"Idempotency-Key": "late-too"})
        assert by_http.status_code == 201
        assert client.post("/api/jobs/tick/runs?deadline=soon", json={"n": 3}).status_code == 400
        time.sleep(1.2)
        metrics = client.get("/metrics").text
        assert 'workledger_runs_past_deadline{job="tick"} 2.0' in metrics
        page = client.get("/schedules")
        assert page.status_code == 200 and "deadline missed" in page.text
        assert f'/runs/{late.run_id}' in page.text and "0 6 25 * *" in page.text


def _rows_of(ledger: Ledger) -> list[dict[str, Any]]:
    from workledger.shapes import schedule_dict

    return [schedule_dict(s) for s in ledger.schedules()]


def test_the_scheduled_payroll_example_fires_its_payroll_every_period(tmp_path: Path) -> None:
    here = Path(__file__).resolve().parents[1] / "examples" / "scheduled_payroll"
    url = f"sqlite:///{tmp_path / 'payroll.db'}"
    env = cli_env(WORKLEDGER_DB=url, PAYROLL_EVERY="every 1s")
    env["PYTHONPATH"] = os.pathsep.join([str(here), env["PYTHONPATH"]])
    proc = subprocess.Popen(cli_cmd("--app", "payroll:ledger", "worker", "--lease", "2"),
                            env=env, cwd=tmp_path, stdout=(tmp_path / "w.log").open("wb"),
                            stderr=subprocess.STDOUT)
    try:
        time.sleep(4)
    finally:
        _stop(proc)
    with Ledger(url) as ledger:
        runs = ledger.runs()
        firings = ledger.firings("monthly", 100)
    assert len(runs) >= 2, (tmp_path / "w.log").read_text()
    assert {r.run_id for r in runs} == {f.run_id for f in firings}
    assert all(r.total == 20 for r in runs)
