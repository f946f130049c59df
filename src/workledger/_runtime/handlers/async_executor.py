"""Async handlers: one event loop in a thread of the worker, many coroutines in flight at once.

An ``async def`` handler (``Stage.executor == "async"``) runs here, whatever ``--processes``
says: the loop lives in the worker process, beside its threads, so the parent stays the only
writer of outcomes. :class:`AsyncExecutor` is the same small interface the worker calls for
threads and processes (``_runtime/handlers/executors.py``): the chunk submits a task and waits on a
:class:`~concurrent.futures.Future`, renews the leases of what is running, holds each task to
its time limit and writes the outcomes; only where the handler runs differs.

At most ``size`` tasks (the worker's ``--concurrency``) run at once; the rest wait in the
executor, unstarted, so a stopping worker can still take them back (``Future.cancel``). A task
past its time limit is abandoned: its coroutine is cancelled (it sees ``CancelledError`` at its
next ``await``) and its slot goes to the next task at once. One that ignores the cancellation
and keeps running is *stuck*, as an abandoned thread is, until it returns. A handler that
blocks the loop (a synchronous sleep or socket call) holds up every task on it: the time
limits are still watched from the worker's own thread, but nothing on the loop runs meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from workledger._runtime.handlers.executors import TaskBook

SHUTDOWN_GRACE = 2.0  # seconds cancelled tasks get to end when the worker shuts down


@dataclass(eq=False)
class _Task:
    future: Future[Any]
    fn: Callable[[], Awaitable[Any]]
    started: float | None = None
    abandoned: bool = field(default=False)
    running: asyncio.Task[Any] | None = None


class AsyncExecutor(TaskBook):
    """Up to ``size`` coroutines at once on one event loop, in a thread of its own."""

    def __init__(self, size: int, name: str = "wl-async",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self.clock = clock
        self._tasks: dict[Future[Any], _Task] = {}
        self._lock = threading.Lock()
        self._stuck = 0  # under _lock
        self._waiting: deque[_Task] = deque()  # touched in the loop's thread only
        self._running = 0  # the same: started, neither finished nor abandoned
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    # -- the Executor interface --------------------------------------------------------------

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn()`` on the loop when a slot is free and await what it returns (an
        awaitable: the one difference from a thread executor's task); the future holds its
        value, or what it raised. Once started it runs (``Future.cancel`` fails), as a
        thread's task does."""
        future: Future[Any] = Future()
        task = _Task(future, fn)
        self._track(task)
        self._loop.call_soon_threadsafe(self._enqueue, task)
        return future

    def abandon(self, future: Future[Any]) -> None:
        """Past its time limit: cancel its coroutine and give its slot to the next task."""
        with self._lock:
            task = self._tasks.get(future)
            # a task not started yet has no time limit running (the chunk never abandons one)
            if task is None or task.abandoned or future.done() or task.started is None:
                return
            task.abandoned = True
            self._stuck += 1
        self._loop.call_soon_threadsafe(self._cancel, task)

    @property
    def stuck(self) -> int:
        """Abandoned tasks whose coroutine has not ended yet (it ignored its cancellation)."""
        with self._lock:
            return self._stuck

    def shutdown(self) -> None:
        """Cancel what still runs (once the worker is done with its chunks, only abandoned
        tasks), give it :data:`SHUTDOWN_GRACE` seconds to end, and stop the loop."""
        if not self._thread.is_alive():
            return
        ended = asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop)
        try:
            ended.result(SHUTDOWN_GRACE + 1.0)
        except TimeoutError:
            pass  # a handler blocks the loop: its daemon thread never holds the process open
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(SHUTDOWN_GRACE)
        if not self._thread.is_alive():
            self._loop.close()

    # -- in the loop's thread ----------------------------------------------------------------

    def _enqueue(self, task: _Task) -> None:
        self._waiting.append(task)
        self._start()

    def _start(self) -> None:
        while self._waiting and self._running < self.size:
            task = self._waiting.popleft()
            if not task.future.set_running_or_notify_cancel():  # taken back by a stopping worker
                self._forget(task)
                continue
            task.started = self.clock()
            self._running += 1
            task.running = self._loop.create_task(_awaited(task.fn))
            task.running.add_done_callback(partial(self._ended, task))

    def _ended(self, task: _Task, running: asyncio.Task[Any]) -> None:
        """The task's end, whatever it was (a cancellation too, even one that came before
        its coroutine's first step), through its future."""
        if running.cancelled():
            task.future.set_exception(asyncio.CancelledError())  # an abandoned task's end
        elif (error := running.exception()) is not None:
            task.future.set_exception(error)
        else:
            task.future.set_result(running.result())
        with self._lock:
            abandoned = task.abandoned
            if abandoned:
                self._stuck -= 1
        if not abandoned:  # an abandoned task gave up its slot when it was abandoned
            self._running -= 1
        self._forget(task)
        self._start()

    def _cancel(self, task: _Task) -> None:
        self._running -= 1
        if task.running is not None:
            task.running.cancel()
        self._start()

    async def _cancel_all(self) -> None:
        for task in self._waiting:
            task.future.cancel()
        self._waiting.clear()
        this = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not this]
        for t in left:
            t.cancel()
        if left:
            await asyncio.wait(left, timeout=SHUTDOWN_GRACE)
        await self._loop.shutdown_asyncgens()


async def _awaited(fn: Callable[[], Awaitable[Any]]) -> Any:
    return await fn()  # fn() is called on the loop: what it raises is the task's end too
