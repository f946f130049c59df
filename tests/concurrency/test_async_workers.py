"""Async handlers in a real ``workledger worker`` process killed with SIGKILL while many
coroutines are in flight: the sweeper settles them like any other items (idempotent: back to
pending and done once; not idempotent: only the ones that had started are unknown). The
worker has ``--processes 2``: async stages still run on the parent's event loop. Both
backends (``tests/apps/async_app.py``)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workledger import Ledger

from .test_processes import Proc, wait_until

pytestmark = pytest.mark.concurrency

APPS = Path(__file__).resolve().parents[1] / "apps"
ENV = {**os.environ, "PYTHONPATH": str(APPS)}


def argv(db_url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "workledger.cli", "--db", db_url, "--app",
            "async_app:ledger", *args]


@pytest.fixture
def ledger(db_url: str) -> Iterator[Ledger]:
    sys.path.insert(0, str(APPS))
    try:
        import async_app

        led = async_app.build(db_url)
    finally:
        sys.path.remove(str(APPS))
    yield led
    led.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(10)


def starts(log: Path) -> list[tuple[str, int]]:
    """(key, pid) of every execution that reached the handler, in order."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [(p[1], int(p[3])) for p in (line.split() for line in lines) if p[0] == "start"]


def kill_mid_flight(ledger: Ledger, run_id: int, worker: Proc, log: Path, at_least: int
                    ) -> dict[str, Any]:
    """SIGKILL the worker once ``at_least`` handlers started and some are still running."""
    def in_flight() -> bool:
        if worker.popen.poll() is not None:
            pytest.fail(f"the worker ended early: {worker.stderr()}")
        keys = {k for k, _ in starts(log)}
        held = {i.key for i in ledger.items(run_id, state="claimed", limit=10_000)}
        return len(keys) >= at_least and bool(keys & held)

    wait_until(in_flight, f"{at_least} async handlers to start, some still running",
               every=0.05)
    worker.signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    return {i.key: i for i in ledger.items(run_id, limit=10_000)}


def settle(ledger: Ledger, run_id: int) -> None:
    def settled() -> bool:
        ledger.sweep(grace=0)  # the dead worker's leases, once expired, are taken back
        return not ledger.items(run_id, state="claimed", limit=1)

    wait_until(settled, "the dead worker's leases to expire and be settled", every=0.2)


def finish(db_url: str, tmp_path: Path, procs: list[Proc]) -> dict[str, Any]:
    second = Proc(argv(db_url, "worker", "--until-idle", "--concurrency", "100", "--json"),
                  tmp_path, "second", ENV)
    procs.append(second)
    assert second.wait() == 0, second.stderr()
    return dict(json.loads(second.out.read_text()))  # the CLI's --json: one indented object


def test_a_killed_async_worker_leaves_an_idempotent_stage_to_the_sweeper(
    ledger: Ledger, db_url: str, tmp_path: Path, procs: list[Proc],
) -> None:
    n, log = 600, tmp_path / "calls.log"
    run_id = ledger.job("waits").submit({"n": n, "wait": 0.2, "log": str(log)}).run_id
    first = Proc(argv(db_url, "worker", "--concurrency", "50", "--chunk", "50", "--lease", "2",
                      "--processes", "2"), tmp_path, "first", ENV)
    procs.append(first)
    at_kill = kill_mid_flight(ledger, run_id, first, log, at_least=80)
    assert {pid for _, pid in starts(log)} == {first.pid}  # on the parent's loop, not a child
    held = {k for k, i in at_kill.items() if i.state == "claimed"}
    assert len(held) >= 25  # many coroutines were in flight

    settle(ledger, run_id)
    back = {i.key for i in ledger.items(run_id, limit=10_000) if i.state == "pending"}
    assert held <= back | {i.key for i in ledger.items(run_id, state="failed", limit=10_000)}
    assert finish(db_url, tmp_path, procs)["processed"] == len(back)

    items = ledger.items(run_id, limit=10_000)
    assert Counter(i.state for i in items) == {"processed": n}
    ran = Counter(k for k, _ in starts(log))
    assert set(ran) == {i.key for i in items}
    # each item held at the kill went back through a lease expiry (its suspects then run one
    # at a time, as any stage's do), and an item ran again only after its lease expired
    # (the dead worker's own sweeper may have taken back a lease it renewed too late)
    expired = {e.item_id for e in ledger.events(run_id) if e.kind == "lease_expired"}
    assert {at_kill[k].id for k in held} <= expired
    assert {at_kill[k].id for k, c in ran.items() if c > 1} <= expired


def test_a_killed_async_worker_leaves_unknown_only_what_had_started(
    ledger: Ledger, db_url: str, tmp_path: Path, procs: list[Proc],
) -> None:
    """Not idempotent: starts are recorded before the coroutines run, in rounds, even with
    many in flight. A claim of 100 with 20 running at once: those that never started go back
    to pending; only started ones can be unknown; none runs twice."""
    n, concurrency, log = 400, 20, tmp_path / "calls.log"
    run_id = ledger.job("waits_once").submit({"n": n, "wait": 0.3, "log": str(log)}).run_id
    first = Proc(argv(db_url, "worker", "--concurrency", str(concurrency), "--chunk", "100",
                      "--lease", "1.0"), tmp_path, "first", ENV)
    procs.append(first)
    at_kill = kill_mid_flight(ledger, run_id, first, log, at_least=50)
    held = {k for k, i in at_kill.items() if i.state == "claimed"}
    assert len(held) > concurrency  # claimed but not all started: the test means something

    settle(ledger, run_id)
    items = {i.key: i for i in ledger.items(run_id, limit=10_000)}
    started = {k for k, _ in starts(log)}
    unknown = {k for k, i in items.items() if i.state == "unknown"}
    assert unknown and unknown <= started & held
    assert len(unknown) <= 2 * concurrency  # at most those running (and being written)
    assert all(items[k].started_at is not None for k in unknown)
    assert not started & {k for k, i in items.items() if i.state == "pending"}

    report = finish(db_url, tmp_path, procs)
    items = {i.key: i for i in ledger.items(run_id, limit=10_000)}
    assert Counter(i.state for i in items.values()) == {"processed": n - len(unknown),
                                                        "unknown": len(unknown)}
    assert report["processed"] == n - len(unknown) - sum(
        1 for k, i in at_kill.items() if i.state == "processed")
    assert max(Counter(k for k, _ in starts(log)).values()) == 1  # nothing ran twice
    assert report["stale"] == 0
