"""``worker --processes N`` (issue 14): handlers in child processes that import the app, with
real processes killed: a poison item takes only itself down, a time limit kills its child, a
killed worker leaves no child behind. Both backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from workledger import Ledger

pytestmark = pytest.mark.concurrency

APPS = Path(__file__).resolve().parents[1] / "apps"


def cli(db_url: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(APPS)}
    return subprocess.run([sys.executable, "-m", "workledger.cli", "--db", db_url, "--app",
                           "process_app:ledger", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def submit(db_url: str, job: str, **payload: Any) -> int:
    out = cli(db_url, "submit", job, "--payload", json.dumps(payload), "--json")
    assert out.returncode == 0, out.stderr
    return int(json.loads(out.stdout)["run_id"])


def items(db_url: str, run_id: int) -> list[Any]:
    ledger = Ledger(db_url)
    try:
        return ledger.items(run_id, limit=10_000)
    finally:
        ledger.close()


def worker_json(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_handlers_run_in_child_processes_of_the_worker(db_url: str) -> None:
    run_id = submit(db_url, "cpu", n=200)
    report = worker_json(cli(db_url, "worker", "--until-idle", "--processes", "2", "--json"))
    assert report["processed"] == 200
    rows = items(db_url, run_id)
    assert Counter(i.state for i in rows) == {"processed": 200}
    parents = {i.result["ppid"] for i in rows}
    pids = {i.result["pid"] for i in rows}
    assert len(parents) == 1  # one worker process: every handler ran in one of its children
    assert parents.isdisjoint(pids) and 1 <= len(pids) <= 2


def test_a_stage_that_asks_for_threads_runs_in_the_worker_itself(db_url: str) -> None:
    run_id = submit(db_url, "local", n=20)
    worker_json(cli(db_url, "worker", "--until-idle", "--processes", "2", "--json"))
    rows = items(db_url, run_id)
    assert len({i.result["pid"] for i in rows}) == 1
    assert {i.result["pid"] for i in rows}.isdisjoint({i.result["ppid"] for i in rows})


def test_stages_in_processes_and_in_threads_run_at_the_same_time(db_url: str) -> None:
    """One lane per kind of executor: the threads ship what the processes made a moment
    before, instead of waiting for the processes' chunk to end (or for all of it)."""
    run_id = submit(db_url, "relay", n=300)
    report = worker_json(cli(db_url, "worker", "--until-idle", "--processes", "2",
                             "--concurrency", "4", "--chunk", "20", "--json"))
    assert report["processed"] == 600
    rows = items(db_url, run_id)
    made = [i.result for i in rows if i.stage == "make"]
    shipped = [i.result for i in rows if i.stage == "ship"]
    assert len(made) == len(shipped) == 300
    last_made = max(r["end"] for r in made)
    # most of the shipping happened while the processes were still making
    assert sum(1 for r in shipped if r["start"] < last_made) >= 150
    assert {r["pid"] for r in shipped}.isdisjoint({r["pid"] for r in made})


def test_a_poison_item_takes_down_only_itself_and_its_process_is_replaced(
    db_url: str,
) -> None:
    run_id = submit(db_url, "cpu", n=300, poison=[7, 150])
    out = cli(db_url, "worker", "--until-idle", "--processes", "2", "--json")
    report = worker_json(out)
    assert report["lost_processes"] == 2
    assert out.stderr.count("its process died (exit code 137)") == 2
    rows = {i.seq: i for i in items(db_url, run_id)}
    assert all(i.state == "processed" for i in rows.values())
    assert (rows[7].attempts, rows[150].attempts) == (2, 2)  # charged once for the crash
    assert all(i.attempts == 1 for s, i in rows.items() if s not in (7, 150))  # no sibling


def test_a_poison_item_of_a_stage_that_is_not_idempotent_waits_for_a_person(
    db_url: str,
) -> None:
    run_id = submit(db_url, "once", n=30, poison=[4])
    worker_json(cli(db_url, "worker", "--until-idle", "--processes", "2", "--json"))
    rows = {i.seq: i for i in items(db_url, run_id)}
    assert (rows[4].state, rows[4].error) == ("unknown", "its process died (exit code 137)")
    assert Counter(i.state for i in rows.values()) == {"processed": 29, "unknown": 1}


def test_a_handler_past_its_time_limit_has_its_process_killed(db_url: str,
                                                              tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    run_id = submit(db_url, "cpu", n=6, hang=[2], marks=str(marks))
    out = cli(db_url, "worker", "--until-idle", "--processes", "2", "--timeout", "0.5",
              "--json")
    report = worker_json(out)  # exit 0: a killed process is never stuck
    rows = {i.seq: i for i in items(db_url, run_id)}
    assert (rows[2].state, rows[2].attempts) == ("failed", 2)
    assert rows[2].error == "retries exhausted after 2 attempts: timeout after 0.5s"
    assert report["abandoned"] == 2
    for pid in (int(p.name) for p in marks.iterdir()):  # the hung ones were killed
        assert not _alive(pid), pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of a process still being reaped counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_a_killed_worker_leaves_no_handler_process_behind_and_the_run_finishes(
    db_url: str, tmp_path: Path,
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    run_id = submit(db_url, "cpu", n=3000, marks=str(marks))
    env = {**os.environ, "PYTHONPATH": str(APPS)}
    proc = subprocess.Popen([sys.executable, "-m", "workledger.cli", "--db", db_url, "--app",
                             "process_app:ledger", "worker", "--processes", "2", "--lease",
                             "2"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(list(marks.iterdir())) < 2:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    children = [int(p.name) for p in marks.iterdir()]
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in children):
        assert time.monotonic() < deadline, "a handler process outlived its worker"
        time.sleep(0.1)
    report = worker_json(cli(db_url, "worker", "--until-idle", "--processes", "2", "--lease",
                             "2", "--json"))
    assert report["processed"] > 0
    assert Counter(i.state for i in items(db_url, run_id)) == {"processed": 3000}
