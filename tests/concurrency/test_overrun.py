"""Handlers and hooks that outlive their time limit or their lease, and clocks that lie
(issue 21, items 1 to 4), with real worker processes, real signals and libfaketime.

The promise under test: a non-idempotent effect happens once. An item whose handler may still
be running is not verified, run again or resolved as pending; a closing hook runs once per
completion of its run; every item a worker holds keeps its lease while it holds it; and on
SQLite a live holder keeps its leases whatever the clocks say, a dead one loses them at once.
Effects are appended to a log the ledger does not own (``overrun_app.py``).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from . import overrun_app as app
from .test_processes import Proc, spawn, wait_until  # noqa: F401 - spawn is a fixture

pytestmark = pytest.mark.concurrency


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "effects.log"


@pytest.fixture
def make_ledger(db_url: str, log: Path) -> Iterator[Callable[..., Any]]:
    opened: list[Any] = []

    def make(**options: Any) -> Any:
        ledger = app.build_ledger(db_url, str(log), **options)
        opened.append(ledger)
        return ledger

    yield make
    for ledger in opened:
        ledger.close()


def items_of(ledger: Any, run_id: int) -> dict[str, Any]:
    return {i.key: i for i in ledger.items(run_id, limit=1000)}


def kinds(ledger: Any, run_id: int, kind: str) -> list[Any]:
    return [e for e in ledger.events(run_id) if e.kind == kind]


# -- 1. a handler past its time limit that has not ended ----------------------------------------


def test_a_timed_out_handler_still_running_is_not_verified_nor_run_again(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    """The reviewer's reproduction: timeout 1 s, the effect at 2.5 s, lease 4 s. Before the
    fix the item was settled at 1 s, verified `not_done` at 2 s and run again: two effects."""
    options = {"timeout": 1.0, "verify": True, "effect_at": 2.5}
    ledger = make_ledger(**options)
    run_id = ledger.job(app.JOB).submit({"n": 1}).run_id
    worker = spawn(app.command(db_url, log, lease=4.0, concurrency=2, **options), name="w")
    worker.wait_ok(timeout=90)
    assert app.effects(log, "start") == {"k0": 1}, app.read_log(log)  # never run again
    assert app.effects(log) == {"k0": 1}, app.read_log(log)
    (item,) = items_of(ledger, run_id).values()
    # the hook was asked once the handler had ended, and found its effect
    assert item.state == "processed", item
    verdicts = [e.detail for e in kinds(ledger, run_id, "verified")]
    assert [d["verdict"] for d in verdicts] == ["done"], verdicts


def test_an_overrunning_item_cannot_be_resolved_as_pending_until_its_handler_ends(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    options = {"timeout": 0.5, "effect_at": 4.0}
    ledger = make_ledger(**options)
    run_id = ledger.job(app.JOB).submit({"n": 1}).run_id
    worker = spawn(app.command(db_url, log, lease=2.0, **options), name="w")
    wait_until(lambda: app.read_log(log), "the handler to start")
    time.sleep(1.5)  # past its time limit, before its effect
    (item,) = items_of(ledger, run_id).values()
    assert item.state == "claimed", item  # still held: its handler runs
    from workledger.errors import WorkledgerError

    try:
        moved = ledger.resolve(run_id, app.STAGE, item.seq, "pending", note="try it again")
    except WorkledgerError:
        moved = False
    assert not moved
    ledger.sweep(lease=2.0)  # nor does a sweeper take it back
    assert items_of(ledger, run_id)["k0"].state == "claimed"
    worker.wait_ok(timeout=60)
    (item,) = items_of(ledger, run_id).values()
    assert (item.state, item.error) == ("unknown", "timeout after 0.5s")
    assert app.effects(log) == {"k0": 1}


def test_a_worker_stopped_mid_handler_does_not_call_itself_stuck_when_it_resumes(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    """One handler really overruns (k0, 6 s against a 1.5 s limit) and the worker is
    SIGSTOPped for 3 s while its replacement thread runs k1: on SIGCONT k1 is past its limit
    too, two stuck against one thread, and the worker exited 3 ("restart it") although k1
    ended a moment later (found by the fault campaign, SQLite seed 1304 round 20)."""
    options = {"idempotent": True, "timeout": 1.5, "effect_at": 1.0, "hang_first": 6.0,
               "max_attempts": 1}
    ledger = make_ledger(**options)
    run_id = ledger.job(app.JOB).submit({"n": 3}).run_id
    worker = spawn(app.command(db_url, log, lease=30.0, concurrency=1, chunk=1, **options),
                   name="w")
    wait_until(lambda: "k1" in {k for w, k, *_ in app.read_log(log) if w == "start"},
               "k1 to start beside the overrunning k0", timeout=60)
    worker.signal(signal.SIGSTOP)
    time.sleep(3.0)
    worker.signal(signal.SIGCONT)
    report = worker.wait_ok(timeout=60)
    assert report["stuck"] is False, report
    states = {key: i.state for key, i in items_of(ledger, run_id).items()}
    assert states == {"k0": "failed", "k1": "failed", "k2": "processed"}, states  # k0, k1 timed out


def test_a_worker_asked_to_stop_waits_for_its_overrunning_handler_to_end(
    make_ledger: Callable[..., Any], db_url: str, log: Path,
) -> None:
    """In-process (``ledger.worker()``): before, run() returned while the abandoned handler
    still ran, and closing the ledger let another process run the item again."""
    import threading

    ledger = make_ledger(timeout=0.5, effect_at=3.0, verify=True)
    run_id = ledger.job(app.JOB).submit({"n": 1}).run_id
    worker = ledger.worker(lease=2.0, concurrency=1)
    runner = threading.Thread(target=worker.run)
    runner.start()
    wait_until(lambda: worker.report.abandoned == 1, "the handler to be abandoned")
    worker.stop()
    runner.join(60)
    assert not runner.is_alive()
    assert app.effects(log) == {"k0": 1}  # it returned only after the late effect
    (item,) = items_of(ledger, run_id).values()
    assert item.state != "claimed", item  # settled, not left held by nobody


# -- 2. a closing hook longer than its lease ------------------------------------------------------


def test_a_closing_hook_longer_than_its_lease_runs_once(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    """Two workers, lease 2 s, a 6 s hook: before the fix it ran 5 times in 17 s."""
    ledger = make_ledger(hook_for=6.0)
    run_id = ledger.job(app.JOB).submit({"n": 1}).run_id
    workers = [spawn(app.command(db_url, log, lease=2.0, hook_for=6.0, forever=True),
                     name=f"w{i}") for i in range(2)]
    wait_until(lambda: app.effects(log, "closed"), "the closing hook to end", timeout=60)
    time.sleep(5.0)  # two leases more: a second run would have started by now
    for w in workers:
        w.signal(signal.SIGTERM)
    assert app.effects(log, "close") == {str(run_id): 1}, app.read_log(log)
    close = [i for i in ledger.items(run_id, limit=10, stage="@close")]
    assert [i.state for i in close] == ["processed"]


def test_a_closing_hook_past_its_time_limit_runs_once_and_its_outcome_is_written_when_it_ends(
    make_ledger: Callable[..., Any], db_url: str, log: Path,
) -> None:
    """Before, a hook past its limit was written off as failed and tried again while it still
    ran (the review saw five runs overlapping)."""
    ledger = make_ledger(hook_for=3.0, hook_timeout=0.5)
    run_id = ledger.job(app.JOB).submit({"n": 1}).run_id
    ledger.work(lease=1.0, until_idle=True)
    assert app.effects(log, "close") == {str(run_id): 1}, app.read_log(log)
    assert app.effects(log, "closed") == {str(run_id): 1}
    ledger.sweep(lease=1.0)  # nothing left to run again
    assert app.effects(log, "close") == {str(run_id): 1}
    (close,) = ledger.items(run_id, limit=10, stage="@close")
    assert close.state == "processed", close


def test_a_closing_hook_whose_process_dies_inside_it_is_bounded_by_its_attempts(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Each sweeper that takes the hook dies in it: before the fix no attempt was ever charged
    and nothing bounded it; now the third death is the last (max_attempts=3)."""
    ledger = make_ledger(hook_for=0.0)
    run_id = ledger.job(app.JOB).submit({"n": 1}).run_id
    spawn(app.command(db_url, log, lease=1.0), name="w").wait_ok()  # no hook in that one
    sweep = app.command(db_url, log, lease=1.0, hook_for=0.0, hook_crash=True, sweep=True)
    for i in range(6):
        spawn(sweep, name=f"sweep{i}").wait(timeout=60)
        (close,) = ledger.items(run_id, limit=10, stage="@close")
        if close.state == "failed":
            break
        time.sleep(1.2)  # its lease runs out (PostgreSQL); on SQLite its holder is gone
    assert app.effects(log, "close") == {str(run_id): 3}, app.read_log(log)
    assert (close.state, close.attempts) == ("failed", 3), close
    assert "gave up after 3 attempts" in (close.error or "")


# -- 3. a reclaimed chunk keeps every lease while its suspects run alone -------------------------


def test_a_reclaimed_chunk_renews_every_item_it_holds(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    """12 items killed after their claim, then a worker with lease 3 s and 1 s handlers:
    before the fix the suspects waiting their turn let their leases lapse (31 `lease_expired`
    events, items run twice)."""
    ledger = make_ledger(idempotent=True)
    run_id = ledger.job(app.JOB).submit({"n": 12}).run_id
    first = spawn(app.command(db_url, log, lease=3.0, concurrency=12, chunk=12,
                              idempotent=True, effect_at=60.0, forever=True), name="first")
    wait_until(lambda: len(app.read_log(log)) == 12, "every item to start", timeout=60)
    first.signal(signal.SIGKILL)
    first.wait()
    log.unlink()
    second = spawn(app.command(db_url, log, lease=3.0, concurrency=2, chunk=12,
                               idempotent=True, effect_at=1.0), name="second")
    second.wait_ok(timeout=120)
    assert app.effects(log) == {f"k{i}": 1 for i in range(12)}, app.read_log(log)
    assert len(kinds(ledger, run_id, "lease_expired")) == 12  # the killed worker's, no more
    assert all(i.state == "processed" for i in items_of(ledger, run_id).values())


def overlap(log: Path) -> int:
    """The most handlers of the log running at one moment (each from its start to its effect)."""
    marks = sorted((at, +1 if what == "start" else -1)
                   for what, _k, _t, _p, at in app.read_log(log) if what in ("start", "effect"))
    most = running = 0
    for _at, step in marks:
        running += step
        most = max(most, running)
    return most


def test_the_suspects_of_a_killed_chunk_run_side_by_side_and_only_a_second_loss_runs_alone(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    """Issue 21 item 3: every item of a taken-back chunk ran alone, one after another, even
    those that had not started (100 async items taken back after a kill: 5.6 s against 0.7 s
    fresh). Now the suspects of a first loss run side by side, each charged as it starts, and
    only those that were running when their holder was lost again run alone."""
    ledger = make_ledger(idempotent=True)
    run_id = ledger.job(app.JOB).submit({"n": 8}).run_id
    first = spawn(app.command(db_url, log, lease=2.0, concurrency=8, chunk=8,
                              idempotent=True, effect_at=60.0, forever=True), name="first")
    wait_until(lambda: len(app.read_log(log)) == 8, "every item to start", timeout=60)
    first.signal(signal.SIGKILL)
    first.wait()
    log.unlink()
    # second loss: a worker with 4 threads takes the 8 suspects, 4 of them start; killed again
    second = spawn(app.command(db_url, log, lease=2.0, concurrency=4, chunk=8,
                               idempotent=True, effect_at=60.0, forever=True), name="second")
    wait_until(lambda: len(app.read_log(log)) == 4, "four suspects to start side by side",
               timeout=60)
    time.sleep(0.5)
    assert len(app.read_log(log)) == 4  # the others wait for a thread, not for their turn alone
    second.signal(signal.SIGKILL)
    second.wait()
    charged = {i.key: i.attempts for i in items_of(ledger, run_id).values()}
    assert sorted(charged.values()) == [0, 0, 0, 0, 1, 1, 1, 1], charged  # charged as started
    started = {key for what, key, *_ in app.read_log(log) if what == "start"}
    log.unlink()
    third = spawn(app.command(db_url, log, lease=2.0, concurrency=4, chunk=8,
                              idempotent=True, effect_at=0.5), name="third")
    third.wait_ok(timeout=120)
    assert app.effects(log) == {f"k{i}": 1 for i in range(8)}, app.read_log(log)
    rows = app.read_log(log)
    alone = [key for what, key, *_ in rows if what == "start" and key in started]
    assert len(alone) == 4
    # the four lost twice ran one at a time, before the four that never started under a claim
    order = [key for what, key, *_ in rows if what == "start"]
    assert set(order[:4]) == started, order
    for key in started:  # each of them ran alone: nothing else started until its effect
        i = [k for w, k, *_ in rows].index(key)
        assert rows[i + 1][:2] == ("effect", key), rows
    assert {i.state for i in items_of(ledger, run_id).values()} == {"processed"}


# -- 4. the holder's life, not the clocks ----------------------------------------------


def faketime(offset: str) -> list[str]:
    exe = shutil.which("faketime")
    if exe is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("faketime is required in CI (Debian package faketime)")
        pytest.skip("faketime is not installed (apt-get install faketime)")
    return [exe, "-f", offset]


def sqlite_only(db_url: str) -> None:
    if not db_url.startswith("sqlite"):
        pytest.skip("on PostgreSQL every lease is judged by the server's one clock")


def test_on_sqlite_a_worker_whose_clock_is_behind_keeps_its_leases(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    """A worker under `faketime -f -10m` writes leases already expired by the others'
    clocks; a sweep 2 s later took its three healthy items to `unknown` before the fix."""
    sqlite_only(db_url)
    ledger = make_ledger(effect_at=4.0)
    run_id = ledger.job(app.JOB).submit({"n": 3}).run_id
    worker = spawn(faketime("-10m") + app.command(db_url, log, lease=30.0, concurrency=3,
                                                  effect_at=4.0), name="behind")
    wait_until(lambda: len(app.read_log(log)) == 3, "its three handlers to start", timeout=60)
    report = ledger.sweep(lease=30.0)
    assert (report.to_pending, report.to_unknown) == (0, 0)
    worker.wait_ok(timeout=60)
    assert {i.state for i in items_of(ledger, run_id).values()} == {"processed"}
    assert app.effects(log) == {"k0": 1, "k1": 1, "k2": 1}


def test_on_sqlite_a_sweeper_whose_clock_is_ahead_takes_nothing_from_a_live_holder(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A forward clock step looks like every lease expiring at once."""
    sqlite_only(db_url)
    ledger = make_ledger(effect_at=4.0)
    run_id = ledger.job(app.JOB).submit({"n": 2}).run_id
    worker = spawn(app.command(db_url, log, lease=30.0, effect_at=4.0), name="w")
    wait_until(lambda: len(app.read_log(log)) == 2, "its handlers to start", timeout=60)
    sweeper = spawn(faketime("+1h") + app.command(db_url, log, lease=30.0, sweep=True),
                    name="ahead")
    assert sweeper.wait(timeout=60) == 0, sweeper.stderr()
    assert sweeper.out.read_text().split() == ["0", "0"]
    worker.wait_ok(timeout=60)
    assert {i.state for i in items_of(ledger, run_id).values()} == {"processed"}
    assert app.effects(log) == {"k0": 1, "k1": 1}


def test_on_sqlite_the_leases_of_a_dead_holder_are_taken_back_at_once(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    sqlite_only(db_url)
    ledger = make_ledger(effect_at=60.0)
    run_id = ledger.job(app.JOB).submit({"n": 2}).run_id
    worker = spawn(app.command(db_url, log, lease=600.0, effect_at=60.0), name="w")
    wait_until(lambda: len(app.read_log(log)) == 2, "its handlers to start", timeout=60)
    worker.signal(signal.SIGKILL)
    worker.wait()
    report = ledger.sweep(lease=30.0)  # long before the 600 s lease would run out
    assert report.to_unknown == 2
    assert {i.state for i in items_of(ledger, run_id).values()} == {"unknown"}


@pytest.mark.parametrize("offset", ["+15m", "-15m"])
def test_on_sqlite_a_retry_written_by_a_skewed_clock_is_due_within_its_delay(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
    offset: str,
) -> None:
    """A retry's time is written with the writer's clock. One 15 minutes ahead left the item
    waiting 15 minutes for every other process (the campaign's seed 20261201 round 2: "pending
    after recovery"); one behind made it due at once. Either way it is due within its delay
    (1 s here) by the clock of whoever claims it, and runs once more, not twice."""
    sqlite_only(db_url)
    ledger = make_ledger(fail_first=True)
    run_id = ledger.job(app.JOB).submit({"n": 1}).run_id
    skewed = spawn(faketime(offset) + app.command(db_url, log, fail_first=True, forever=True),
                   name="skewed")

    def failed_once() -> bool:
        item = items_of(ledger, run_id)["k0"]
        return item.state == "pending" and item.attempts == 1

    wait_until(failed_once, "its first attempt to fail", timeout=60)
    skewed.signal(signal.SIGKILL)  # before its own clock makes the retry due to itself
    skewed.wait()
    began = time.monotonic()
    worker = spawn(app.command(db_url, log, fail_first=True), name="on-time")
    report = worker.wait_ok(timeout=60)
    assert report["processed"] == 1, report
    assert time.monotonic() - began < 30, "the retry waited for the skewed clock"
    assert items_of(ledger, run_id)["k0"].state == "processed"
    assert app.effects(log) == {"k0": 1}


def test_on_sqlite_a_handler_that_changes_directory_does_not_lose_its_workers_leases(
    spawn: Callable[..., Proc], db_url: str, log: Path, tmp_path: Path,  # noqa: F811
) -> None:
    """The review's case: with a relative ledger URL, a handler's os.chdir made the worker
    look for its own holder file elsewhere and take back its own running items."""
    sqlite_only(db_url)
    ledger = app.build_ledger(f"sqlite:///{tmp_path / 'l.db'}", str(log))
    run_id = ledger.job(app.JOB).submit({"n": 2}).run_id
    ledger.close()
    worker = spawn(app.command("sqlite:///l.db", log, lease=1.0, effect_at=2.5, chdir="/"),
                   name="w", cwd=tmp_path)
    report = worker.wait_ok(timeout=60)
    assert (report["processed"], report["stale"]) == (2, 0), report
    assert app.effects(log) == {"k0": 1, "k1": 1}
    reread = app.build_ledger(f"sqlite:///{tmp_path / 'l.db'}", str(log))
    assert {i.state for i in items_of(reread, run_id).values()} == {"processed"}
    reread.close()


def test_on_sqlite_a_holder_whose_file_is_missing_is_judged_by_its_lease_time(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    """Only a file found unlocked proves a holder gone; a missing one is not proof."""
    sqlite_only(db_url)
    ledger = make_ledger(effect_at=3.0)
    run_id = ledger.job(app.JOB).submit({"n": 1}).run_id
    worker = spawn(app.command(db_url, log, lease=60.0, effect_at=3.0), name="w")
    wait_until(lambda: app.read_log(log), "the handler to start")
    for path in Path(db_url[len("sqlite:///"):] + ".holders").iterdir():
        path.unlink()
    report = ledger.sweep(lease=60.0)
    assert (report.to_pending, report.to_unknown) == (0, 0)
    worker.wait_ok(timeout=60)
    assert items_of(ledger, run_id)["k0"].state == "processed"


def test_a_stopped_holder_keeps_its_items_while_it_lives(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    """SIGSTOPped past its lease and SIGCONTed: nobody verified or ran its item meanwhile
    (SQLite: its holder file stays locked; PostgreSQL: its holder session lives on)."""
    options = {"verify": True, "effect_at": 3.0}
    ledger = make_ledger(**options)
    run_id = ledger.job(app.JOB).submit({"n": 1}).run_id
    worker = spawn(app.command(db_url, log, lease=1.0, **options), name="w")
    wait_until(lambda: app.read_log(log), "the handler to start")
    worker.signal(signal.SIGSTOP)
    time.sleep(2.5)  # past its lease
    report = ledger.sweep(lease=1.0)
    assert (report.to_pending, report.to_unknown, report.verified) == (0, 0, 0)
    worker.signal(signal.SIGCONT)
    worker.wait_ok(timeout=60)
    assert app.effects(log) == {"k0": 1}
    assert items_of(ledger, run_id)["k0"].state == "processed"


def end_sessions(db_url: str) -> int:
    """``pg_terminate_backend`` of every other client session of the test's database (a
    worker's holder session with them): how many were ended."""
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        ended = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                             " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                             " AND backend_type = 'client backend'").fetchone()
    return int(ended[0]) if ended else 0


def test_a_stopped_holder_whose_session_ended_is_fenced_out_by_a_verify_hook_that_fences(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    """PostgreSQL: a worker SIGSTOPped mid-handler whose sessions are terminated meanwhile looks
    gone (lease over, holder lock released), so its item is verified while its handler still
    has its effect to make; nothing in the ledger can tell a paused process from a dead one.
    Reproduced first: without a fence the item's effect happened twice. The defence
    docs/reliability.md gives, a verify hook that fences the downstream at the item's lease
    token, refuses the late effect: the effect happens once, and the item ends processed."""
    if not db_url.startswith("postgres"):
        pytest.skip("SQLite: a stopped holder keeps its file locked (the test above)")

    options = {"verify": True, "effect_at": 3.0, "fence": True}
    ledger = make_ledger(**options)
    run_id = ledger.job(app.JOB).submit({"n": 1}).run_id
    worker = spawn(app.command(db_url, log, lease=1.0, **options), name="w")
    wait_until(lambda: app.read_log(log), "the handler to start")
    worker.signal(signal.SIGSTOP)
    assert end_sessions(db_url) > 0
    time.sleep(2.5)  # past its lease
    report = ledger.sweep(lease=1.0)
    assert (report.to_unknown, report.verified) == (1, 1)  # it looked gone, and was asked
    worker.signal(signal.SIGCONT)
    worker.wait_ok(timeout=60)
    assert app.effects(log) == {"k0": 1}
    assert app.effects(log, "refused") == {"k0": 1}  # the paused handler's late effect
    assert items_of(ledger, run_id)["k0"].state == "processed"


def test_a_stopped_closing_hook_whose_session_ended_is_fenced_out_by_the_next_run_of_it(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    """The campaign's seed 1308 round 30: a worker SIGSTOPped inside a closing hook while every
    session was terminated looked gone, so another sweeper ran the hook again, and the paused
    one made its effect when it resumed: the hook's effect twice. A hook given ``ctx`` learns
    its entry's lease token; one that fences the downstream below it before acting refuses the
    paused run's late effect: one effect, the entry processed."""
    if not db_url.startswith("postgres"):
        pytest.skip("SQLite: a stopped holder keeps its file locked")

    options = {"hook_for": 3.0, "fence": True}
    ledger = make_ledger(**options)
    run_id = ledger.job(app.JOB).submit({"n": 1}).run_id
    worker = spawn(app.command(db_url, log, lease=1.0, forever=True, **options), name="w")
    wait_until(lambda: app.effects(log, "close"), "the closing hook to start", timeout=60)
    worker.signal(signal.SIGSTOP)
    assert end_sessions(db_url) > 0
    time.sleep(2.5)  # past its lease
    ledger.sweep(lease=1.0)  # takes the entry back and runs the hook again, to its end
    worker.signal(signal.SIGCONT)
    wait_until(lambda: app.effects(log, "refused"), "the paused hook's late effect", timeout=30)
    worker.signal(signal.SIGTERM)
    worker.wait(timeout=60)
    key = f"close-{run_id}"
    assert app.effects(log) == {"k0": 1, key: 1}, app.read_log(log)
    assert app.effects(log, "refused") == {key: 1}
    assert app.effects(log, "close") == {str(run_id): 2}
    close = [i for i in ledger.items(run_id, limit=10, stage="@close")]
    assert [i.state for i in close] == ["processed"]


def test_a_running_holder_retakes_its_lock_at_its_next_renewal_after_its_session_ended(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], db_url: str, log: Path,  # noqa: F811
) -> None:
    """PostgreSQL: a worker whose sessions were terminated while a long handler runs has its
    holder lock back within a renewal period, not only at its next claim after the handler."""
    if not db_url.startswith("postgres"):
        pytest.skip("the holder lock is PostgreSQL's")
    import psycopg

    from workledger.storage.postgres import HOLDER_LOCK

    held = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
            " AND objsubid = 2 AND granted")
    ledger = make_ledger(effect_at=8.0)
    ledger.job(app.JOB).submit({"n": 1})
    worker = spawn(app.command(db_url, log, lease=1.5, effect_at=8.0), name="w")
    wait_until(lambda: app.read_log(log), "the handler to start")
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute(held, (HOLDER_LOCK,)).fetchone() == (1,)
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                     " AND backend_type = 'client backend'")  # not this one, which looks on
        wait_until(lambda: conn.execute(held, (HOLDER_LOCK,)).fetchone() == (1,),
                   "the holder lock to be taken again", timeout=4.0)
        assert app.effects(log) == {}  # while the handler still runs
    worker.wait_ok(timeout=60)
    assert app.effects(log) == {"k0": 1}
