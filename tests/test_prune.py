"""Retention on both backends: ``prune`` deletes runs finished before a cutoff with their
items, events and counts, exports them first when asked, never touches a run that is not
complete (unknown items included), finishes a prune that stopped part-way, and is safe while
a worker runs."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from web_support import WEB_APP, build, cli_env, make_unknown, wl

from workledger import Ledger
from workledger._runtime.repair import retention
from workledger.http import create_app

pytestmark = pytest.mark.integration
MONTH = 30 * 86400.0


def sql(url: str, statement: str, *params: object) -> list[tuple[object, ...]]:
    if url.startswith("sqlite:///"):
        with closing(sqlite3.connect(url[len("sqlite:///"):])) as conn, conn:
            return [tuple(r) for r in conn.execute(statement.replace("%s", "?"), params)]
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        cur = pg.execute(statement, params)  # type: ignore[arg-type]
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


def age(url: str, run_id: int, days: int = 40) -> None:
    """Move a run's completion (and creation) ``days`` into the past."""
    if url.startswith("sqlite:///"):
        when = f"strftime('%Y-%m-%d %H:%M:%f', 'now', '-{days} days')"
    else:
        when = f"now() - interval '{days} days'"
    sql(url, f"UPDATE wl_runs SET created_at = {when}, completed_at = CASE WHEN completed_at "
             f"IS NULL THEN NULL ELSE {when} END WHERE id = %s", run_id)


def rows_of(url: str, run_id: int) -> tuple[int, ...]:
    return tuple(int(sql(url, f"SELECT count(*) FROM {table} WHERE run_id = %s", run_id)[0][0])
                 for table in ("wl_items", "wl_events", "wl_stage_counts"))


@pytest.fixture
def ledger(db_url: str) -> Ledger:
    led = build(db_url)
    yield led  # type: ignore[misc]
    led.close()


def six_runs(ledger: Ledger, url: str) -> None:
    """1 completed, 2 failed, 3 unknown item, 4 completed recently, 5 cancelled, 6 pending."""
    ledger.submit("numbers", {"n": 3}, key="done")
    ledger.submit("numbers", {"n": 2, "fail": [0]}, key="failed")
    ledger.work(until_idle=True, jobs=["numbers"])
    sends = ledger.submit("sends", {"n": 2}, key="doubt").run_id
    make_unknown(ledger, sends)
    ledger.submit("numbers", {"n": 2}, key="recent")
    ledger.work(until_idle=True, jobs=["numbers"])
    ledger.cancel(ledger.submit("numbers", {"n": 3}, key="cancelled").run_id)
    ledger.pause(ledger.submit("numbers", {"n": 2}, key="waiting").run_id)
    for run_id in (1, 2, 3, 5, 6):
        age(url, run_id)


def test_prune_deletes_finished_old_runs_with_everything_of_theirs(ledger: Ledger,
                                                                   db_url: str) -> None:
    six_runs(ledger, db_url)
    # a run whose stored completion is wrong (it has an unknown item) is still kept
    sql(db_url, "UPDATE wl_runs SET completed_at = created_at WHERE id = 3")
    before = {r: rows_of(db_url, r) for r in range(1, 7)}
    dry = ledger.prune(MONTH, dry_run=True)
    assert (dry.runs, dry.kept, dry.items) == ([1, 2, 5], [3], 3 + 2 + 3)
    assert {r: rows_of(db_url, r) for r in range(1, 7)} == before
    report = ledger.prune(MONTH)
    assert report.runs == [1, 2, 5] and report.kept == [3] and report.items == 8
    assert report.events >= 5
    assert [st.run_id for st in ledger.runs()] == [6, 4, 3]
    for run_id in (1, 2, 5):
        assert rows_of(db_url, run_id) == (0, 0, 0)
    for run_id in (3, 4, 6):
        assert rows_of(db_url, run_id) == before[run_id]
    assert ledger.status(3).state == "awaiting_repair"
    # and the delete itself checks the items, whatever its caller thought
    assert not ledger.store.run_prune(3, MONTH, with_events=False)
    assert rows_of(db_url, 3) == before[3]
    assert ledger.prune(MONTH).runs == []


def test_the_cutoff_and_the_job_choose_the_runs(ledger: Ledger, db_url: str) -> None:
    six_runs(ledger, db_url)
    assert ledger.prune(MONTH, job="sends").runs == []
    assert ledger.prune(50 * 86400.0).runs == []
    assert ledger.prune(0.0, job="numbers", dry_run=True).runs == [1, 2, 4, 5]


def test_export_writes_every_run_item_and_event_before_deleting(ledger: Ledger, db_url: str,
                                                                tmp_path: Path) -> None:
    six_runs(ledger, db_url)
    events = {r: len(ledger.events(r)) for r in (1, 2, 5)}
    path = tmp_path / "export.jsonl"
    with path.open("a") as out:
        report = ledger.prune(MONTH, export=out)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    runs = [r for r in lines if r["type"] == "run"]
    assert [(r["id"], r["idempotency_key"], r["payload"]) for r in runs] == [
        (1, "done", {"n": 3}), (2, "failed", {"n": 2, "fail": [0]}), (5, "cancelled", {"n": 3})]
    items = [r for r in lines if r["type"] == "item"]
    assert len(items) == report.items == 8
    assert {(i["run_id"], i["seq"], i["state"]) for i in items if i["run_id"] == 2} == {
        (2, 0, "failed"), (2, 1, "processed")}
    assert len([r for r in lines if r["type"] == "event"]) == sum(events.values())


def test_a_prune_stopped_after_the_run_row_is_finished_by_the_next(ledger: Ledger,
                                                                   db_url: str) -> None:
    ledger.submit("numbers", {"n": 4}, key="a")
    ledger.work(until_idle=True)
    age(db_url, 1)
    assert ledger.store.run_prune(1, MONTH, with_events=False)  # then the process "died"
    assert rows_of(db_url, 1)[0] == 4 and ledger.runs() == []
    report = ledger.prune(MONTH)
    assert report.resumed == [1] and report.items == 4 and rows_of(db_url, 1) == (0, 0, 0)


def test_prune_in_small_batches_while_a_worker_drains_another_run(ledger: Ledger,
                                                                  db_url: str) -> None:
    for key in ("old1", "old2"):
        ledger.submit("numbers", {"n": 1500}, key=key)
    ledger.work(until_idle=True)
    age(db_url, 1)
    age(db_url, 2)
    live = ledger.submit("numbers", {"n": 60, "sleep": 0.01}, key="live").run_id
    worker = subprocess.Popen(
        [sys.executable, "-m", "workledger.cli", "--db", db_url, "--app", WEB_APP, "worker",
         "--until-idle", "--concurrency", "2", "--chunk", "10"],
        env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        report = retention.prune(ledger.store, ledger.jobs, MONTH, batch=100)
    finally:
        out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert report.runs == [1, 2] and report.items == 3000
    st = ledger.status(live)
    assert (st.state, st.processed) == ("completed", 60)


def test_prune_from_the_command_line(db_url: str, tmp_path: Path) -> None:
    led = build(db_url)
    try:
        led.submit("numbers", {"n": 2}, key="a")
        led.work(until_idle=True)
        age(db_url, 1)
    finally:
        led.close()
    dry = wl(db_url, "prune", "--finished-before", "30d", "--dry-run", "--json", cwd=tmp_path)
    assert json.loads(dry.stdout)["runs"] == [1]
    bad = wl(db_url, "prune", "--finished-before", "soon", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: bad duration 'soon': expected a number and a unit, like 30d, 12h, 90m or 45s"]
    nowhere = wl(db_url, "prune", "--finished-before", "30d", "--export", "no/such/f.jsonl",
                 cwd=tmp_path)
    assert nowhere.returncode == 2 and "cannot write export file" in nowhere.stderr
    assert json.loads(wl(db_url, "runs", "--json").stdout)[0]["run_id"] == 1
    done = wl(db_url, "prune", "--finished-before", "30d", "--export", "x.jsonl", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("pruned 1 run (2 items, ")
    assert (tmp_path / "x.jsonl").read_text().count('"type": "item"') == 2


def test_prune_over_http_with_the_same_parameters(ledger: Ledger, db_url: str,
                                                  tmp_path: Path) -> None:
    six_runs(ledger, db_url)
    client = TestClient(create_app(ledger, export_dir=tmp_path))
    dry = client.post("/api/prune", json={"finished_before": "30d", "dry_run": True})
    assert dry.status_code == 200 and dry.json()["runs"] == [1, 2, 5]
    escape = client.post("/api/prune", json={"finished_before": "30d", "export": "../x"})
    assert escape.status_code == 400 and ledger.status(1).complete
    done = client.post("/api/prune", json={"finished_before": "30d", "job": "numbers",
                                           "export": "pruned.jsonl"})
    assert done.json()["runs"] == [1, 2, 5] and (tmp_path / "pruned.jsonl").exists()
    without = TestClient(create_app(ledger))
    refused = without.post("/api/prune", json={"finished_before": "1d", "export": "a.jsonl"})
    assert refused.status_code == 400 and "--export-dir" in refused.json()["error"]


def test_serve_prune_after_prunes_at_start_and_then_daily(ledger: Ledger, db_url: str) -> None:
    from web_support import wait_for

    from workledger.http.server import DailyPrune

    ledger.submit("numbers", {"n": 2}, key="old")
    ledger.work(until_idle=True)
    age(db_url, 1)
    pruner = DailyPrune(ledger, MONTH)
    pruner.start()
    try:
        wait_for(lambda: ledger.runs() == [], what="the first prune")
    finally:
        pruner.stopped.set()
        pruner.join(timeout=30)
    assert not pruner.is_alive() and rows_of(db_url, 1) == (0, 0, 0)
