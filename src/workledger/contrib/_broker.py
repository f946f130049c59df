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

import logging
import os
import random
import signal
import subprocess
import sys
from dataclasses import asdict
from typing import Protocol
from urllib.parse import urlsplit

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

    def stop(self) -> None: ...


def start_sweeping(ledger: Ledger) -> Sweeping:
    """Start the ledger's sweeper loop beside this broker worker: in a process of its own for a
    SQLite ledger (this process forks, and must never hold the file open when it does), in a
    thread of this process otherwise. Stop it with ``stop()``."""
    if urlsplit(ledger.url).scheme == "sqlite":
        return SweepProcess(ledger._app_name())
    return sweep_here(ledger)


class SweepProcess:
    """``python -m workledger.contrib._sweeping APP``, started afresh (not forked), with this
    process's import path and working directory so that it imports the same ledger; it ends when
    stopped or when this process is gone."""

    STOP_WITHIN = 60.0  # seconds for a hook in progress to end before the process is killed

    def __init__(self, app: str) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
        self.app = app
        self.process = subprocess.Popen(  # noqa: S603 - our own module, our own interpreter
            [sys.executable, "-m", "workledger.contrib._sweeping", app],
            env=env, cwd=os.getcwd(), stdin=subprocess.DEVNULL)
        log.info("the sweeper of %s runs in process %d", app, self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=self.STOP_WITHIN)
        except subprocess.TimeoutExpired:
            log.warning("the sweeper of %s did not stop within %gs: killed", self.app,
                        self.STOP_WITHIN)
            self.process.kill()
            self.process.wait()


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
