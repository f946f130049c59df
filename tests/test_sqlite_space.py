"""SQLite out of space or read-only (issue 12): one clear line and exit 1, nothing acknowledged
lost, ``PRAGMA integrity_check`` ok, and the same command carries on once the space is back.

The CLI cases run on a real file system that really fills up: a small tmpfs mounted for the
test (root only; remounted larger to free space, read-only to refuse writes). The library
cases, which need no root, cap the ledger's size with ``PRAGMA max_page_count`` instead.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from workledger import Item, Ledger
from workledger.errors import StorageError

pytestmark = pytest.mark.integration

APPS = Path(__file__).resolve().parent / "apps"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of its own, unmounted afterwards."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def remount(where: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(where)], check=True)


def cli(db: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(APPS)}
    return subprocess.run([sys.executable, "-m", "workledger.cli", "--db", f"sqlite:///{db}",
                           "--app", "sample_app:ledger", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def one_error_line(out: subprocess.CompletedProcess[str], says: str) -> None:
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and says in errors[0], out.stderr


def fill(path: Path) -> None:
    """Write zeros to ``path`` until its file system has no space left."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)


def integrity(db: Path) -> tuple[str, dict[str, int]]:
    conn = sqlite3.connect(db)
    try:
        check = conn.execute("PRAGMA integrity_check").fetchone()[0]
        states = dict(conn.execute("SELECT state, count(*) FROM wl_items GROUP BY state"))
    finally:
        conn.close()
    return check, states


def test_a_submit_that_fills_the_disk_says_so_and_the_same_command_carries_on(
    small_disk: Path,
) -> None:
    db = small_disk / "ledger.db"
    assert cli(db, "submit", "numbers", "--payload", '{"n": 50}').returncode == 0
    assert cli(db, "worker", "--until-idle").returncode == 0
    big = ("submit", "numbers", "--payload", '{"n": 40000}', "--key", "big")
    one_error_line(cli(db, *big), "the disk is full")
    check, states = integrity(db)
    assert check == "ok"
    assert states["processed"] == 50  # what was acknowledged before is all there
    remount(small_disk, "size=64m")
    again = cli(db, *big)
    assert again.returncode == 0, again.stderr
    assert "was carried on" in again.stdout
    ledger = Ledger(f"sqlite:///{db}")
    try:
        st = ledger.status(2)
        assert st.total == 40000 and st.key == "big"
        conn = sqlite3.connect(db)
        rows, seqs = conn.execute("SELECT count(*), count(DISTINCT seq) FROM wl_items "
                                  "WHERE run_id = 2").fetchone()
        conn.close()
        assert rows == seqs == 40000  # no row written twice by the second try
    finally:
        ledger.close()


def test_a_worker_that_fills_the_disk_stops_with_one_line_and_the_same_command_finishes(
    small_disk: Path,
) -> None:
    remount(small_disk, "size=8m")
    db = small_disk / "ledger.db"
    n = 2000
    assert cli(db, "submit", "numbers", "--payload",
               f'{{"n": {n}, "sleep": 0.01}}').returncode == 0
    env = {**os.environ, "PYTHONPATH": str(APPS)}
    worker = subprocess.Popen([sys.executable, "-m", "workledger.cli", "--db", f"sqlite:///{db}",
                               "--app", "sample_app:ledger", "worker", "--until-idle",
                               "--lease", "2", "--concurrency", "4", "--chunk", "50"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while integrity(db)[1].get("processed", 0) < 100:
        assert worker.poll() is None and time.monotonic() < deadline, worker.communicate()
        time.sleep(0.05)
    fill(small_disk / "filler")  # the disk fills up under the worker
    out, err = worker.communicate(timeout=120)
    one_error_line(subprocess.CompletedProcess([], worker.returncode, out, err),
                   "the disk is full")
    check, states = integrity(db)
    assert check == "ok"
    assert 100 <= states["processed"] < n
    (small_disk / "filler").unlink()
    again = cli(db, "worker", "--until-idle", "--lease", "2")
    assert again.returncode == 0, again.stderr
    assert integrity(db) == ("ok", {"processed": n})


def test_a_read_only_file_system_gives_one_line_and_the_ledger_is_whole_after(
    small_disk: Path,
) -> None:
    db = small_disk / "ledger.db"
    assert cli(db, "submit", "numbers", "--payload", '{"n": 20}').returncode == 0
    remount(small_disk, "ro")
    try:
        one_error_line(cli(db, "worker", "--until-idle"), "read-only file system")
        one_error_line(cli(db, "submit", "numbers", "--payload", '{"n": 5}'),
                       "read-only file system")
    finally:
        remount(small_disk, "rw")
    assert cli(db, "worker", "--until-idle").returncode == 0
    assert integrity(db) == ("ok", {"processed": 20})


# -- the same, in one process, with the ledger's size capped ------------------------------------


def _ledger(path: Path) -> Ledger:
    ledger = Ledger(f"sqlite:///{path}")
    job = ledger.job("bulk")
    job.decompose(lambda p: (Item(key=f"b{i}", data={"pad": "x" * 200})
                             for i in range(p["n"])))
    job.stage("touch")(lambda item, ctx: {"ok": True})
    return ledger


def _cap(ledger: Ledger, extra_pages: int | None) -> None:
    """Cap the file at its present size plus ``extra_pages`` (None: lift the cap)."""
    conn = ledger.store._conn  # type: ignore[attr-defined]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    cap = 2**31 - 2 if extra_pages is None else pages + extra_pages
    conn.execute(f"PRAGMA max_page_count = {cap}")


def test_a_ledger_that_reaches_its_size_limit_loses_nothing_and_carries_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    ledger = _ledger(path)
    small = ledger.submit("bulk", {"n": 30}).run_id
    ledger.work(until_idle=True, concurrency=2)
    _cap(ledger, 4)
    with pytest.raises(StorageError, match="cannot grow: the disk is full"):
        ledger.submit("bulk", {"n": 20000}, key="big")
    big = ledger.status(small + 1)  # the run row and the rows written before the limit stay
    assert big.total < 20000 and big.state == "accepted"
    _cap(ledger, None)
    again = ledger.submit("bulk", {"n": 20000}, key="big")
    assert (again.created, again.resumed, again.status.total) == (False, True, 20000)
    _cap(ledger, 40)
    with pytest.raises(StorageError, match="the disk is full"):
        ledger.work(until_idle=True, concurrency=2, chunk=500, lease=1.0)
    _cap(ledger, None)
    time.sleep(1.1)  # the leases of the chunk it held run out; the next worker settles them
    ledger.work(until_idle=True, concurrency=2, chunk=500, lease=1.0)
    assert ledger.status(small).processed == 30
    assert ledger.status(again.run_id).processed == 20000
    ledger.close()
    assert integrity(path) == ("ok", {"processed": 20030})
