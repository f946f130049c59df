"""The event-loop executor on its own: at most ``size`` coroutines at once, the rest waiting
unstarted (and cancellable, as a stopping worker needs), abandoning cancels and frees the
slot at once, a coroutine that ignores its cancellation is stuck until it returns."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from workledger._runtime.handlers.async_executor import AsyncExecutor

pytestmark = pytest.mark.unit

DEADLINE = 10.0


def until(cond: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def tasks() -> Iterator[AsyncExecutor]:
    executor = AsyncExecutor(2)
    yield executor
    executor.shutdown()


def gated(gate: threading.Event, seen: list[str], name: str, value: Any = None) -> Any:
    async def run() -> Any:
        seen.append(f"start {name}")
        try:
            while not gate.is_set():
                await asyncio.sleep(0.005)
        except asyncio.CancelledError:
            seen.append(f"cancelled {name}")
            raise
        return value

    return run


def test_at_most_size_run_at_once_and_the_rest_wait_unstarted(tasks: AsyncExecutor) -> None:
    gate, seen = threading.Event(), []
    futures = [tasks.submit(gated(gate, seen, str(i), i)) for i in range(4)]
    until(lambda: len(seen) == 2, "two tasks to start")
    assert [tasks.started_at(f) is not None for f in futures] == [True, True, False, False]
    assert not futures[0].cancel()  # a running task cannot be taken back
    assert futures[3].cancel()  # a waiting one can: it never starts
    gate.set()
    assert [f.result(DEADLINE) for f in futures[:3]] == [0, 1, 2]
    assert seen == ["start 0", "start 1", "start 2"]
    assert futures[3].cancelled() and tasks.stuck == 0


def test_abandoning_cancels_the_coroutine_and_frees_its_slot_at_once(
    tasks: AsyncExecutor,
) -> None:
    gate, seen = threading.Event(), []
    futures = [tasks.submit(gated(gate, seen, str(i), i)) for i in range(3)]
    until(lambda: len(seen) == 2, "two tasks to start")
    tasks.abandon(futures[0])
    until(lambda: "start 2" in seen, "the third task to take the abandoned slot")
    with pytest.raises(asyncio.CancelledError):  # what the coroutine raised
        futures[0].result(DEADLINE)
    assert "cancelled 0" in seen
    until(lambda: tasks.stuck == 0, "the cancelled coroutine to end")
    gate.set()
    assert [f.result(DEADLINE) for f in futures[1:]] == [1, 2]


def test_a_coroutine_that_ignores_its_cancellation_is_stuck_until_it_returns(
    tasks: AsyncExecutor,
) -> None:
    gate = threading.Event()

    async def stubborn() -> str:
        while not gate.is_set():
            try:
                await asyncio.sleep(0.005)
            except asyncio.CancelledError:
                pass  # carries on regardless
        return "late"

    future = tasks.submit(stubborn)
    until(lambda: tasks.started_at(future) is not None, "the task to start")
    tasks.abandon(future)
    tasks.abandon(future)  # twice is once
    time.sleep(0.05)  # several cancellations delivered and ignored meanwhile
    assert tasks.stuck == 1 and not future.done()
    gate.set()
    assert future.result(DEADLINE) == "late"  # the late result a worker writes as stale
    assert tasks.stuck == 0


def test_what_a_task_raises_comes_back_through_its_future(tasks: AsyncExecutor) -> None:
    async def fails() -> None:
        raise ValueError("boom")

    def not_even_a_coroutine() -> Any:
        raise KeyError("before any await")

    with pytest.raises(ValueError, match="boom"):
        tasks.submit(fails).result(DEADLINE)
    with pytest.raises(KeyError):
        tasks.submit(not_even_a_coroutine).result(DEADLINE)
    assert tasks.submit(gated(threading.Event(), [], "x", 1)) is not None  # still serving


def test_shutdown_cancels_what_still_runs_and_stops_the_loop() -> None:
    executor = AsyncExecutor(1, name="wl-async-test")
    seen: list[str] = []
    running = executor.submit(gated(threading.Event(), seen, "forever"))
    waiting: Future[Any] = executor.submit(gated(threading.Event(), seen, "never"))
    until(lambda: seen == ["start forever"], "the first task to start")
    executor.shutdown()
    assert seen == ["start forever", "cancelled forever"]
    assert waiting.cancelled()
    with pytest.raises(asyncio.CancelledError):
        running.result(0)
    assert "wl-async-test" not in {t.name for t in threading.enumerate()}
