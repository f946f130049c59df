"""Batch handlers with partial outcomes (issue 14): one call for up to N items of one run and
stage, one entry per item, each item with its own state, attempts and idempotency key. Through
the CLI on both backends (``tests/apps/batch_app.py``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_cli import Run, ok_json, wl  # noqa: F401 - wl is a fixture

from workledger import Ledger
from workledger.errors import UsageError

pytestmark = pytest.mark.integration

BATCH = "batch_app:ledger"


def _run(wl: Run, job: str, **payload: Any) -> int:  # noqa: F811
    return int(ok_json(wl("submit", job, "--payload", json.dumps(payload), "--json",
                          app=BATCH))["run_id"])


def _items(db_url: str, run_id: int) -> dict[int, Any]:
    led = Ledger(db_url)
    try:
        return {i.seq: i for i in led.items(run_id, limit=10_000)}
    finally:
        led.close()


def _calls(log: Path) -> list[tuple[int, int, list[str]]]:
    calls = []
    for line in log.read_text().splitlines():
        pid, count, *keys = line.split()
        calls.append((int(pid), int(count), keys))
    return calls


def test_a_batch_reports_each_item_its_own_outcome(wl: Run, db_url: str,  # noqa: F811
                                                   tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    run_id = _run(wl, "mail", n=25, bad=[3], busy=[4, 17], gone=[20], log=str(log))
    report = ok_json(wl("worker", "--until-idle", "--json", app=BATCH))
    assert (report["processed"], report["failed"], report["skipped"]) == (23, 1, 1)
    items = _items(db_url, run_id)
    assert (items[3].state, items[3].error) == ("failed", "550 no such mailbox")
    assert (items[20].state, items[20].error) == ("skipped", "unsubscribed")
    assert (items[4].state, items[4].attempts, items[4].result) == (
        "processed", 2, {"sent": run_id * 1000 + 4, "attempt": 2})
    assert all(i.attempts == 1 for s, i in items.items() if s not in (4, 17))
    calls = _calls(log)
    assert all(1 <= count <= 10 and len(keys) == count for _, count, keys in calls)
    first = [c for c in calls if c[1] > 2]
    assert sum(c[1] for c in first) == 25  # every item in exactly one first call
    assert Counter(k for _, _, keys in calls for k in keys)[f"{run_id}/send/4"] == 2
    status = ok_json(wl("status", str(run_id), "--json"))
    assert (status["processed"], status["failed"], status["skipped"]) == (23, 1, 1)


def test_raising_applies_to_the_whole_batch(wl: Run, db_url: str) -> None:  # noqa: F811
    run_id = _run(wl, "mail", n=12, **{"raise": True})
    ok_json(wl("worker", "--until-idle", "--json", app=BATCH))
    items = _items(db_url, run_id)
    assert Counter((i.state, i.attempts) for i in items.values()) == {("processed", 2): 12}
    led = Ledger(db_url)
    try:
        retried = [e for e in led.events(run_id) if e.kind == "retry_scheduled"]
    finally:
        led.close()
    assert len(retried) == 12
    assert all(e.detail["error"] == "ConnectionError: the mail server hung up" for e in retried)


def test_a_list_of_the_wrong_length_retries_the_batch_with_a_clear_reason(
    wl: Run, db_url: str,  # noqa: F811
) -> None:
    run_id = _run(wl, "mail", n=10, short=True)
    ok_json(wl("worker", "--until-idle", "--json", app=BATCH))
    led = Ledger(db_url)
    try:
        errors = {e.detail["error"] for e in led.events(run_id) if e.kind == "retry_scheduled"}
    finally:
        led.close()
    assert errors == {"the batch handler returned 9 entries, not a list of 10 entries, one "
                      "per item"}
    assert Counter(i.state for i in _items(db_url, run_id).values()) == {"processed": 10}


def test_batches_run_in_handler_processes_and_in_a_stage_that_is_not_idempotent(
    wl: Run, db_url: str, tmp_path: Path,  # noqa: F811
) -> None:
    log = tmp_path / "calls.log"
    run_id = _run(wl, "notify", n=40, bad=[5], log=str(log))
    report = ok_json(wl("worker", "--until-idle", "--processes", "2", "--json", app=BATCH))
    assert (report["processed"], report["failed"]) == (39, 1)
    assert Counter(i.state for i in _items(db_url, run_id).values()) == {"processed": 39,
                                                                          "failed": 1}
    assert sum(count for _, count, _ in _calls(log)) == 40  # each item sent once


def test_a_handler_process_that_dies_in_a_batch_leaves_every_item_of_it_in_doubt(
    wl: Run, db_url: str, tmp_path: Path,  # noqa: F811
) -> None:
    """A batch is one call: when its process dies, any of its items may have had its effect,
    not only the first. None is released as never started, so none is sent again unseen."""
    log = tmp_path / "calls.log"
    run_id = _run(wl, "notify", n=30, die=True, log=str(log))
    report = ok_json(wl("worker", "--until-idle", "--processes", "2", "--json", app=BATCH))
    assert report["lost_processes"] == 10  # the ten items of the batch that was running
    items = _items(db_url, run_id)
    doubtful = {s for s, i in items.items() if i.state == "unknown"}
    assert doubtful == set(range(10))  # the whole batch the dead call held, for a person
    assert all(items[s].state == "processed" for s in range(10, 30))
    calls = Counter(k for _, _, keys in _calls(log) for k in keys)
    assert all(calls[f"{run_id}/send/{s}"] == 1 for s in range(30))  # nothing sent twice


def test_a_batch_size_must_be_a_whole_number_in_range() -> None:
    job = Ledger("sqlite:///:memory:").job("j")
    for bad in (0, -1, True, 2.5, 10_001):
        with pytest.raises(UsageError, match="batch must be a whole number"):
            job.stage(f"s{bad}", batch=bad)  # type: ignore[arg-type]
