"""The SQLite write-ahead log stays bounded (issue 21, item 6).

A reader that holds a transaction open (another process: a report, a shell, a backup) stops
SQLite from reusing the log, so it grows with every write made meanwhile: about 1 KB an item.
Before, it then kept that size for as long as any connection stayed open, since nothing set
``journal_size_limit`` or checkpointed with TRUNCATE. Now, once the reader has ended its
transaction, the ledger's next commit or idle worker truncates it under ``WAL_LIMIT``.
Real processes: the long reader, a worker, and ``status --watch`` reading all along."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from web_support import build, cli_env

from workledger.storage.sqlite import WAL_LIMIT

pytestmark = pytest.mark.concurrency

ITEMS = 40_000  # grows the log to about 30 MB behind the reader, past twice WAL_LIMIT

READER = textwrap.dedent("""
    import sqlite3, sys, time
    from pathlib import Path
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM wl_runs").fetchall()  # holds this snapshot
    Path(sys.argv[2]).write_text("holding")
    while not Path(sys.argv[3]).exists():
        time.sleep(0.05)
    conn.execute("COMMIT")  # the transaction ends; the connection stays open
    Path(sys.argv[2]).write_text("ended")
    while True:
        time.sleep(1)
""")


def wal_size(db: Path) -> int:
    try:
        return (db.parent / (db.name + "-wal")).stat().st_size
    except FileNotFoundError:
        return 0


def poll(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_the_wal_shrinks_under_its_limit_once_a_long_reader_ends(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    url = f"sqlite:///{db}"
    ledger = build(url)
    ledger.submit("numbers", {"n": 1}, key="first")  # the schema, and a run to watch
    held, release = tmp_path / "held", tmp_path / "release"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(db), str(held), str(release)])
    cli = [sys.executable, "-m", "workledger.cli", "--db", url]
    worker = subprocess.Popen([*cli, "--app", "web_app:ledger", "worker", "--chunk", "500"],
                              env=cli_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    watch = None
    try:
        poll(lambda: held.exists(), 30, "the reader's transaction")
        run_id = ledger.submit("numbers", {"n": ITEMS}, key="big").run_id
        watch = subprocess.Popen([*cli, "status", str(run_id), "--watch"], env=cli_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        poll(lambda: ledger.status(run_id).complete, 300, "the run")
        grown = wal_size(db)
        assert grown > 2 * WAL_LIMIT, f"the log did not grow behind the reader: {grown}"

        release.touch()
        poll(lambda: held.read_text() == "ended", 30, "the reader's commit")
        # no write of ours from here: the idle worker alone brings it down
        poll(lambda: wal_size(db) <= WAL_LIMIT, 30,
             f"the log to shrink under {WAL_LIMIT} (it is {wal_size(db)}, was {grown})")
        assert watch.poll() is None or watch.returncode == 0  # it read all along

        # and it stays bounded while the worker drains another run without a long reader
        more = ledger.submit("numbers", {"n": ITEMS}, key="more").run_id
        poll(lambda: ledger.status(more).complete, 300, "the second run")
        poll(lambda: wal_size(db) <= WAL_LIMIT, 30, "the log under its limit")
    finally:
        for proc in (worker, reader, watch):
            if proc is not None:
                proc.kill()
                proc.wait()
        ledger.close()
