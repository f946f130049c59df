"""Run priorities (issue 25, part 1): ``submit(..., priority=N)``, ``set_priority``, and the
claim order they give: a claimable item of a higher-priority run is claimed before any of a
lower one, by a worker in this process or another, idle or busy.

The port's behaviour on both backends first; then the facade, the CLI and HTTP; then real
worker processes.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_cli import cli_cmd, cli_env
from test_contract_store import insert, submit
from waiting import poll

from workledger import Item, Ledger
from workledger.errors import BadInput, Refused
from workledger.storage.port import NewRun, Store

JOB = "ingest"


def _run(store: Store, key: str, priority: int = 0) -> int:
    run, created = store.run_submit(NewRun(JOB, key, json.dumps({"key": key}),
                                           priority=priority))
    assert created
    insert(store, run.id, range(3))
    store.run_mark_decomposed(run.id, "generate")
    return run.id


# -- the port, on both backends ----------------------------------------------------------------


@pytest.mark.contract
def test_a_run_keeps_its_priority_and_higher_ones_list_first(store: Store) -> None:
    low = _run(store, "low")
    high = _run(store, "high", priority=7)
    below = _run(store, "below", priority=-3)
    plain = _run(store, "plain")
    got = store.runs_claimable([JOB])
    assert [(r.id, r.priority) for r in got] == [(high, 7), (low, 0), (plain, 0), (below, -3)]
    run = store.run_get(high)
    assert run is not None and run.priority == 7
    assert store.runs_top_priority([JOB]) == 7
    assert store.runs_top_priority(["other"]) is None


@pytest.mark.contract
def test_set_priority_moves_an_open_run_and_records_who_did_it(store: Store) -> None:
    first = _run(store, "a")
    second = _run(store, "b")
    assert store.run_set_priority(second, 5, "alice", "month end") is True
    assert [r.id for r in store.runs_claimable([JOB])] == [second, first]
    assert store.runs_top_priority([JOB]) == 5
    assert store.run_set_priority(second, 5, "alice", None) is False  # no change, no event
    events = [e for e in store.events_list(second) if e.kind == "priority_changed"]
    assert len(events) == 1 and events[0].actor == "alice"
    assert events[0].detail == {"from": 0, "to": 5, "note": "month end"}
    with pytest.raises(Refused):  # no such run, or finished since the caller looked
        store.run_set_priority(10**9, 1, "alice", None)


@pytest.mark.contract
def test_a_run_submitted_without_a_priority_has_zero(store: Store) -> None:
    run = submit(store, "plain")
    assert run.priority == 0


# -- the facade --------------------------------------------------------------------------------


def _ledger(url: str, seen: list[tuple[int, int]] | None = None) -> Ledger:
    led = Ledger(url)
    job = led.job("notes")

    @job.decompose
    def _split(payload: dict[str, Any]) -> Any:
        for i in range(int(payload["n"])):
            yield Item(key=f"k{i}", data={"hold": payload.get("hold", 0)})

    @job.stage("note", idempotent=True)
    def _note(item: Any, ctx: Any) -> None:
        if item.data["hold"]:
            time.sleep(item.data["hold"])
        if seen is not None:
            seen.append((ctx.run_id, item.seq))

    return led


@pytest.mark.integration
@pytest.mark.parametrize("bad", [1001, -1001, 1.5, True, "3", None])
def test_a_priority_out_of_range_or_not_a_whole_number_writes_nothing(
        db_url: str, bad: Any) -> None:
    led = _ledger(db_url)
    try:
        with pytest.raises(BadInput, match="priority"):
            led.submit("notes", {"n": 1}, priority=bad)
        assert led.runs() == []
    finally:
        led.close()


@pytest.mark.integration
def test_status_shows_the_priority_and_set_priority_changes_it(db_url: str) -> None:
    led = _ledger(db_url)
    try:
        sub = led.job("notes").submit({"n": 2}, key="a", priority=-20)
        assert sub.status.priority == -20
        assert led.set_priority(sub.run_id, 30, note="urgent") is True
        assert led.status(sub.run_id).priority == 30
        with pytest.raises(BadInput, match="priority"):
            led.set_priority(sub.run_id, 5000)
        again = led.submit("notes", {"n": 2}, key="a", priority=1)  # the run, as it is
        assert again.created is False and again.status.priority == 30
        led.work(until_idle=True)
        with pytest.raises(Refused, match="completed"):
            led.set_priority(sub.run_id, 1)
        assert led.status(sub.run_id).priority == 30
    finally:
        led.close()


@pytest.mark.integration
def test_a_worker_takes_the_higher_run_first_whatever_was_submitted_first(
        db_url: str) -> None:
    seen: list[tuple[int, int]] = []
    led = _ledger(db_url, seen)
    try:
        low = led.submit("notes", {"n": 30}, key="low", priority=-1).run_id
        plain = led.submit("notes", {"n": 10}, key="plain").run_id
        high = led.submit("notes", {"n": 10}, key="high", priority=9).run_id
        led.work(chunk=5, until_idle=True)
        order = [run for run, _ in seen]
        assert order == [high] * 10 + [plain] * 10 + [low] * 30
    finally:
        led.close()


@pytest.mark.integration
def test_a_busy_worker_turns_to_a_higher_run_at_its_next_claim(db_url: str) -> None:
    """The higher run is submitted through another ledger (another store, as another process
    would): the busy worker learns of it at its next claim, not at its next look for runs."""
    seen: list[tuple[int, int]] = []
    led = _ledger(db_url, seen)
    other = _ledger(db_url)
    try:
        low = led.submit("notes", {"n": 200, "hold": 0.002}, key="low").run_id
        worker = threading.Thread(target=led.work, kwargs={"chunk": 5, "until_idle": True})
        worker.start()
        poll(lambda: len(seen) >= 10, timeout=30, what="the low run under way")
        high = other.submit("notes", {"n": 10}, key="high", priority=1).run_id
        at = len(seen)
        worker.join(timeout=60)
        assert not worker.is_alive()
        first_high = next(i for i, (run, _) in enumerate(seen) if run == high)
        # what was claimed before the submission, and at most the chunk claimed while it
        # committed, runs first
        assert first_high - at <= 10, (at, first_high)
        assert [r for r, _ in seen[first_high:first_high + 10]] == [high] * 10
        assert sum(1 for r, _ in seen if r == low) == 200
    finally:
        other.close()
        led.close()


# -- the CLI and HTTP --------------------------------------------------------------------------


def _cli(db_url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_cmd("--db", db_url, "--app", "claims_app:ledger", *args),
                          cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_the_cli_submits_with_a_priority_and_changes_it(db_url: str, tmp_path: Path) -> None:
    sink = str(tmp_path / "calls.log")
    got = _cli(db_url, tmp_path, "submit", "notes", "--payload",
               json.dumps({"n": 2, "sink": sink}), "--priority", "12", "--json")
    assert got.returncode == 0, got.stderr
    body = json.loads(got.stdout)
    assert body["priority"] == 12
    run_id = str(body["run_id"])
    for bad in ("1001", "x", "2.5", "\u0661\u0662", "1_000", " 7", "+5", "9" * 4000):
        refused = _cli(db_url, tmp_path, "submit", "notes", "--payload",
                       json.dumps({"n": 1, "sink": sink}), "--key", "other", "--priority", bad)
        assert refused.returncode == 2, refused
        assert len(refused.stderr.strip().splitlines()) == 1 and "priority" in refused.stderr
        assert len(refused.stderr) < 200
    changed = _cli(db_url, tmp_path, "priority", run_id, "-5")
    assert changed.returncode == 0, changed.stderr
    assert "priority -5" in changed.stdout
    shown = _cli(db_url, tmp_path, "status", run_id, "--json")
    assert json.loads(shown.stdout)["priority"] == -5
    assert _cli(db_url, tmp_path, "priority", run_id, "9999").returncode == 2
    listed = _cli(db_url, tmp_path, "runs", "--json")
    assert [r["priority"] for r in json.loads(listed.stdout)] == [-5]
    led = Ledger(db_url)
    try:
        assert len(led.runs()) == 1 and led.status(int(run_id)).priority == -5
    finally:
        led.close()


@pytest.mark.integration
def test_http_submits_with_a_priority(db_url: str) -> None:
    from web_support import client_for

    with client_for(db_url) as (client, ledger):
        got = client.post("/api/jobs/numbers/runs?priority=4", json={"n": 1})
        assert got.status_code == 201, got.text
        assert got.json()["priority"] == 4
        run_id = got.json()["run_id"]
        assert "priority 4" in client.get(f"/runs/{run_id}").text  # the dashboard shows it
        assert "priority 4" in client.get("/").text
        bad = client.post("/api/jobs/numbers/runs?priority=4000", json={"n": 2})
        assert bad.status_code == 400 and "priority" in bad.json()["error"]
        assert len(ledger.runs()) == 1


# -- real worker processes ---------------------------------------------------------------------


@pytest.mark.concurrency
def test_a_high_run_finishes_while_a_low_one_has_barely_started(db_url: str,
                                                                tmp_path: Path) -> None:
    sink = tmp_path / "calls.log"
    low = _cli(db_url, tmp_path, "submit", "notes", "--key", "low", "--json", "--payload",
               json.dumps({"n": 1500, "sink": str(sink), "hold": 0.004}))
    assert low.returncode == 0, low.stderr
    workers = [subprocess.Popen(cli_cmd("--db", db_url, "--app", "claims_app:ledger", "worker",
                                        "--until-idle", "--chunk", "10"),
                                cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        poll(lambda: sink.exists() and len(sink.read_text().splitlines()) >= 20, timeout=60,
             what="the low run under way")
        high = _cli(db_url, tmp_path, "submit", "notes", "--key", "high", "--json",
                    "--priority", "100", "--payload",
                    json.dumps({"n": 40, "sink": str(sink), "hold": 0.005}))
        came = time.time()  # committed by now
        assert high.returncode == 0, high.stderr
        high_id = json.loads(high.stdout)["run_id"]
        for p in workers:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
    finally:
        for p in workers:
            p.kill()
    calls = [line.split() for line in sink.read_text().splitlines()]
    high_end = max(float(c[4]) for c in calls if int(c[0]) == high_id)
    low_between = sum(1 for c in calls
                      if int(c[0]) != high_id and came <= float(c[3]) < high_end)
    assert len(calls) == 1540
    assert high_end < max(float(c[4]) for c in calls)  # the low run was still going
    # after the high run came, the low run started only what the two workers held then: a
    # chunk each, and one claim each made while the submission committed
    assert low_between <= 2 * 10 * 2, low_between


@pytest.mark.contract
def test_the_top_priority_is_one_index_step_per_job_however_many_runs_are_open(
        store: Store, db_url: str) -> None:
    from workledger.storage.queries import queries

    if db_url.startswith("sqlite"):
        import sqlite3
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.executemany("INSERT INTO wl_runs (job, idempotency_key, payload, decomposed_at,"
                             " priority) VALUES (?, ?, '{}', '2026-01-01', ?)",
                             [(("alpha", "beta")[i % 2], f"k{i}", i % 7) for i in range(10_000)])
            plan = " ".join(str(r) for r in conn.execute(
                "EXPLAIN QUERY PLAN " + queries("sqlite")["runs_top_priority"],
                {"jobs": '["alpha", "beta"]'}))
        assert "wl_runs_claimable" in plan and "TEMP B-TREE" not in plan, plan
    else:
        import psycopg
        with psycopg.connect(db_url, autocommit=True) as conn:
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO wl_runs (job, idempotency_key, payload, "
                                "decomposed_at, priority) VALUES (%s, %s, '{}', now(), %s)",
                                [(("alpha", "beta")[i % 2], f"k{i}", i % 7)
                                 for i in range(10_000)])
            plan = " ".join(str(r[0]) for r in conn.execute(
                "EXPLAIN " + queries("postgres")["runs_top_priority"].replace(
                    "%(jobs)s", "'{alpha,beta}'")))
        assert "wl_runs_claimable" in plan and "Sort" not in plan, plan
    assert store.runs_top_priority(["alpha", "beta"]) == 6
