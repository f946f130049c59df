"""``async def`` handlers (issue 16): the same outcomes as plain ones, many in flight on one
event loop, a time limit that cancels the coroutine, async verify and closing hooks, and the
CLI's worker running an async app. On both backends (``tests/apps/async_app.py``)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli import APPS, Run, ok_json, wl  # noqa: F401 - wl is a fixture

from workledger import Ledger

pytestmark = pytest.mark.integration

sys.path.insert(0, str(APPS))
import async_app  # noqa: E402 - the app lives with the other test apps, on the path just set

WAIT = 0.2  # seconds each I/O-bound item waits


@pytest.fixture
def app(db_url: str) -> Iterator[Ledger]:
    led = async_app.build(db_url)
    async_app.FLIGHT.update(now=0, peak=0)
    yield led
    led.close()


def _items(led: Ledger, run_id: int) -> dict[int, Any]:
    return {i.seq: i for i in led.items(run_id, limit=10_000) if i.stage == "go"}  # no @close


def _lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def test_an_async_handler_has_the_outcomes_of_a_plain_one(app: Ledger) -> None:
    kinds = {"1": "retry", "2": "permanent", "3": "skip", "4": "raise", "5": "none"}
    run_id = app.job("outcomes").submit({"n": 8, "kinds": kinds}).run_id
    report = app.work(concurrency=8)
    assert (report.processed, report.failed, report.skipped, report.retried) == (6, 1, 1, 2)
    items = _items(app, run_id)
    assert (items[0].state, items[0].result, items[0].attempts) == (
        "processed", {"i": 0, "attempt": 1}, 1)
    assert (items[1].state, items[1].attempts) == ("processed", 2)
    assert (items[2].state, items[2].error) == ("failed", "no such account")
    assert (items[3].state, items[3].error) == ("skipped", "nothing to do")
    assert (items[4].state, items[4].attempts) == ("processed", 2)
    assert (items[5].state, items[5].result) == ("processed", None)
    retried = {e.item_id: e.detail for e in app.events(run_id) if e.kind == "retry_scheduled"}
    assert retried[items[1].id]["error"] == "busy, try later"
    assert "traceback" not in retried[items[1].id]  # a deliberate Retry keeps none
    assert retried[items[4].id]["error"] == "ValueError: bad row"
    assert "in outcome" in retried[items[4].id]["traceback"]  # the coroutine's own frame
    assert app.status(run_id).state == "failed"


def test_an_async_batch_handler_reports_each_item_its_own_outcome(app: Ledger) -> None:
    kinds = {"3": "bad", "4": "busy", "17": "busy", "20": "gone"}
    run_id = app.job("mail").submit({"n": 25, "kinds": kinds}).run_id
    report = app.work(concurrency=4)
    assert (report.processed, report.failed, report.skipped) == (23, 1, 1)
    items = _items(app, run_id)
    assert (items[3].state, items[3].error) == ("failed", "550 no such mailbox")
    assert (items[20].state, items[20].error) == ("skipped", "unsubscribed")
    assert (items[4].state, items[4].attempts, items[4].result) == (
        "processed", 2, {"sent": 4, "attempt": 2})
    assert all(i.attempts == 1 for s, i in items.items() if s not in (4, 17))
    assert run_id in async_app.CLOSED  # its async closing hook ran, on a loop of its own
    assert app.status(run_id).state == "failed"


def test_raising_in_an_async_batch_handler_applies_to_the_whole_batch(app: Ledger) -> None:
    run_id = app.job("mail").submit({"n": 10, "kinds": {"0": "raise"}}).run_id
    app.work(concurrency=4)
    assert Counter((i.state, i.attempts) for i in _items(app, run_id).values()) == {
        ("processed", 2): 10}
    errors = {e.detail["error"] for e in app.events(run_id) if e.kind == "retry_scheduled"}
    assert errors == {"ConnectionError: the mail server hung up"}


@pytest.mark.parametrize("job", ["waits", "waits_once"])
def test_a_thousand_waits_with_concurrency_200_take_about_five_waits(app: Ledger,
                                                                     job: str) -> None:
    """1,000 items that each wait 0.2 s: 200 s one after another, ~1 s 200 at a time. The
    claim follows --concurrency (200 > --chunk 100), so ~200 are in flight, never more; in the
    stage that is not idempotent each round records the starts of the next ones first."""
    run_id = app.job(job).submit({"n": 1000, "wait": WAIT}).run_id
    started = time.monotonic()
    report = app.work(concurrency=200)
    elapsed = time.monotonic() - started
    assert report.processed == 1000
    assert app.status(run_id).state == "completed"
    assert elapsed < 15 * WAIT, f"{elapsed:.2f}s for 1,000 waits of {WAIT}s"  # generous
    assert 150 <= async_app.FLIGHT["peak"] <= 200, async_app.FLIGHT


@pytest.mark.parametrize(("job", "state", "error"), [
    ("slow_retry", "processed", None),
    ("slow_verify", "processed", None),
    ("slow_doubt", "unknown", "timeout after 0.3s"),
])
def test_a_time_limit_cancels_the_coroutine_and_settles_the_item_as_its_stage_declares(
    app: Ledger, tmp_path: Path, job: str, state: str, error: str | None,
) -> None:
    log = tmp_path / "calls.log"
    run_id = app.job(job).submit({"n": 3, "kinds": {"1": "hang"}, "log": str(log)}).run_id
    started = time.monotonic()
    report = app.work(concurrency=4)
    if job == "slow_verify":
        app.sweep(grace=0)  # the async verify hook answers done
    assert time.monotonic() - started < 30  # the hanging coroutine did not run its minute
    assert report.abandoned == 1 and not report.stuck
    assert _lines(log) == [["cancelled", "k1", "1"]]  # it saw CancelledError at its await
    hung = _items(app, run_id)[1]
    assert (hung.state, hung.error) == (state, error)
    if job == "slow_retry":  # back to pending with an attempt charged, then done quickly
        assert (hung.attempts, hung.result) == (2, "quick")
        retried = [e for e in app.events(run_id) if e.kind == "retry_scheduled"]
        assert [e.detail["error"] for e in retried] == ["timeout after 0.3s"]
    assert Counter(i.state for i in _items(app, run_id).values())[state] >= 1
    assert [i.state for s, i in _items(app, run_id).items() if s != 1] == ["processed"] * 2


def test_a_coroutine_that_ignores_its_cancellation_counts_as_stuck(app: Ledger,
                                                                   tmp_path: Path) -> None:
    """Two coroutines that swallow CancelledError hold on past their limit: with concurrency
    1 that is more stuck handlers than the worker runs at once, so it stops (exit 3 in the
    CLI) for a supervisor to restart it. Their items stay held until their coroutines end,
    then are settled (the worker's late results do it, in this process)."""
    log = tmp_path / "calls.log"
    # they hold on longer than STUCK_GRACE (5 s): stuck for a moment is not stuck
    run_id = app.job("stubborn").submit({"n": 2, "hold": 6.5, "log": str(log)}).run_id
    report = app.work(concurrency=1, chunk=1)
    assert report.stuck and report.abandoned == 2
    assert [line[0] for line in _lines(log)].count("ignored") >= 2
    deadline = time.monotonic() + 30
    while any(i.state == "claimed" for i in _items(app, run_id).values()):
        assert time.monotonic() < deadline, "an item stayed held after its coroutine ended"
        time.sleep(0.05)
    items = _items(app, run_id)
    assert {i.state for i in items.values()} == {"failed"}
    assert all("timeout after 0.3s" in (i.error or "") for i in items.values())


def test_a_stopping_worker_lets_running_coroutines_finish_and_releases_the_rest(
    app: Ledger, tmp_path: Path,
) -> None:
    """Stop (SIGTERM in the CLI) with coroutines in flight: those running finish and are
    written, those waiting for a slot never start and go back to pending, none is unknown."""
    log = tmp_path / "calls.log"
    run_id = app.job("waits_once").submit({"n": 100, "wait": 0.5, "log": str(log)}).run_id
    worker = app.worker(concurrency=10, chunk=100)
    thread = threading.Thread(target=worker.run)
    thread.start()
    deadline = time.monotonic() + 30
    while len(_lines(log)) < 10:
        assert time.monotonic() < deadline, "ten coroutines never started"
        time.sleep(0.01)
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()
    started = {line[1] for line in _lines(log)}
    items = _items(app, run_id).values()
    assert {i.key for i in items if i.state == "processed"} == started
    assert Counter(i.state for i in items) == {"processed": len(started),
                                               "pending": 100 - len(started)}
    assert 10 <= len(started) < 100 and worker.report.released == 100 - len(started)


def test_a_plain_handler_that_returns_a_coroutine_fails_with_a_clear_reason(
    db_url: str,
) -> None:
    led = Ledger(db_url)
    try:
        job = led.job("wrapped")
        job.decompose(lambda payload: [async_app.Item(key="a")])
        job.stage("go", idempotent=True)(lambda item, ctx: async_app.outcome(item, ctx))
        run_id = job.submit({}).run_id
        led.work(concurrency=1)
        (item,) = led.items(run_id)
        assert (item.state, item.error) == (
            "failed", "the handler returned a coroutine instead of awaiting it: declare it "
            "with async def, and the worker awaits it")
    finally:
        led.close()


def test_the_cli_worker_runs_an_async_app(wl: Run, tmp_path: Path) -> None:  # noqa: F811
    log = tmp_path / "calls.log"
    sub = ok_json(wl("submit", "waits_once", "--payload",
                     json.dumps({"n": 300, "wait": WAIT, "log": str(log)}), "--json",
                     app="async_app:ledger"))
    report = ok_json(wl("worker", "--until-idle", "--concurrency", "100", "--json",
                        app="async_app:ledger"))
    assert (report["claimed"], report["processed"]) == (300, 300)
    assert report["chunks"] == 3  # claims of --concurrency (100) items, --chunk being 100 too
    starts = Counter(line[1] for line in _lines(log) if line[0] == "start")
    assert len(starts) == 300 and set(starts.values()) == {1}
    status = ok_json(wl("status", str(sub["run_id"]), "--json", app="async_app:ledger"))
    assert (status["state"], status["processed"]) == ("completed", 300)
