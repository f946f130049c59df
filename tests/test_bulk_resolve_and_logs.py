"""Settling many unknown items by one decision, and the worker's log lines (issue 12), through
the CLI on both backends."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from test_cli import Run, ok_json, one_error_line, wl  # noqa: F401 - wl is a fixture

from workledger import Ledger
from workledger.storage.port import ClaimParams, LeaseParams

pytestmark = pytest.mark.integration


def _unknown_sends(wl: Run, db_url: str, n: int) -> int:  # noqa: F811
    """A ``sends`` run of ``n`` items whose worker vanished mid-handler: all ``unknown``."""
    run_id = int(ok_json(wl("submit", "sends", "--payload", json.dumps({"n": n}),
                            "--json"))["run_id"])
    led = Ledger(db_url)
    try:
        while claimed := led.store.items_claim(ClaimParams(run_id, 500, 60.0)):
            led.store.items_mark_started(LeaseParams(run_id, [c.id for c in claimed],
                                                     claimed[0].lease_token))
    finally:
        led.close()
    return run_id


def _expire_and_sweep(wl: Run, db_url: str, run_id: int) -> None:  # noqa: F811
    import psycopg

    if db_url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(db_url[len("sqlite:///"):])
        conn.execute("UPDATE wl_items SET lease_until = '2000-01-01 00:00:00.000' "
                     "WHERE run_id = ? AND state = 'claimed'", (run_id,))
        conn.commit()
        conn.close()
    else:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("UPDATE wl_items SET lease_until = now() - interval '1 hour' "
                         "WHERE run_id = %s AND state = 'claimed'", (run_id,))
    assert wl("sweep").returncode == 0


def _states(db_url: str, run_id: int) -> Counter[str]:
    led = Ledger(db_url)
    try:
        return Counter(i.state for i in led.items(run_id, limit=100_000))
    finally:
        led.close()


def test_all_unknown_items_of_a_stage_are_resolved_at_once_each_audited(
    wl: Run, db_url: str,  # noqa: F811
) -> None:
    n = 1500  # more than a page
    run_id = _unknown_sends(wl, db_url, n)
    _expire_and_sweep(wl, db_url, run_id)
    assert _states(db_url, run_id) == {"unknown": n}
    one_error_line(wl("resolve", str(run_id), "--stage", "send", "--all-unknown", "--as",
                      "failed"), 2)  # many at once: a note is required
    one_error_line(wl("resolve", str(run_id), "--stage", "send", "--as", "failed",
                      "--note", "x"), 2)  # neither --item nor --all-unknown
    out = wl("resolve", str(run_id), "--stage", "send", "--all-unknown", "--as", "failed",
             "--note", "the provider's log shows none of them sent", app=None)
    assert out.returncode == 0, out.stderr
    assert f"{n} items of stage send resolved as failed" in out.stdout
    assert _states(db_url, run_id) == {"failed": n}
    story = ok_json(wl("history", str(run_id), "--stage", "send", "--item", "1234", "--json"))
    resolved = [e for e in story["events"] if e["kind"] == "resolved"]
    assert len(resolved) == 1 and resolved[0]["actor"] == "operator"
    assert resolved[0]["detail"] == {"as": "failed",
                                     "note": "the provider's log shows none of them sent"}
    again = wl("resolve", str(run_id), "--stage", "send", "--all-unknown", "--as", "failed",
               "--note", "again")
    assert again.returncode == 0 and "no unknown items" in again.stdout


def test_resolving_listed_items_refuses_one_that_is_not_unknown_before_changing_any(
    wl: Run, db_url: str,  # noqa: F811
) -> None:
    run_id = _unknown_sends(wl, db_url, 6)
    _expire_and_sweep(wl, db_url, run_id)
    assert wl("resolve", str(run_id), "--stage", "send", "--item", "5", "--as",
              "pending").returncode == 0
    line = one_error_line(wl("resolve", str(run_id), "--stage", "send", "--item", "0",
                             "--item", "5", "--as", "failed", "--note", "n"), 2)
    assert "5 is pending, not unknown; nothing changed" in line
    one_error_line(wl("resolve", str(run_id), "--stage", "send", "--item", "0", "--item", "99",
                      "--as", "failed"), 2)  # no such item
    assert _states(db_url, run_id) == {"unknown": 5, "pending": 1}  # item 0 untouched
    out = wl("resolve", str(run_id), "--stage", "send", "--item", "0", "--item", "1", "--item",
             "2", "--as", "processed", "--note", "delivered")
    assert out.returncode == 0 and "3 items of stage send resolved as processed" in out.stdout
    assert _states(db_url, run_id) == {"processed": 3, "unknown": 2, "pending": 1}
    status = ok_json(wl("status", str(run_id), "--json"))
    assert status["processed"] == 3  # the run's counters moved with the items


def test_the_worker_logs_json_lines_and_nothing_per_item(wl: Run) -> None:  # noqa: F811
    assert wl("submit", "numbers", "--payload", '{"n": 300}').returncode == 0
    out = wl("worker", "--until-idle", "--log-format", "json", "--log-level", "info")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines()]  # every line is JSON
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    messages = [line["message"] for line in lines]
    assert any(": started on " in m for m in messages)
    assert any(": stopped: claimed 300, processed 300" in m for m in messages)
    assert len(lines) < 10  # a lifecycle, not a line per item
    quiet = wl("worker", "--until-idle", "--log-level", "warning")
    assert quiet.returncode == 0 and quiet.stderr == ""
    one_error_line(wl("worker", "--log-format", "xml"), 2)


def test_serve_logs_json_lines_too(tmp_path: Any, db_url: str) -> None:
    import subprocess
    import time

    from test_cli import cli_cmd, cli_env

    proc = subprocess.Popen(cli_cmd("--db", db_url, "serve", "--port", "0", "--log-format",
                                    "json", "--log-level", "info"),
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the address, once it listens
        assert line.startswith("workledger serve: http://"), line
        time.sleep(0.2)
    finally:
        proc.terminate()
    _, err = proc.communicate(timeout=60)
    ours = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    assert any(x["logger"].startswith("workledger") and x["message"] == "stopped by SIGTERM"
               for x in ours), err
