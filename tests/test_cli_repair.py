"""The recovery and repair commands as an operator runs them (issue 3), on both backends."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from test_cli import Run, ok_json, one_error_line, wl  # noqa: F401 - wl is a fixture

from workledger import Ledger
from workledger.storage.port import ClaimParams, LeaseParams

pytestmark = pytest.mark.integration


def ok_json_any(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """The JSON of a command that may exit non-zero on purpose (audit: 1 = needs a person)."""
    return list(json.loads(result.stdout))


def _failed_run(wl: Run) -> int:  # noqa: F811
    sub = ok_json(wl("submit", "numbers", "--payload", '{"n": 5, "fail": [1, 3]}', "--key",
                     "f", "--json"))
    assert wl("worker", "--until-idle", "--concurrency", "1").returncode == 0
    return int(sub["run_id"])


def test_audit_retry_history_walkthrough(wl: Run, db_url: str) -> None:  # noqa: F811
    run_id = _failed_run(wl)
    audit = wl("audit", "--json")
    assert audit.returncode == 1  # something needs a person
    found = [f for f in ok_json_any(audit) if f["kind"] == "failed"]
    assert sorted(f["seq"] for f in found) == [1, 3]
    assert all(f"retry {run_id}" in f["path"] for f in found)
    out = wl("retry", str(run_id), "--item", "1", "--note", "upstream fixed")
    assert out.returncode == 0 and "redrove 1 failed item" in out.stdout
    story = ok_json(wl("history", str(run_id), "--stage", "double", "--item", "1", "--json"))
    redriven = [e for e in story["events"] if e["kind"] == "redriven"]
    assert redriven[0]["actor"] == "operator" and redriven[0]["detail"]["note"] == "upstream fixed"
    assert story["item"]["state"] == "pending" and story["item"]["attempts"] == 0
    status = ok_json(wl("status", str(run_id), "--json"))
    assert (status["state"], status["failed"]) == ("running", 1)


def test_reconcile_dry_run_then_repair(wl: Run, db_url: str) -> None:  # noqa: F811
    run_id = _failed_run(wl)
    led = Ledger(db_url)
    from workledger.storage.port import Projection

    led.store.run_reconcile(run_id, lambda r, c: Projection(99, 0, 0, 0, False), True, "test")
    dry = ok_json(wl("reconcile", str(run_id), "--dry-run", "--json"))
    assert dry[0]["differences"]["total"] == {"stored": 99, "ledger": 5}
    assert not dry[0]["repaired"]
    text = wl("reconcile", "--all")
    assert text.returncode == 0 and "repaired: total 99 -> 5" in text.stdout
    again = ok_json(wl("reconcile", str(run_id), "--json"))
    assert again[0]["differences"] == {}
    run = led.store.run_get(run_id)
    assert run is not None and (run.total, run.processed, run.failed) == (5, 3, 2)
    led.close()


def test_reconcile_repairs_stage_counts_that_drifted(wl: Run, db_url: str) -> None:  # noqa: F811
    """status reads wl_stage_counts; when they drift (here by hand, as a bug or a worker of an
    older version would), reconcile names each difference and rebuilds them from the items."""
    run_id = _failed_run(wl)
    with Ledger(db_url) as led:
        assert led.status(run_id).counts == {"double": {"processed": 3, "failed": 2}}
    raw_sql = ("UPDATE wl_stage_counts SET n = n + 4 WHERE state = 'processed';"
               "DELETE FROM wl_stage_counts WHERE state = 'failed'")
    if db_url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.executescript(raw_sql)
    else:
        import psycopg

        with psycopg.connect(db_url, autocommit=True) as pg:
            pg.execute(raw_sql)
    with Ledger(db_url) as led:
        assert led.status(run_id).counts == {"double": {"processed": 7}}  # the drift shows
    dry = ok_json(wl("reconcile", str(run_id), "--dry-run", "--json"))
    assert dry[0]["differences"] == {"double.processed": {"stored": 7, "ledger": 3},
                                     "double.failed": {"stored": 0, "ledger": 2}}
    text = wl("reconcile", str(run_id))
    assert text.returncode == 0 and "double.processed 7 -> 3" in text.stdout, text.stdout
    with Ledger(db_url) as led:
        assert led.status(run_id).counts == {"double": {"processed": 3, "failed": 2}}
        story = [e for e in led.events(run_id) if e.kind == "reconciled"]
        assert story[-1].detail["counts"]["double.failed"] == {"stored": 0, "ledger": 2}
    assert ok_json(wl("reconcile", str(run_id), "--json"))[0]["differences"] == {}


def test_reconcile_needs_a_run_or_all(wl: Run) -> None:  # noqa: F811
    one_error_line(wl("reconcile"), 2)


def test_expired_send_becomes_unknown_and_a_person_resolves_it(
    wl: Run, db_url: str  # noqa: F811
) -> None:
    sub = ok_json(wl("submit", "sends", "--payload", '{"n": 2}', "--key", "s", "--json"))
    led = Ledger(db_url)
    claimed = led.store.items_claim(ClaimParams(sub["run_id"], 10, 0.2))
    assert len(claimed) == 2
    # their handlers started (migration 0004): items never started would go back to pending
    led.store.items_mark_started(LeaseParams(sub["run_id"], [c.id for c in claimed],
                                             claimed[0].lease_token))
    deadline = time.monotonic() + 10
    while led.store.outlook([sub["run_id"]]).expired < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert ok_json(wl("sweep", "--json"))["to_unknown"] == 2
    status = ok_json(wl("status", str(sub["run_id"]), "--json"))
    assert (status["state"], status["next"]) == ("awaiting_repair",
                                                 "operator: resolve 2 unknown items")
    audit = wl("audit")
    assert audit.returncode == 1 and "resolve" in audit.stdout
    assert wl("resolve", str(sub["run_id"]), "--stage", "send", "--item", "0", "--as",
              "processed", "--note", "found in the provider's log").returncode == 0
    assert wl("resolve", str(sub["run_id"]), "--stage", "send", "--item", "1", "--as",
              "pending").returncode == 0
    one_error_line(wl("resolve", str(sub["run_id"]), "--stage", "send", "--item", "1", "--as",
                      "processed"), 2)  # no longer unknown
    assert wl("worker", "--until-idle").returncode == 0
    status = ok_json(wl("status", str(sub["run_id"]), "--json"))
    assert (status["state"], status["processed"]) == ("completed", 2)
    assert wl("audit").returncode == 0
    led.close()


def test_pause_resume_cancel(wl: Run) -> None:  # noqa: F811
    sub = ok_json(wl("submit", "numbers", "--payload", '{"n": 4}', "--key", "p", "--json"))
    rid = str(sub["run_id"])
    assert "paused" in wl("pause", rid, "--note", "month-end freeze").stdout
    assert ok_json(wl("status", rid, "--json"))["state"] == "paused"
    assert ok_json(wl("worker", "--until-idle", "--json"))["claimed"] == 0
    assert "resumed" in wl("resume", rid).stdout
    assert "4 pending items skipped" in wl("cancel", rid).stdout
    status = ok_json(wl("status", rid, "--json"))
    assert (status["state"], status["skipped"]) == ("cancelled", 4)
    assert "already cancelled" in wl("cancel", rid).stdout


def test_sweep_and_resolve_need_the_app(wl: Run) -> None:  # noqa: F811
    assert "--app" in one_error_line(wl("sweep", app=None), 2)
