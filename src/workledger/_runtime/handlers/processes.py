"""Handlers in child processes (``worker --processes N``), so CPU-bound stages use every core.

Each child imports the app (``module:attribute``, the ``--app`` of the worker) and runs the
handlers of the slices it is sent, one item at a time, reporting each outcome as it comes. The
parent keeps claiming, renewing leases and writing every outcome, fenced, as with threads: one
writer to the database whatever the number of children, and fencing does not change.

A child that dies (a poison item, the OOM killer) is replaced. Only the item it was running is
affected: the outcomes it reported before are kept, the items after it never started and are
released, and the one it was running comes back as :class:`HolderLost`, which the worker
settles by the stage's declaration, as if that item's holder had vanished. A handler past its
time limit is a hard limit here: its child is killed (and replaced), unlike a thread.

Children are started with ``spawn``: a fresh interpreter that imports the app, never a fork of
a process that holds database connections and threads. ``spawn`` runs ``python -c``, which puts
the working directory first on ``sys.path`` while multiprocessing boots (a ``pickle.py`` or
``org.py`` lying there would run in every child), so children start with ``PYTHONSAFEPATH=1``
and give their handlers the environment back as the worker had it.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from workledger._runtime.handlers.executors import TaskBook
from workledger.core.outcomes import Outcome
from workledger.errors import AppError, UsageError
from workledger.storage import holders
from workledger.storage.port import ClaimedItem

POLL = 0.05  # seconds between looks at a running child (its outcome, its death, an abandon)
START_TIMEOUT = 60.0  # seconds a child may take to import the app


@dataclass(frozen=True)
class HolderLost:
    """The process running the item died (or was killed at its time limit) before it said
    how the item ended."""

    reason: str


@dataclass(frozen=True)
class Slice:
    """What a child is sent: the items of one job to run in turn."""

    job: str
    items: Sequence[ClaimedItem]
    worker_id: str
    batch: bool = False  # one call of a batch handler for all the items


Ran = tuple[ClaimedItem, "Outcome | HolderLost | None"]  # None: never started


def import_app(spec: str) -> Any:
    """The object ``module:attribute`` names: the CLI's ``--app``, and what a handler process
    imports. The current directory is searched for the app's module (after the standard
    library and the installed packages, so a ``sqlite3.py`` lying there is never imported in
    place of the real one) only while that module loads: it is taken off ``sys.path`` again,
    so a file there (a ``websockets.py``) cannot replace a module imported later."""
    module_name, _, attr = spec.partition(":")
    obj: Any = _import_beside(module_name, os.getcwd())
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _import_beside(module_name: str, folder: str) -> Any:
    added = folder not in sys.path
    if added:
        sys.path.append(folder)
    try:
        return importlib.import_module(module_name)
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


def find_app(obj: Any) -> str:
    """``module:attribute`` of an imported module that holds ``obj``, for child processes to
    import it by; a UsageError when there is none (a ledger made in ``__main__`` or inside a
    function cannot be imported by a child)."""
    for name, module in list(sys.modules.items()):
        if module is None or name in ("__main__", "__mp_main__"):
            continue
        for attr, value in list(vars(module).items()):
            if value is obj:
                return f"{name}:{attr}"
    raise UsageError("handler processes import the app: name the module attribute that holds "
                     "this ledger (processes=N, app='module:attribute'; the CLI's --app)")


SAFE_PATH = "PYTHONSAFEPATH"
_ENVIRONMENT = threading.Lock()  # children start one at a time while the variable is set


@contextmanager
def _safe_start() -> Iterator[str | None]:
    """``PYTHONSAFEPATH=1`` while a child starts (and the resource tracker the first start
    launches), so ``python -c`` puts no directory on its sys.path; yields the value the worker
    had, for the child to restore."""
    with _ENVIRONMENT:
        before = os.environ.get(SAFE_PATH)
        os.environ[SAFE_PATH] = "1"
        try:
            yield before
        finally:
            if before is None:
                del os.environ[SAFE_PATH]
            else:
                os.environ[SAFE_PATH] = before


def _child_main(app: str, conn: Connection, running: Any, safe_path: str | None = None,
                holder_file: str | None = None) -> None:
    """A child's life: import the app, then run slices until told to stop (None) or until the
    parent is gone (its end of the pipe closes). ``running`` (shared memory) holds the index
    of the item it is running, so that the parent knows which one it was if it dies; the
    outcomes of a slice go back in one message when the slice ends. ``safe_path``: the
    worker's own PYTHONSAFEPATH, which the handlers see (and what they start inherits).
    ``holder_file``: the worker's holder (SQLite, storage/holders.py), held by this process too
    for as long as it lives, so a handler that outlives its worker keeps its leases."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if holder_file is not None:
        holders.join(holder_file)
    if safe_path is None:
        os.environ.pop(SAFE_PATH, None)
    else:
        os.environ[SAFE_PATH] = safe_path
    try:
        jobs = import_app(app).jobs
    except BaseException as exc:  # noqa: BLE001 - told to the parent, which says it in one line
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            conn.send(("end", _run_slice(jobs[task.job], task, running)))
        except OSError:  # the parent is gone: nobody would write the outcome
            return


def _run_slice(job: Any, task: Slice, running: Any) -> list[Outcome]:
    from workledger._runtime.handlers.execute import run_batch, run_handler

    first = job.stage_named(task.items[0].stage)
    if first.batch:  # one call for the batch
        running.value = 0
        return run_batch(job, first, task.items, task.worker_id)
    outcomes = []
    stage = first
    for index, item in enumerate(task.items):
        running.value = index
        if stage.name != item.stage:
            stage = job.stage_named(item.stage)
        outcomes.append(run_handler(job, stage, item, item.attempts + 1, task.worker_id))
    running.value = len(task.items)  # every one ran: dying now leaves each in doubt
    return outcomes


class _Child:
    """One handler process. Started at once; :meth:`ready` waits for it to have imported the
    app, so that several children import theirs side by side."""

    def __init__(self, app: str, name: str, holder_file: str | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.app = app
        self.conn, theirs = ctx.Pipe()
        self.running = ctx.RawValue("q", -1)  # the index of the item it is running
        with _safe_start() as safe_path:
            self.proc = ctx.Process(target=_child_main, name=name, daemon=True,
                                    args=(app, theirs, self.running, safe_path, holder_file))
            self.proc.start()
        theirs.close()

    def ready(self) -> _Child:
        app = self.app
        if not self.conn.poll(START_TIMEOUT):
            self.kill()
            raise AppError(f"a handler process did not start within {START_TIMEOUT:g}s")
        try:
            kind, detail = self.conn.recv()
        except EOFError:
            kind, detail = "error", f"it exited with code {self.proc.exitcode}"
        if kind != "ready":
            self.kill()
            raise AppError(f"a handler process cannot load the app {app!r}: {detail}")
        return self

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(5)
        self.kill()


@dataclass(eq=False)
class _Task:
    future: Future[list[Ran]]
    work: Slice
    started: float | None = None
    abandoned: bool = field(default=False)


class ProcessExecutor(TaskBook):
    """``size`` child processes, each fed by a thread of the parent that owns its pipe."""

    def __init__(self, size: int, app: str, clock: Callable[[], float] = time.monotonic,
                 holder_file: str | None = None) -> None:
        self.size = size
        self.app = app
        self.holder_file = holder_file  # each child holds the worker's holder alive too
        self.clock = clock
        self.deaths = 0  # children that died or were killed, each replaced
        self._queue: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._tasks: dict[Future[Any], _Task] = {}
        self._lock = threading.Lock()
        started = [_Child(app, f"wl-process-{i + 1}", holder_file) for i in range(size)]
        try:
            children = [child.ready() for child in started]
        except BaseException:
            for child in started:
                child.kill()
            raise
        self._threads = [threading.Thread(target=self._feed, args=(c,), daemon=True,
                                          name=f"wl-process-feed-{i + 1}")
                         for i, c in enumerate(children)]
        for t in self._threads:
            t.start()

    # -- the Executor interface --------------------------------------------------------------

    def submit_slice(self, work: Slice) -> Future[list[Ran]]:
        future: Future[list[Ran]] = Future()
        task = _Task(future, work)
        self._track(task)
        self._queue.put(task)
        return future

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        raise TypeError("a process executor runs slices of items (submit_slice), not callables")

    def abandon(self, future: Future[Any]) -> None:
        """Past its time limit: its child is killed (and replaced) by the thread feeding it."""
        task = self._task(future)
        if task is not None:
            task.abandoned = True

    @property
    def stuck(self) -> int:
        return 0  # a child past its limit is killed, never left running

    @property
    def running(self) -> bool:
        """A child may still be running a handler (its feeding thread has not ended)."""
        return any(t.is_alive() for t in self._threads)

    def shutdown(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(30)

    # -- feeding one child -------------------------------------------------------------------

    def _feed(self, child: _Child) -> None:
        while (task := self._queue.get()) is not None:
            if not task.future.set_running_or_notify_cancel():
                self._forget(task)
                continue
            task.started = self.clock()
            ran, alive = self._run(child, task)
            if not alive:
                child.kill()
                with self._lock:
                    self.deaths += 1
                child = self._replace(child)
            self._forget(task)
            task.future.set_result(ran)
        child.stop()

    def _run(self, child: _Child, task: _Task) -> tuple[list[Ran], bool]:
        """Send the slice and gather its outcomes; (what ran, whether the child lives on)."""
        items = list(task.work.items)
        child.running.value = -1
        try:
            child.conn.send(task.work)
            while True:
                if task.abandoned:
                    return self._lost(items, child, "killed at its time limit",
                                      task.work.batch), False
                if not child.conn.poll(POLL):
                    if not child.proc.is_alive():
                        break
                    continue
                kind, outcomes = child.conn.recv()
                if kind == "end":
                    return list(zip(items, outcomes, strict=True)), True
        except (EOFError, OSError):
            pass
        child.proc.join(1)
        reason = f"its process died (exit code {child.proc.exitcode})"
        return self._lost(items, child, reason, task.work.batch), False

    @staticmethod
    def _lost(items: list[ClaimedItem], child: _Child, reason: str,
              batch: bool = False) -> list[Ran]:
        """The item the child was running is lost; the others come back as never run (those
        before it did run, but their outcomes died with the child: a slice of several items
        is only ever of an idempotent stage, where running again is safe). In a batch, one
        call held every item: each one is lost; and so is each item of a slice the child had
        finished but not reported."""
        running = child.running.value  # -1: it had not begun the slice
        return [(item, HolderLost(reason)
                 if (batch and running >= 0) or i == running or running >= len(items)
                 else None) for i, item in enumerate(items)]

    def _replace(self, dead: _Child) -> _Child:
        while True:
            try:
                return _Child(self.app, dead.proc.name, self.holder_file).ready()
            except AppError:
                time.sleep(1.0)  # the app failed to import now: try again, do not spin
