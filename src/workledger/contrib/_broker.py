"""What both broker adapters' worker processes share: finding the ledger a message names, and
running the ledger's sweeper beside the broker's own loop.

A user starts only the broker's worker command; its processes run the ledger's periodic
sweeper (``_runtime/repair/sweeper.py``: expired leases, verify and closing hooks, re-decompositions
and the re-dispatch of what a broker lost), in a thread, only while this process leads the
sweeping of the ledger's jobs (``Store.lead``), exactly as ``workledger worker`` does. Many
broker worker processes of one ledger therefore run one sweeper, and a second one takes over
when the first is gone.

On SQLite the loop runs in a process of its own (``_sweeping.py``), started afresh beside the
worker, never in the worker: a worker that forks its task processes must never have the file
open when it forks (a child forked while the sweeper held the write lock would wait for it for
ever, since a fork copies SQLite's record of the locks but not the locks).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import threading
import time
from dataclasses import asdict
from typing import Protocol

from workledger._runtime.patience import Patience, patient
from workledger._runtime.repair.sweeper import SweepLoop, SweepReport
from workledger._runtime.worker.worker import new_worker_id
from workledger.api import Ledger, import_app
from workledger.errors import UsageError

log = logging.getLogger("workledger.dispatch")

EVERY_AT_MOST = 10.0  # seconds between sweeps, as a worker's: min(lease / 2, this)


def ledger_named(app: str, *, imported: bool = False) -> Ledger:
    """The ledger ``module:attribute`` names. ``imported``: only from a module this process
    imported already, so that a message cannot make a worker import anything."""
    module = app.partition(":")[0]
    if imported and module not in sys.modules:
        raise UsageError(f"a message for the ledger {app}, whose module this worker has not "
                         "imported: the app the worker starts with must import it")
    found = import_app(app)
    if not isinstance(found, Ledger):
        raise UsageError(f"a message for {app}, which is a {type(found).__name__}, not a Ledger")
    return found


class Sweeping(Protocol):
    """A ledger's sweeper loop that runs until it is stopped."""

    def terminate(self) -> None:
        """Ask it to stop, without waiting."""

    def stop(self) -> None:
        """Stop it and wait until it has."""


def start_sweeping(ledger: Ledger) -> Sweeping:
    """Start the ledger's sweeper loop beside this broker worker: in a process of its own for a
    SQLite ledger (this process forks, and must never hold the file open when it does), in a
    thread of this process otherwise. Stop it with ``stop()``."""
    if ledger.url.lower().startswith("sqlite:"):
        return SweepProcess(ledger._app_name())
    return sweep_here(ledger)


SWEEP_PATH = "WORKLEDGER_SWEEPER_PATH"  # this process's import path, for the sweeper process


class SweepProcess:
    """``python -P -m workledger.contrib._sweeping --parent PID APP``, started afresh and
    supervised: it imports the ledger as this process did (the same import path, the working
    directory searched after the standard library, as ``import_app`` does), ends when stopped
    or when this process is gone, and is started again when it ends otherwise (killed, or the
    app could not be imported), after a wait that doubles up to a minute.

    It is started with ``posix_spawn``, not ``fork`` + ``exec``: the worker forks long-lived
    processes from other threads at any moment (RQ's scheduler, Celery's pool), and one forked
    while ``subprocess`` had its exec-status pipe open would keep that pipe, and the start
    waiting, for as long as it lived."""

    STOP_WITHIN = 25.0  # seconds for a sweep in progress to end before the process is killed
    RESTART_AFTER = (1.0, 60.0)  # the first and the longest wait before it is started again
    STEADY = 60.0  # seconds alive after which a restart waits the first wait again

    def __init__(self, app: str) -> None:
        self.app = app
        self.pid: int | None = None
        self._pidfd: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the pid and its descriptor change together
        self._spawn()
        self._watch = threading.Thread(target=self._supervise, name="wl-sweep-process",
                                       daemon=True)
        self._watch.start()

    def _spawn(self) -> None:
        here = {"", os.getcwd()}
        env = dict(os.environ)
        env[SWEEP_PATH] = json.dumps([p for p in sys.path if p not in here])
        argv = [sys.executable, "-P", "-m", "workledger.contrib._sweeping",
                "--parent", str(os.getpid()), self.app]
        pid = os.posix_spawn(sys.executable, argv, env, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)])
        with self._lock:
            self.pid = pid
            self._pidfd = _pidfd(pid)
        log.info("the sweeper of %s runs in process %d", self.app, pid)

    def _supervise(self) -> None:
        wait = self.RESTART_AFTER[0]
        while True:
            pid, began = self.pid, time.monotonic()
            assert pid is not None
            try:
                status: int | None = os.waitpid(pid, 0)[1]
            except ChildProcessError:  # reaped by someone else (a pool that waits for any child)
                status = None
            with self._lock:
                self.pid = None
                if self._pidfd is not None:
                    os.close(self._pidfd)
                    self._pidfd = None
            if self._stop.is_set():
                return
            if time.monotonic() - began > self.STEADY:
                wait = self.RESTART_AFTER[0]
            how = "unknown" if status is None else os.waitstatus_to_exitcode(status)
            log.warning("the sweeper of %s ended (exit %s) while its worker runs: started "
                        "again in %gs", self.app, how, wait)
            if self._stop.wait(wait):
                return
            wait = min(wait * 2, self.RESTART_AFTER[1])
            try:
                self._spawn()
            except OSError:
                log.exception("could not start the sweeper of %s again", self.app)

    def _signal(self, signum: int) -> None:
        with self._lock:
            if self.pid is None:
                return
            try:
                if self._pidfd is not None:  # never a process that took a reaped one's pid
                    signal.pidfd_send_signal(self._pidfd, signum)
                else:
                    os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self._stop.set()
        self._signal(signal.SIGTERM)

    def stop(self) -> None:
        self.terminate()
        self._watch.join(self.STOP_WITHIN)
        if self._watch.is_alive():
            log.warning("the sweeper of %s did not stop within %gs: killed", self.app,
                        self.STOP_WITHIN)
            self._signal(signal.SIGKILL)
            self._watch.join(5.0)


def _pidfd(pid: int) -> int | None:
    """A descriptor that names process ``pid`` for as long as it is open (Linux 5.3 and on)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def sweep_here(ledger: Ledger) -> SweepLoop:
    """Start the ledger's sweeper loop in a thread of this process; stop it with ``stop()``."""
    assert ledger.dispatch is not None
    options = ledger.dispatch.options
    store = patient(ledger.store, Patience(600.0, rng=random.Random()))
    sweeper = ledger.sweeper(actor=f"{new_worker_id()} sweeper", lease=options.lease,
                             timeout=options.timeout, store=store, backoff=30.0)
    every = min(options.lease / 2, options.wait / 2, EVERY_AT_MOST)
    loop = SweepLoop(sweeper, store, every, _swept)
    loop.start()
    log.info("sweeping %s (jobs %s) every %gs while this process leads; re-dispatching what "
             "waited %gs without a claim", ledger.where, ", ".join(sorted(ledger.jobs)),
             every, options.wait)
    return loop


def _swept(report: SweepReport) -> None:
    done = {k: v for k, v in asdict(report).items() if v}
    if done:
        log.info("sweep: %s", ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in done.items()))
