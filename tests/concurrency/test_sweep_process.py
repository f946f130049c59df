"""The sweeper process beside a broker worker (``contrib/_broker.py`` ``SweepProcess``, issue 21;
found by review): it starts without waiting on any process the worker forks meanwhile, it is
started again when it ends while its worker lives, and it ends when its worker is gone even if
that happened while it was still starting. Real processes, real signals."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from waiting import poll

from workledger.contrib._broker import SweepProcess

pytestmark = pytest.mark.concurrency

NO_APP = "wl_no_such_module_for_tests:ledger"  # its sweeper ends at once: it cannot import it


def _alive(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def test_it_starts_while_the_worker_forks_long_lived_processes() -> None:
    """RQ's worker forks its scheduler (and Celery its pool) from another thread at any moment;
    a start that shared a pipe with such a fork (``subprocess``'s exec-status pipe) waited for
    that process to end, holding the lock the work horses fork under."""
    stop = threading.Event()
    children: list[int] = []

    def fork_meanwhile() -> None:
        while not stop.is_set() and len(children) < 400:
            pid = os.fork()
            if pid == 0:  # a long-lived child that never execs, like RQ's scheduler
                time.sleep(60)
                os._exit(0)
            children.append(pid)
            time.sleep(0.002)

    forker = threading.Thread(target=fork_meanwhile, daemon=True)
    started: list[SweepProcess] = []
    forker.start()
    try:
        for _ in range(20):
            started.append(SweepProcess(NO_APP))
        stop.set()
        forker.join()
        # had a start waited on one of them, they would have ended first (60 s)
        assert children and all(_alive(pid) for pid in children)
    finally:
        stop.set()
        for process in started:
            process.stop()
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_it_is_started_again_when_it_ends_while_its_worker_lives(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="workledger")
    process = SweepProcess(NO_APP)
    try:
        first = process.pid
        poll(lambda: process.pid != first, "the sweeper to be started again", timeout=30)
        assert "started again" in caplog.text
    finally:
        process.stop()
    assert process.pid is None or not _alive(process.pid)


APP = """
from redis import Redis
from workledger import Ledger
from workledger.contrib.rq import RQDispatch

ledger = Ledger("sqlite:///{db}", dispatch=RQDispatch(
    Redis.from_url("redis://127.0.0.1:6379/15"), "wl-sweep-process-test",
    app="sweep_app:ledger"))
ledger.job("batch").stage("only", idempotent=True)(lambda item, ctx: None)
"""


def test_it_ends_when_its_worker_died_while_it_was_starting(tmp_path: Path) -> None:
    """The worker is gone before the sweeper has looked at who started it: it must not sweep
    on, an orphan holding the lead, with whatever code it started with."""
    (tmp_path / "sweep_app.py").write_text(APP.format(db=tmp_path / "ledger.db"))
    (tmp_path / "worker.py").write_text(
        "import os\n"
        "from workledger.contrib._broker import SweepProcess\n"
        "p = SweepProcess('sweep_app:ledger')\n"
        "print(p.pid, flush=True)\n"
        "os._exit(0)  # at once: the sweeper is still starting\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "worker.py"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    poll(lambda: _gone(pid), "the orphaned sweeper to end", timeout=30)


def test_it_imports_the_app_from_the_working_directory_after_the_standard_library(
        tmp_path: Path) -> None:
    """A ``json.py`` beside the app (a project's own module) is not the standard library's:
    the sweeper imports the app as ``import_app`` does, and sweeps."""
    (tmp_path / "sweep_app.py").write_text(APP.format(db=tmp_path / "ledger.db"))
    (tmp_path / "json.py").write_text("raise ImportError('this is ./json.py')\n")
    (tmp_path / "worker.py").write_text(
        "import sys, time\n"
        "sys.path.remove(sys.path[0])  # as a console script: its folder, not this one\n"
        "from workledger.contrib._broker import SweepProcess\n"
        "p = SweepProcess('sweep_app:ledger')\n"
        "time.sleep(6)\n"
        "print(p.pid, flush=True)\n"
        "p.stop()\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-P", "worker.py"], capture_output=True, text=True,
                          timeout=90, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "sweeping " in done.stderr, done.stderr
    assert "ended (exit" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
