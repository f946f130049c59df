"""Operator commands tell the truth and refuse nonsense (issue 10), on both backends.

Each command is run as an operator runs it (a subprocess of the real CLI) and the ledger is
read afterwards to check that a refusal changed nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_cli import APPS, Run, cli_env, ok_json, one_error_line, wl  # noqa: F401 - wl: fixture

from workledger import Ledger
from workledger.errors import Refused
from workledger.storage.port import ClaimParams, LeaseParams

pytestmark = pytest.mark.integration


def _json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def _submit(wl: Run, job: str, payload: dict[str, Any], key: str) -> int:  # noqa: F811
    return int(ok_json(wl("submit", job, "--payload", json.dumps(payload), "--key", key,
                          "--json"))["run_id"])


def _work(wl: Run) -> None:  # noqa: F811
    done = wl("worker", "--until-idle", "--concurrency", "1")
    assert done.returncode == 0, done.stderr


def _tolerated_run(wl: Run) -> int:  # noqa: F811
    """A finished run of 5 units with 2 failed deliveries: completed_with_failures."""
    run_id = _submit(wl, "tolerant", {"n": 5, "fail": [1, 3]}, "tol")
    _work(wl)
    assert ok_json(wl("status", str(run_id), "--json"))["state"] == "completed_with_failures"
    return run_id


def _snapshot(db_url: str, run_id: int) -> Any:
    led = Ledger(db_url)
    try:
        run = led.store.run_get(run_id)
        items = [(i.stage, i.seq, i.state, i.attempts, i.error)
                 for i in led.items(run_id, limit=1000)]
        return run, items, len(led.events(run_id))
    finally:
        led.close()


# -- 1. a finished run is not cancelled, paused or resumed --------------------------------------


@pytest.mark.parametrize("command", ["cancel", "pause", "resume"])
def test_a_finished_run_refuses_cancel_pause_and_resume(wl: Run, db_url: str,  # noqa: F811
                                                        command: str) -> None:
    run_id = _tolerated_run(wl)
    before = _snapshot(db_url, run_id)
    line = one_error_line(wl(command, str(run_id), "--note", "oops"), 2)
    assert "completed_with_failures" in line and "nothing changed" in line
    assert _snapshot(db_url, run_id) == before
    assert ok_json(wl("status", str(run_id), "--json"))["state"] == "completed_with_failures"


def test_a_run_that_completed_while_paused_can_be_resumed_and_then_closes(db_url: str) -> None:
    """Found by the fault campaign (seed 1301, rounds 28 and 32): a run paused while its last
    items were in flight completes with its closing hook pending; refusing to resume a
    complete run stranded that hook for good."""
    from workledger import Item

    ledger = Ledger(db_url)
    job = ledger.job("paused-close")
    job.decompose(lambda p: [Item(key="last")])
    closed: list[int] = []

    @job.stage("work", idempotent=True)
    def work(item: Any, ctx: Any) -> None:
        ledger.pause(ctx.run_id, note="an operator pauses while it runs")

    job.on_complete(lambda status: closed.append(status.run_id))
    try:
        run_id = job.submit({}).run_id
        ledger.work(until_idle=True, concurrency=1)
        ledger.sweep(grace=0)
        assert closed == []  # paused: the closing hook waits
        assert ledger.resume(run_id, note="go on") is True
        ledger.sweep(grace=0)
        assert closed == [run_id]
        assert ledger.status(run_id).state == "completed"
        with pytest.raises(Refused, match="a finished run is not resumed"):
            ledger.resume(run_id)  # complete and no longer paused: nothing to resume
    finally:
        ledger.close()


def test_a_cancelled_run_refuses_pause_and_resume(wl: Run) -> None:  # noqa: F811
    run_id = _submit(wl, "numbers", {"n": 4}, "c")
    assert wl("cancel", str(run_id)).returncode == 0
    for command in ("pause", "resume"):
        assert "cancelled" in one_error_line(wl(command, str(run_id)), 2)
    again = wl("cancel", str(run_id))  # already so: says so, changes nothing
    assert again.returncode == 0 and "already cancelled" in again.stdout


# -- 2. retry and resolve in a cancelled run are refused; nothing is overwritten silently --------


def test_retry_in_a_cancelled_run_is_refused_and_the_failure_is_kept(
    wl: Run, db_url: str  # noqa: F811
) -> None:
    run_id = _submit(wl, "numbers", {"n": 5, "fail": [2]}, "rc")
    sys.path.insert(0, str(APPS))
    import sample_app

    led = sample_app.ledger
    led.use(db_url)
    worker = led.worker(concurrency=1, chunk=3, jobs=["numbers"],
                        on_progress=lambda report: worker.stop())
    worker.run()  # items 0-2 finish (2 fails), 3 and 4 are left pending
    led.close()
    assert wl("cancel", str(run_id), "--note", "stop").returncode == 0
    before = _snapshot(db_url, run_id)
    line = one_error_line(wl("retry", str(run_id), "--item", "2"), 2)
    assert "cancelled" in line
    assert _snapshot(db_url, run_id) == before
    (failed,) = [i for i in before[1] if i[2] == "failed"]
    assert failed[3] == 1 and failed[4] == "odd one out"


def test_resolve_in_a_cancelled_run_is_refused(wl: Run, db_url: str) -> None:  # noqa: F811
    run_id = _submit(wl, "sends", {"n": 2}, "rs")
    led = Ledger(db_url)
    (a, _b) = led.store.items_claim(ClaimParams(run_id, 10, 0.2))
    led.store.items_mark_started(LeaseParams(run_id, [a.id], a.lease_token), charge=0)
    led.close()
    assert wl("cancel", str(run_id)).returncode == 0
    line = one_error_line(wl("resolve", str(run_id), "--stage", "send", "--item", "0", "--as",
                             "pending"), 2)
    assert "cancelled" in line


def test_cancel_keeps_the_previous_reason_of_a_retrying_item_in_an_event(
    db_url: str,
) -> None:
    from workledger import Item, Retry

    led = Ledger(db_url)
    job = led.job("flaky")
    job.decompose(lambda p: (Item(key=k) for k in p["keys"]))
    job.stage("call", idempotent=True)(lambda item, ctx: (_ for _ in ()).throw(
        Retry("busy", delay=3600)))
    sub = job.submit({"keys": ["a", "b"]}, key="k")
    worker = led.worker(concurrency=1, on_progress=lambda report: worker.stop())
    worker.run()  # one chunk: both items wait an hour for their retry
    led.cancel(sub.run_id, note="stop")
    for item in led.items(sub.run_id):
        assert (item.state, item.error, item.attempts) == ("skipped", "cancelled", 1)
        skipped = [e for e in led.events(sub.run_id, item.id) if e.kind == "skipped"]
        assert skipped and skipped[-1].detail["previous_error"] == "busy"
        assert skipped[-1].detail["previous_attempts"] == 1
    led.close()


# -- 3. retry refuses what does not exist --------------------------------------------------------


def test_retry_refuses_an_unknown_stage_or_item(wl: Run, db_url: str) -> None:  # noqa: F811
    run_id = _submit(wl, "numbers", {"n": 5, "fail": [2]}, "rn")
    _work(wl)
    before = _snapshot(db_url, run_id)
    assert "sned" in one_error_line(wl("retry", str(run_id), "--stage", "sned"), 2)
    assert "999999" in one_error_line(wl("retry", str(run_id), "--item", "999999"), 2)
    assert "processed, not failed" in one_error_line(wl("retry", str(run_id), "--item", "0"), 2)
    assert _snapshot(db_url, run_id) == before
    none_left = wl("retry", str(run_id), "--item", "2")
    assert none_left.returncode == 0 and "redrove 1 failed item" in none_left.stdout


# -- 4. a decomposer that always raises needs a person ------------------------------------------


def test_a_decomposer_that_keeps_failing_is_reported_as_needing_a_person(
    wl: Run,  # noqa: F811
) -> None:
    first = wl("submit", "broken", "--key", "b", "--json")
    assert first.returncode == 1
    run_id = int(_json(first)["run_id"])
    for _ in range(3):
        wl("sweep", "--grace", "0")
    audit = wl("audit", "--json", "--run", str(run_id))
    assert audit.returncode == 1
    (finding,) = [f for f in _json(audit) if f["kind"] == "not_decomposed"]
    assert finding["needs_person"] and "upstream API is down" in finding["detail"]
    status = ok_json(wl("status", str(run_id), "--json"))
    failures = int(status["next"].split("failed ")[1].split(" times")[0])
    assert status["next"].startswith("operator:") and failures >= 3
    again = wl("submit", "broken", "--key", "b")
    assert "upstream API is down" in again.stdout and "operator:" in again.stdout


# -- 5. audit separates what needs a person from what was reviewed --------------------------------


def test_failures_within_tolerance_of_a_finished_run_do_not_alert(wl: Run) -> None:  # noqa: F811
    run_id = _tolerated_run(wl)
    audit = wl("audit", "--json")
    assert audit.returncode == 0
    failed = [f for f in _json(audit) if f["kind"] == "failed"]
    assert sorted(f["seq"] for f in failed) == [1, 3]
    assert not any(f["needs_person"] for f in failed)
    assert all("tolerance" in f["reviewed"] for f in failed)
    assert all(f["run_id"] == run_id for f in failed)


def test_an_acknowledged_failure_stops_alerting_until_it_fails_again(
    wl: Run, db_url: str  # noqa: F811
) -> None:
    run_id = _submit(wl, "numbers", {"n": 5, "fail": [1, 3]}, "ack")
    _work(wl)
    assert wl("audit").returncode == 1
    events = len(Ledger(db_url).events(run_id))
    acked = wl("ack", str(run_id), "--stage", "double", "--item", "1", "--note", "known bad row")
    assert acked.returncode == 0 and "acknowledged 1 failed item" in acked.stdout
    assert wl("audit").returncode == 1  # item 3 still needs a person
    assert wl("ack", str(run_id), "--note", "reviewed with finance").returncode == 0
    audit = wl("audit", "--json")
    assert audit.returncode == 0
    assert {f["reviewed"].split()[0] for f in _json(audit) if f["kind"] == "failed"} == {
        "acknowledged"}
    assert _snapshot(db_url, run_id)[1] == _snapshot(db_url, run_id)[1]  # no state changed
    assert len(Ledger(db_url).events(run_id)) == events + 2
    # redriven and failed again: a new failure, not the one that was reviewed
    assert wl("retry", str(run_id), "--item", "1").returncode == 0
    _work(wl)
    assert wl("audit").returncode == 1
    assert "nothing to acknowledge" in one_error_line(
        wl("ack", str(run_id), "--stage", "double", "--item", "0", "--note", "x"), 2)


def test_audit_filters_by_run_job_and_age(wl: Run) -> None:  # noqa: F811
    a = _submit(wl, "numbers", {"n": 3, "fail": [0]}, "fa")
    b = _submit(wl, "tolerant", {"n": 3, "fail": [2]}, "fb")
    _work(wl)
    assert {f["run_id"] for f in _json(wl("audit", "--json", "--run", str(a)))} == {a}
    assert {f["run_id"] for f in _json(wl("audit", "--json", "--job", "tolerant"))} == {b}
    assert _json(wl("audit", "--json", "--since", "1h"))
    recent = wl("audit", "--json", "--since", "2999-01-01")
    assert recent.returncode == 0 and _json(recent) == []
    assert "--since" in one_error_line(wl("audit", "--since", "yesterday-ish"), 2)


# -- 7. status --watch: units and stages, never @close, never a cut number ------------------------


def test_watch_shows_stages_without_the_closing_entry_and_never_cuts_a_number(
    wl: Run, tmp_path: Path, db_url: str  # noqa: F811
) -> None:
    run_id = _tolerated_run(wl)
    env = cli_env(COLUMNS="80", TERM="dumb")
    out = subprocess.run([sys.executable, "-m", "workledger.cli", "--db", db_url, "--app",
                          "sample_app:ledger", "status", str(run_id), "--watch"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert "@close" not in text
    assert "..." not in text and "…" not in text
    assert "first" in text and "second" in text


# -- gaps found while writing docs/design.md -----------------------------------------------------


def test_workers_never_claim_a_closing_entry(db_url: str) -> None:
    led = Ledger(db_url)
    job = led.job("closing")
    job.decompose(lambda p: iter([]))
    job.stage("s", idempotent=True)(lambda item, ctx: None)
    calls: list[Any] = []
    job.on_complete(lambda status: calls.append(status.run_id))
    sub = job.submit({}, key="empty")
    from workledger.storage.port import ItemsInsert, NewItem

    led.store.items_insert_many(ItemsInsert(sub.run_id, "@close", [NewItem(0, None, None)]))
    assert led.store.items_claim(ClaimParams(sub.run_id, 10, 30.0)) == []  # a worker's claim
    led.sweep()
    assert calls == [sub.run_id]
    led.close()


def test_a_redriven_closing_hook_runs_again_and_keeps_the_counters(db_url: str) -> None:
    led = Ledger(db_url)
    job = led.job("closing")
    job.decompose(lambda p: (x for x in [__import__("workledger").Item(key="a")]))
    job.stage("s", idempotent=True)(lambda item, ctx: None)
    calls: list[int] = []

    def close(status: Any) -> None:
        calls.append(status.run_id)
        if len(calls) == 1:
            from workledger import Permanent

            raise Permanent("the report server is down")

    job.on_complete(close)
    sub = job.submit({}, key="k")
    led.work(concurrency=1, until_idle=True)
    assert led.items(sub.run_id, stage="@close")[0].state == "failed"
    assert led.retry(sub.run_id, stage="@close") == 1
    led.sweep()
    assert calls == [sub.run_id, sub.run_id]
    st = led.status(sub.run_id)
    assert (st.state, st.failed, st.processed) == ("completed", 0, 1)
    from workledger.api import differences

    assert differences(led.reconcile(sub.run_id, dry_run=True)) == {}
    led.close()


def test_an_item_released_or_reclaimed_in_a_cancelled_run_does_not_stay_pending(
    db_url: str,
) -> None:
    led = Ledger(db_url)
    job = led.job("j")
    job.decompose(lambda p: (__import__("workledger").Item(key=k) for k in "abc"))
    job.stage("s", idempotent=True)(lambda item, ctx: None)
    sub = job.submit({}, key="k")
    a, b, c = led.store.items_claim(ClaimParams(sub.run_id, 10, 0.3))
    led.cancel(sub.run_id)
    led.store.items_release(LeaseParams(sub.run_id, [a.id], a.lease_token))
    import time

    deadline = time.monotonic() + 10
    while led.store.outlook([sub.run_id]).expired < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    led.sweep()
    states = {i.key: (i.state, i.error) for i in led.items(sub.run_id)}
    assert states == {k: ("skipped", "cancelled") for k in "abc"}
    st = led.status(sub.run_id)
    assert (st.state, st.next, st.skipped) == ("cancelled", "nobody: cancelled", 3)
    led.close()


def test_a_run_awaiting_its_verify_hook_says_the_sweeper_moves_it(db_url: str) -> None:
    led = Ledger(db_url)
    job = led.job("j")
    job.decompose(lambda p: (__import__("workledger").Item(key=k) for k in "ab"))
    job.stage("s", verify=lambda item, ctx: "done")(lambda item, ctx: None)
    sub = job.submit({}, key="k")
    claimed = led.store.items_claim(ClaimParams(sub.run_id, 10, 0.2))
    for c in claimed:
        led.store.items_mark_started(LeaseParams(sub.run_id, [c.id], c.lease_token), charge=0)
    import time

    deadline = time.monotonic() + 10
    while led.store.outlook([sub.run_id]).expired < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    from workledger._runtime.repair.sweeper import AWAITING_VERIFY
    from workledger.storage.port import ReclaimParams

    led.store.leases_reclaim_expired(ReclaimParams("j", "s", "unknown", AWAITING_VERIFY))
    st = led.status(sub.run_id)
    assert (st.state, st.next) == ("awaiting_repair", "sweeper: asks the verify hook of 2 items")
    led.close()


# -- 8. small ones --------------------------------------------------------------------------------


def test_a_result_that_cannot_be_stored_reads_well(db_url: str) -> None:
    led = Ledger(db_url)
    job = led.job("j")
    job.decompose(lambda p: (__import__("workledger").Item(key=k) for k in "a"))
    job.stage("s", idempotent=True, max_attempts=1)(lambda item, ctx: {"when": object()})
    sub = job.submit({}, key="k")
    led.work(concurrency=1, until_idle=True)
    (item,) = led.items(sub.run_id)
    assert item.error is not None and " it not " not in item.error
    assert item.error.startswith("handler returned a result that cannot be stored: ")
    led.close()


def test_the_readme_query_of_units_per_run_agrees_with_status(db_url: str) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = readme.index("Every run, with its units rebuilt from its items")
    sql = readme[readme.index("```sql", start) + 6: readme.index("```", readme.index(
        "```sql", start) + 6)]
    led = Ledger(db_url)
    from workledger import Item, Permanent

    job = led.job("two", tolerate=5)
    job.decompose(lambda p: (Item(key=str(i), data=i) for i in range(6)))
    job.stage("a", idempotent=True)(lambda item, ctx: None)

    def b(item: Any, ctx: Any) -> None:
        if item.data == 4:
            raise Permanent("no")

    job.stage("b", after="a", idempotent=True)(b)
    job.on_complete(lambda status: None)
    sub = job.submit({}, key="k")
    led.work(concurrency=1, until_idle=True)
    led.sweep()
    st = led.status(sub.run_id)
    if db_url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(db_url[len("sqlite:///"):])
        rows = conn.execute(sql).fetchall()
        conn.close()
    else:
        import psycopg

        with psycopg.connect(db_url) as conn:
            rows = conn.execute(sql).fetchall()
    (row,) = [r for r in rows if r[0] == sub.run_id]
    assert tuple(int(x) for x in row[3:]) == (st.total, st.processed, st.failed, st.skipped)
    assert (st.total, st.processed, st.failed) == (6, 5, 1)
    led.close()


def test_glossary_no_longer_calls_the_repair_commands_coming_later() -> None:
    glossary = (Path(__file__).resolve().parents[1] / "docs" / "glossary.md").read_text()
    assert "Coming with the recovery work" not in glossary


_ = (os, APPS)  # imported for the fixtures' module
