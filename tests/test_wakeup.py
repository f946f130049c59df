"""Idle workers are woken, not left to poll (issue 14): on PostgreSQL by NOTIFY from any
connection, on SQLite within one process; and a backed-off retry is picked up when it comes
due. The workers here poll once a minute, so a start within seconds was a wake-up."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from workledger import Item, Ledger, Permanent, Retry

pytestmark = pytest.mark.integration

SLOW_POLL = 60.0  # seconds: far longer than any wait below


def _define(ledger: Ledger, started: dict[str, float]) -> None:
    job = ledger.job("wake")
    job.decompose(lambda p: (Item(key=k) for k in p["keys"]))

    @job.stage("go", idempotent=True, base_delay=0.01)
    def go(item: Any, ctx: Any) -> None:
        first = str(item.key) not in started
        started.setdefault(str(item.key), time.monotonic())
        if item.key == "retry" and ctx.attempt == 1:
            raise Retry("come back in 2 s", delay=2.0)
        if item.key == "fail" and first:
            raise Permanent("a person will redrive it")


@pytest.fixture
def idle_worker(db_url: str) -> Iterator[tuple[Ledger, dict[str, float]]]:
    started: dict[str, float] = {}
    ledger = Ledger(db_url)
    _define(ledger, started)
    ledger.init()
    worker = ledger.worker(concurrency=2, lease=30)
    worker.options = replace(worker.options, poll=SLOW_POLL, idle_poll=SLOW_POLL)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    time.sleep(1.0)  # it found nothing and is idle
    try:
        yield ledger, started
    finally:
        worker.stop()
        thread.join(30)
        ledger.close()


def _wait_for(started: dict[str, float], key: str, within: float) -> float:
    deadline = time.monotonic() + within
    while key not in started:
        assert time.monotonic() < deadline, f"{key} did not start within {within:g} s"
        time.sleep(0.01)
    return started[key]


def test_a_submit_from_another_connection_wakes_an_idle_worker(
    idle_worker: tuple[Ledger, dict[str, float]], db_url: str,
) -> None:
    _, started = idle_worker
    submitter = Ledger(db_url)  # its own connection (and store)
    _define(submitter, {})
    try:
        submitter.submit("wake", {"keys": ["a", "b"]})
        _wait_for(started, "a", within=15.0)
    finally:
        submitter.close()


def _wait_state(ledger: Ledger, run_id: int, state: str) -> None:
    deadline = time.monotonic() + 15.0
    while ledger.status(run_id).state != state:
        assert time.monotonic() < deadline, (ledger.status(run_id).state, state)
        time.sleep(0.05)


def test_a_redriven_item_wakes_an_idle_worker(
    idle_worker: tuple[Ledger, dict[str, float]], db_url: str,
) -> None:
    ledger, started = idle_worker
    run_id = ledger.submit("wake", {"keys": ["fail"]}).run_id
    _wait_state(ledger, run_id, "failed")
    operator = Ledger(db_url)
    try:
        assert operator.retry(run_id, note="fixed upstream") == 1
    finally:
        operator.close()
    _wait_state(ledger, run_id, "completed")


def test_a_retry_is_picked_up_when_it_comes_due(
    idle_worker: tuple[Ledger, dict[str, float]],
) -> None:
    ledger, started = idle_worker
    run_id = ledger.submit("wake", {"keys": ["retry"]}).run_id
    first = _wait_for(started, "retry", within=15.0)
    _wait_state(ledger, run_id, "completed")
    assert time.monotonic() - first >= 2.0  # not before it was due
