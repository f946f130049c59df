"""A broker worker that forks its task processes never has a SQLite ledger open when it forks
(issue 21; the campaign's broker rounds on SQLite, seed 1311 rounds 14, 18, 25 and eight more).

``rq worker`` forks a work horse per message; Celery's prefork pool forks a process whenever it
replaces one. The ledger's sweeper ran in a thread of that forking process with the SQLite file
open. SQLite keeps what it knows of a file's locks (its inode table and the wal-index's lock
state) in the process's memory, and a fork copies that memory but not the locks themselves: a
work horse forked while the sweeper held the write lock opened its own connection into the
copied table, which said the write lock was taken, and waited on ``BEGIN IMMEDIATE`` for ever
(caught with ``py-spy dump``: the horse in ``SqliteStore._tx``, the parent idle). Its message
never ended, RQ's warm shutdown waited on it, and the messages queued behind it waited too.

The sweeper of a SQLite ledger now runs in a process of its own, started afresh (never forked)
beside the broker worker, which itself never opens the file. Real ``rq worker`` and ``celery
worker`` processes on the real Redis; ``/proc`` says which process holds which file.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_support import Setup, _in_session, check_oracle, logs_of, setup_for, wait_settled
from waiting import poll

pytestmark = pytest.mark.concurrency

UNITS = 300


@pytest.fixture(params=["rq", "celery-redis"])
def sqlite_setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    yield from setup_for(request.param, f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path)


def _ledger_files(pid: int, db: Path) -> list[str]:
    """The ledger's files (``ledger.db``, its ``-wal`` and ``-shm``) process ``pid`` holds."""
    held = []
    try:
        entries = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return held
    for fd in entries:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(db)) and ".holders" not in target and ".sweeper" not in target:
            held.append(target)
    return held


def _sweepers(session: int) -> list[int]:
    """The sweeper processes of a broker worker's session."""
    found = []
    for pid in _in_session(session):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"workledger.contrib._sweeping" in cmdline:
            found.append(pid)
    return found


def _sweeping(setup: Setup) -> bool:
    return "sweeping " in logs_of(setup.tmp, tail=None)


def test_a_forking_broker_worker_never_holds_the_sqlite_ledger_open(
        sqlite_setup: Setup) -> None:
    setup = sqlite_setup
    db = setup.tmp / "ledger.db"
    ledger = setup.ledger()
    worker = setup.start_worker(setup.tmp / "worker.log")
    first = ledger.job_named("batch").submit({"units": UNITS}, key="first")
    poll(lambda: _sweeping(setup), "the worker's sweeper to start", timeout=60)
    wait_settled(setup, ledger, first.run_id)
    # the sweeper swept meanwhile (its lease is 2 s: a pass a second); the process that forks
    # the task processes holds no file of the ledger, whatever the sweeper is doing
    for _ in range(20):
        assert _ledger_files(worker.pid, db) == [], logs_of(setup.tmp)
        time.sleep(0.1)
    # ... and the sweeper still does its work: a lost message is published again
    second = ledger.job_named("batch").submit({"units": UNITS}, key="second")
    setup.purge(ledger)
    wait_settled(setup, ledger, second.run_id, timeout=120)
    assert check_oracle(setup, ledger, second.run_id, UNITS)["unknown"] == 0
    ledger.close()


def test_the_sweeper_process_ends_with_its_broker_worker(sqlite_setup: Setup) -> None:
    """Killed alone (``kill -9`` of the worker's main process, not its session), the broker
    worker leaves no sweeper behind: its sweeper sees its parent gone."""
    setup = sqlite_setup
    ledger = setup.ledger()
    worker = setup.start_worker(setup.tmp / "worker.log")
    run = ledger.job_named("batch").submit({"units": 20}, key="once")
    poll(lambda: _sweeping(setup), "the worker's sweeper to start", timeout=60)
    wait_settled(setup, ledger, run.run_id)
    sweepers = _sweepers(worker.pid)
    assert len(sweepers) == 1, "the sweeper runs in one process of the worker's session"
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)
    poll(lambda: not _sweepers(worker.pid), "the sweeper to end with its worker", timeout=30)
    setup.kill(worker)  # RQ's scheduler, forked by the worker, outlives it: not left behind
    ledger.close()
