"""Database faults, hung handlers and an idle ledger, with real worker processes (issue 12).

A worker keeps running through a terminated PostgreSQL session and a restarted server (a private
one: the shared server is never restarted), holds a hung handler to its time limit, writes
nothing while idle, and leaves the periodic sweeping to one process. Effects are counted in an
append-only sink the ledger does not own (``procs.py``).
"""

from __future__ import annotations

import signal
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from workledger.api import differences

from . import procs
from .test_processes import (
    Proc,
    all_items,
    executions,
    ikey,
    make_ledger,  # noqa: F401 - a fixture
    sink,  # noqa: F401 - a fixture
    spawn,  # noqa: F401 - a fixture
    tagged_url,
    wait_until,
)

pytestmark = pytest.mark.concurrency

CHAOS = Path(__file__).resolve().parents[2] / "chaos"


def terminate(url: str, tag: str) -> int:
    """``pg_terminate_backend`` every session tagged ``tag``; how many there were."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = %s AND pid <> pg_backend_pid()",
                            (tag,)).fetchall()
    return len(rows)


def assert_done_once(ledger: Any, run_id: int, n: int, sink: Path) -> None:  # noqa: F811
    """Every item processed, none in doubt, each effect exactly once, counters agree."""
    items = all_items(ledger, run_id)
    assert Counter(i.state for i in items) == {"processed": n}
    raw = executions(sink)
    assert set(raw) == {ikey(i) for i in items}
    assert max(raw.values()) == 1, raw.most_common(3)
    assert not differences(ledger.reconcile(run_id, dry_run=True))


# -- 1. the database goes away and comes back ---------------------------------------------------


def test_a_worker_keeps_running_when_its_sessions_are_terminated_twice(
    spawn: Callable[..., Proc], sink: Path, pg_url: str,  # noqa: F811
) -> None:
    n = 300
    ledger = procs.build_ledger(pg_url, sink, idempotent=False)
    run_id = ledger.job(procs.JOB).submit({"n": n}).run_id
    worker = spawn(procs.worker_command(tagged_url(pg_url, "wl-outage"), sink, concurrency=4,
                                        chunk=50, lease=10.0, sleep=0.02, idempotent=False),
                   name="w")
    for target in (60, 180):
        wait_until(lambda t=target: sum(executions(sink).values()) >= t  # type: ignore[misc]
                   or worker.popen.poll() is not None, f"{target} effects")
        assert worker.popen.poll() is None, worker.stderr()
        assert terminate(pg_url, "wl-outage") >= 1
    report = worker.wait_ok(timeout=120)
    assert report["processed"] == n
    # a session killed between two uses is replaced by the pool unseen; one killed mid-query
    # is an outage, logged once as it starts and once as it ends
    log = worker.stderr()
    assert log.count("database unavailable") == log.count("database back"), log
    assert_done_once(ledger, run_id, n, sink)
    ledger.close()


@pytest.fixture
def private_pg() -> Iterator[Any]:
    sys.path.insert(0, str(CHAOS))
    try:
        from pgserver import PrivatePostgres, ServerUnavailable
    finally:
        sys.path.remove(str(CHAOS))
    try:
        server = PrivatePostgres()
        server.create()
    except ServerUnavailable as exc:
        pytest.skip(f"no private PostgreSQL server here: {exc}")
    try:
        yield server
    finally:
        server.remove()


def test_a_worker_keeps_running_through_a_server_restart(
    private_pg: Any, spawn: Callable[..., Proc], sink: Path,  # noqa: F811
) -> None:
    n = 300
    url = private_pg.create_database("ledger")
    ledger = procs.build_ledger(url, sink, idempotent=False)
    run_id = ledger.job(procs.JOB).submit({"n": n}).run_id
    worker = spawn(procs.worker_command(url, sink, concurrency=4, chunk=50, lease=15.0,
                                        sleep=0.02, idempotent=False), name="w")
    wait_until(lambda: sum(executions(sink).values()) >= 100 or worker.popen.poll() is not None,
               "100 effects")
    assert worker.popen.poll() is None, worker.stderr()
    private_pg.stop("fast")
    time.sleep(5.0)  # down longer than a pooled connection is waited for: the worker must
    # wait the outage out, not exit
    assert worker.popen.poll() is None, worker.stderr()
    private_pg.start()
    report = worker.wait_ok(timeout=120)
    assert report["processed"] == n
    assert "database back" in worker.stderr()
    assert_done_once(ledger, run_id, n, sink)
    ledger.close()


def test_an_outage_longer_than_the_lease_loses_no_finished_outcome(
    private_pg: Any, spawn: Callable[..., Proc], sink: Path,  # noqa: F811
) -> None:
    """Handlers finish while the server is down for longer than their lease: the worker writes
    their outcomes once it is back, before its own sweeper may take the expired leases back
    (a stage that is not idempotent would leave them unknown)."""
    n = 40
    url = private_pg.create_database("ledger")
    ledger = procs.build_ledger(url, sink, idempotent=False)
    run_id = ledger.job(procs.JOB).submit({"n": n}).run_id
    worker = spawn(procs.worker_command(url, sink, concurrency=4, chunk=40, lease=2.0,
                                        sleep=0.8, idempotent=False), name="w")
    wait_until(lambda: sum(executions(sink).values()) >= 8 or worker.popen.poll() is not None,
               "8 effects")
    private_pg.stop("fast")
    time.sleep(6.0)  # three leases: every lease held when it went down has expired
    private_pg.start()
    report = worker.wait_ok(timeout=120)
    assert report["processed"] == n and report["stale"] == 0
    assert_done_once(ledger, run_id, n, sink)
    ledger.close()


def test_a_worker_gives_up_after_db_retry_for_with_one_line(
    private_pg: Any, tmp_path: Path,
) -> None:
    import subprocess

    url = private_pg.create_database("ledger")
    apps = Path(__file__).resolve().parents[1] / "apps"
    private_pg.stop("fast")
    env = {"PYTHONPATH": str(apps), "PATH": "/usr/bin:/bin"}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "workledger.cli", "--db", url, "--app",
                          "sample_app:ledger", "worker", "--db-retry-for", "3"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "Traceback" not in out.stderr
    assert time.monotonic() - started < 60


# -- 2. a handler that hangs ----------------------------------------------------------------


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
def test_a_hung_handler_is_abandoned_at_its_time_limit_while_its_siblings_complete(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path,  # noqa: F811
    db_url: str, idempotent: bool,
) -> None:
    n = 12
    ledger = make_ledger(idempotent=idempotent, max_attempts=2)
    run_id = ledger.job(procs.JOB).submit({"n": n}).run_id
    worker = spawn(procs.worker_command(db_url, sink, concurrency=3, chunk=n, lease=30.0,
                                        idempotent=idempotent, max_attempts=2,
                                        hang_key="k5", hang_for=4.0, timeout=1.0), name="w")
    report = worker.wait_ok(timeout=120)
    items = {i.key: i for i in all_items(ledger, run_id)}
    hung = items.pop("k5")
    assert all(i.state == "processed" for i in items.values())
    if idempotent:  # tried twice, each time abandoned: retries exhausted
        assert (hung.state, hung.attempts) == ("failed", 2)
        assert hung.error == "retries exhausted after 2 attempts: timeout after 1s"
        assert report["abandoned"] == 2
    else:  # its effect may have happened: a person decides
        assert (hung.state, hung.error) == ("unknown", "timeout after 1s")
        assert report["abandoned"] == 1
    assert "still running after 1s: abandoned" in worker.stderr()


def test_an_abandoned_handler_keeps_its_item_held_until_it_ends_and_its_result_is_not_applied(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path,  # noqa: F811
    db_url: str,
) -> None:
    """Past its limit the handler is abandoned, but its item stays claimed (nobody may verify,
    rerun or resolve it while the handler may still make its effect); when the handler ends,
    the item is settled by the stage's declaration and what the handler did is in the event."""
    ledger = make_ledger(idempotent=False)
    run_id = ledger.job(procs.JOB).submit({"n": 4}).run_id
    worker = spawn(procs.worker_command(db_url, sink, concurrency=2, chunk=4, lease=30.0,
                                        idempotent=False, hang_key="k1", hang_for=3.0,
                                        timeout=0.5, until_idle=False), name="w")
    wait_until(lambda: "abandoned" in worker.stderr(), "the handler to be abandoned")
    (held,) = [i for i in all_items(ledger, run_id) if i.key == "k1"]
    assert held.state == "claimed", held  # its handler is still running
    wait_until(lambda: any(e.kind == "unknown" for e in ledger.events(run_id)),
               "the item settled once its handler ended", timeout=60)
    worker.signal(signal.SIGTERM)  # this worker has no signal handler: SIGTERM ends it
    assert worker.wait() == -signal.SIGTERM
    (hung,) = [i for i in all_items(ledger, run_id) if i.key == "k1"]
    assert (hung.state, hung.error) == ("unknown", "timeout after 0.5s")
    assert hung.result is None  # the late result was not applied
    (settled,) = [e for e in ledger.events(run_id) if e.kind == "unknown"]
    assert settled.detail["late"] == "Processed", settled.detail
    assert settled.detail["ran_for"] >= 2.5, settled.detail  # it hung 3 s
    assert not [e for e in ledger.events(run_id) if e.kind == "stale_result"]


def test_a_worker_with_more_stuck_handlers_than_threads_exits_3(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path,  # noqa: F811
    db_url: str,
) -> None:
    ledger = make_ledger(max_attempts=5)
    ledger.job(procs.JOB).submit({"n": 3})
    worker = spawn(procs.worker_command(db_url, sink, concurrency=1, chunk=3, lease=30.0,
                                        hang_key="k0,k1", timeout=0.3, retry_delay=None),
                   name="w")
    # k0 and k1 hang: their stuck threads pile up past the one the worker has
    assert worker.wait(timeout=120) == 3
    assert "stuck past their time limit" in worker.stderr()


# -- 3. idle costs nothing; one sweeper -----------------------------------------------------------


class Writes:
    """A value that moves whenever another connection commits a change to the ledger: SQLite's
    ``PRAGMA data_version`` on a connection kept open; on PostgreSQL, every row version of the
    ledger's tables (its ``xmin``, new for every insert and update, and the row count, for a
    delete) and the token sequence. (The statistics views would lag: a backend reports its
    row counts up to seconds after its transaction.)"""

    def __init__(self, db_url: str) -> None:
        self.url = db_url
        self.conn = (sqlite3.connect(db_url[len("sqlite:///"):])
                     if db_url.startswith("sqlite") else None)

    def __call__(self) -> object:
        if self.conn is not None:
            return int(self.conn.execute("PRAGMA data_version").fetchone()[0])
        return _pg_row_versions(self.url)


def _pg_row_versions(db_url: str) -> object:
    with psycopg.connect(db_url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "ORDER BY tablename")]
        versions = {t: conn.execute(  # table names from the catalogue, not from input
            f"SELECT count(*), coalesce(sum(xmin::text::bigint), 0) FROM {t}").fetchone()
            for t in tables}
        versions["wl_lease_token_seq"] = conn.execute(
            "SELECT last_value FROM wl_lease_token_seq").fetchone()
    return versions


def test_two_idle_workers_write_nothing_for_ten_seconds(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path,  # noqa: F811
    db_url: str, tmp_path: Path,
) -> None:
    ledger = make_ledger(retry_delay=3600.0)
    run_id = ledger.job(procs.JOB).submit({"n": 1}).run_id
    workers = [spawn(procs.worker_command(db_url, sink, concurrency=2, lease=1.0,
                                          retry_delay=3600.0, until_idle=False,
                                          ready_file=tmp_path / f"ready{i}"), name=f"w{i}")
               for i in range(2)]
    # the one item retries an hour from now: both workers are idle from then on
    wait_until(lambda: ledger.items(run_id)[0].not_before is not None, "the backed-off retry")
    wait_until(lambda: all((tmp_path / f"ready{i}").exists() for i in range(2)), "two workers")
    time.sleep(2.0)  # let both settle into their idle loop (their first sweeps included)
    writes = Writes(db_url)
    before = writes()
    time.sleep(10.0)
    after = writes()
    assert after == before, "an idle worker wrote to the ledger"
    for w in workers:
        assert w.popen.poll() is None, w.stderr()
    assert ledger.items(run_id)[0].state == "pending"


def test_two_workers_do_not_both_sweep(tmp_path: Path, db_url: str) -> None:
    import subprocess

    apps = Path(__file__).resolve().parents[1] / "apps"
    env = {"PYTHONPATH": str(apps), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "workledger.cli", "--db", db_url, "--app", "sample_app:ledger",
           "worker", "--lease", "0.4", "--log-level", "debug"]
    subprocess.run([sys.executable, "-m", "workledger.cli", "--db", db_url, "init"], env=env,
                   cwd=tmp_path, check=True, capture_output=True)
    procs_ = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=env, cwd=tmp_path, text=True) for _ in range(2)]
    time.sleep(6.0)  # both start (slowly, on a loaded machine), then sweep
    stopping = datetime.now()
    for p in procs_:
        p.terminate()
    logs = [p.communicate(timeout=60)[1] for p in procs_]
    # passes before the stop: once the leader stops, its lock is free and the other process,
    # not stopped yet, may rightly take over for a pass
    sweeping = [sum(1 for line in log.splitlines() if "sweep pass:" in line
                    and datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f") < stopping)
                for log in logs]
    assert sorted(sweeping)[0] == 0 and sorted(sweeping)[1] >= 3, (sweeping, logs)


def test_workers_of_different_jobs_each_sweep_their_own(tmp_path: Path, db_url: str) -> None:
    import subprocess

    apps = Path(__file__).resolve().parents[1] / "apps"
    env = {"PYTHONPATH": str(apps), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-m", "workledger.cli", "--db", db_url, "init"], env=env,
                   cwd=tmp_path, check=True, capture_output=True)
    procs_ = [subprocess.Popen([sys.executable, "-m", "workledger.cli", "--db", db_url, "--app",
                                "sample_app:ledger", "worker", "--lease", "0.4", "--log-level",
                                "debug", "--job", job], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, env=env, cwd=tmp_path, text=True)
              for job in ("numbers", "sends")]
    time.sleep(6.0)
    for p in procs_:
        p.terminate()
    logs = [p.communicate(timeout=60)[1] for p in procs_]
    # one lock per set of jobs: a sweeper of `numbers` would never decompose a `sends` run
    assert all(log.count("sweep pass:") >= 3 for log in logs), logs


# -- 4. nothing silently left out -----------------------------------------------------------------


def _expire_all(url: str) -> None:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///"):], timeout=30)
        conn.execute("UPDATE wl_items SET lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', "
                     "'-1 seconds') WHERE state = 'claimed'")
        conn.commit()
        conn.close()
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE wl_items SET lease_until = now() - interval '1 second' "
                     "WHERE state = 'claimed'")


def test_five_thousand_unknown_items_are_all_verified_and_all_audited(db_url: str) -> None:
    from workledger import Item, Ledger
    from workledger.storage.port import ClaimParams, LeaseParams

    n = 5100
    asked: list[str] = []
    ledger = Ledger(db_url)
    job = ledger.job("many")
    job.decompose(lambda p: (Item(key=f"u{i}") for i in range(n)))

    def verify(item: Any, ctx: Any) -> str:
        asked.append(str(item.key))
        return "not_done"

    job.stage("send", verify=verify)(lambda item, ctx: None)
    plain = ledger.job("plain")
    plain.decompose(lambda p: (Item(key=f"p{i}") for i in range(n)))
    plain.stage("send")(lambda item, ctx: None)
    runs = [job.submit({}, key="v").run_id, plain.submit({}, key="p").run_id]
    for run_id in runs:
        while claimed := ledger.store.items_claim(ClaimParams(run_id, 1000, 60.0)):
            ledger.store.items_mark_started(
                LeaseParams(run_id, [c.id for c in claimed], claimed[0].lease_token), charge=0)
    _expire_all(db_url)
    ledger.sweep(grace=0)
    assert sorted(asked) == sorted(f"u{i}" for i in range(n))  # every hook asked, in one pass
    people = [f for f in ledger.audit() if f.kind == "unknown" and f.needs_person]
    assert len(people) == n  # every unknown item listed, none cut off at 1,000
    assert ledger.resolve_many(runs[1], "send", "pending", note="bulk") == (n, 0)
    assert Counter(i.state for i in ledger.items(runs[1], limit=10_000)) == {"pending": n}
    ledger.close()
