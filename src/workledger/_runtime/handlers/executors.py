"""Where handlers run: the one small interface the worker calls, and the thread executor.

The worker hands an executor a task (a callable that runs some handlers and returns what they
did) and gets a :class:`~concurrent.futures.Future`. The executor says when a task started, so
the worker can hold each handler to its time limit, and lets the worker *abandon* a task whose
handler ran past it: the worker settles the item itself, stops renewing its lease, and the
executor replaces the capacity the stuck task holds. The worker stays the only writer of
outcomes whatever the executor.

A Python thread cannot be killed: an abandoned handler keeps its thread until it returns (its
late result is then written and found stale). :class:`ThreadExecutor` starts a new thread in
its place, so the worker keeps its concurrency, and counts the threads still stuck.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Executor(Protocol):
    """What the worker needs from wherever handlers run."""

    size: int  # tasks that run at once

    def submit(self, fn: Callable[[], T]) -> Future[T]: ...
    def started_at(self, future: Future[Any]) -> float | None: ...  # monotonic, None: queued
    def abandon(self, future: Future[Any]) -> None: ...
    @property
    def stuck(self) -> int: ...  # abandoned tasks whose handler has not returned yet
    def shutdown(self) -> None: ...


@dataclass(eq=False)
class _Task:
    future: Future[Any]
    fn: Callable[[], Any]
    started: float | None = None
    abandoned: bool = field(default=False)


class TaskBook:
    """The tasks an executor was given and is not done with, by future: when each started,
    and which were abandoned. Shared by the executors; ``_lock`` guards it."""

    _lock: threading.Lock
    _tasks: dict[Future[Any], Any]

    def _track(self, task: Any) -> None:
        with self._lock:
            self._tasks[task.future] = task

    def _task(self, future: Future[Any]) -> Any:
        with self._lock:
            return self._tasks.get(future)

    def _forget(self, task: Any) -> None:
        with self._lock:
            self._tasks.pop(task.future, None)

    def started_at(self, future: Future[Any]) -> float | None:
        task = self._task(future)
        return None if task is None else task.started


class ThreadExecutor(TaskBook):
    """``size`` handler threads fed from one queue; an abandoned task's thread is replaced."""

    def __init__(self, size: int, name: str = "wl-handler",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self.name = name
        self.clock = clock
        self._queue: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._tasks: dict[Future[Any], _Task] = {}
        self._lock = threading.Lock()
        self._live = 0
        self._stuck = 0
        self._spawned = 0
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            self._live += 1
            self._spawned += 1
            n = self._spawned
        threading.Thread(target=self._loop, name=f"{self.name}-{n}", daemon=True).start()

    def _loop(self) -> None:
        while (task := self._queue.get()) is not None:
            if not task.future.set_running_or_notify_cancel():
                self._forget(task)
                continue
            task.started = self.clock()
            try:
                task.future.set_result(task.fn())
            except BaseException as exc:  # the task's own failure, returned through its future
                task.future.set_exception(exc)
            with self._lock:
                abandoned = task.abandoned
                if abandoned:
                    self._stuck -= 1
                    self._live -= 1
            self._forget(task)
            if abandoned:
                return  # a replacement took this thread's place when the task was abandoned
        with self._lock:
            self._live -= 1

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        task = _Task(future, fn)
        self._track(task)
        self._queue.put(task)
        return future

    def abandon(self, future: Future[Any]) -> None:
        with self._lock:
            task = self._tasks.get(future)
            if task is None or task.abandoned or future.done():
                return
            task.abandoned = True
            self._stuck += 1
        self._spawn()

    @property
    def stuck(self) -> int:
        with self._lock:
            return self._stuck

    def shutdown(self) -> None:
        """Let the threads that are not stuck finish their task and stop (stuck ones are
        daemons: they never hold the process open)."""
        with self._lock:
            healthy = self._live - self._stuck
        for _ in range(max(healthy, 0)):
            self._queue.put(None)
