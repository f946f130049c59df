"""Operator paths and the sweeper, on both backends (issue 3)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from workledger import Item, Ledger, Permanent
from workledger.errors import UsageError
from workledger.storage import open_store

pytestmark = pytest.mark.integration


def wait_for(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met before the deadline")


def started(ledger: Ledger, claimed: list[Any]) -> None:
    """Record that the handlers of ``claimed`` began, as a worker does for a stage that is not
    idempotent: when their lease expires, their outcome is in doubt."""
    from workledger.storage.port import LeaseParams

    for c in claimed:
        assert ledger.store.items_mark_started(
            LeaseParams(c.run_id, [c.id], c.lease_token), charge=0) == [c.id]


def make_ledger(url: str, *, fail: set[str] | None = None, **stage_kw: Any) -> Ledger:
    ledger = Ledger(url, seed=7)
    job = ledger.job("batch", tolerate=stage_kw.pop("tolerate", 0))
    calls: list[str] = []
    ledger.calls = calls  # type: ignore[attr-defined]

    @job.decompose
    def split(payload: dict[str, Any]) -> Any:
        for k in payload["keys"]:
            yield Item(key=k)

    @job.stage("apply", **{"idempotent": True, "max_attempts": 2, "base_delay": 0.0, **stage_kw})
    def apply(item: Any, ctx: Any) -> Any:
        calls.append(item.key)
        if fail and item.key in fail:
            raise Permanent(f"{item.key} is broken")
        return {"done": item.key}

    return ledger


def test_retry_redrives_failed_items_once_and_records_who(db_url: str) -> None:
    ledger = make_ledger(db_url, fail={"b", "c"})
    sub = ledger.job_named("batch").submit({"keys": ["a", "b", "c"]}, key="r1")
    ledger.work(concurrency=1, until_idle=True)
    assert ledger.status(sub.run_id).state == "failed"
    assert ledger.status(sub.run_id).next == "operator: retry 2 failed items"
    assert ledger.retry(sub.run_id, seqs=[1], note="fixed b") == 1
    with pytest.raises(UsageError, match="is pending, not failed"):  # moved once, then refused
        ledger.retry(sub.run_id, seqs=[1])
    st = ledger.status(sub.run_id)
    assert (st.complete, st.failed, st.counts["apply"]["pending"]) == (False, 1, 1)
    item = ledger.history(sub.run_id, "apply", 1)
    assert item.item.attempts == 0
    redriven = [e for e in item.events if e.kind == "redriven"]
    assert redriven and redriven[0].actor == "operator"
    assert redriven[0].detail["note"] == "fixed b"


def test_two_concurrent_retries_redrive_each_item_once(db_url: str) -> None:
    keys = [f"k{i}" for i in range(60)]
    ledger = make_ledger(db_url, fail=set(keys))
    sub = ledger.job_named("batch").submit({"keys": keys}, key="r2")
    ledger.work(concurrency=2, until_idle=True)
    assert ledger.status(sub.run_id).failed == 60
    results: list[int] = []

    def redrive() -> None:
        other = Ledger(db_url)
        results.append(other.retry(sub.run_id))
        other.close()

    threads = [threading.Thread(target=redrive) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results) == 60
    events = [e for e in ledger.events(sub.run_id) if e.kind == "redriven"]
    assert len(events) == 60 and len({e.item_id for e in events}) == 60
    assert ledger.status(sub.run_id).failed == 0


def test_tolerated_failures_complete_with_failures_and_stay_retryable(db_url: str) -> None:
    ledger = make_ledger(db_url, fail={"k3"}, tolerate=1)
    sub = ledger.job_named("batch").submit({"keys": [f"k{i}" for i in range(10)]}, key="t")
    ledger.work(concurrency=2, until_idle=True)
    assert ledger.status(sub.run_id).state == "completed_with_failures"
    assert ledger.retry(sub.run_id, stage="apply") == 1
    assert ledger.status(sub.run_id).state == "running"


def test_cancel_skips_pending_items_with_reason(db_url: str) -> None:
    ledger = make_ledger(db_url)
    sub = ledger.job_named("batch").submit({"keys": ["a", "b", "c"]}, key="c")
    assert ledger.cancel(sub.run_id, note="wrong period") == 3
    st = ledger.status(sub.run_id)
    assert (st.state, st.skipped, st.complete) == ("cancelled", 3, True)
    assert {i.error for i in ledger.items(sub.run_id)} == {"cancelled"}
    assert ledger.work(concurrency=1, until_idle=True).claimed == 0


def test_paused_run_is_not_claimed_until_resumed(db_url: str) -> None:
    ledger = make_ledger(db_url)
    sub = ledger.job_named("batch").submit({"keys": ["a", "b"]}, key="p")
    assert ledger.pause(sub.run_id)
    assert ledger.status(sub.run_id).state == "paused"
    assert ledger.work(concurrency=1, until_idle=True).claimed == 0
    assert ledger.resume(sub.run_id)
    assert ledger.work(concurrency=1, until_idle=True).processed == 2
    kinds = [e.kind for e in ledger.events(sub.run_id)]
    assert "paused" in kinds and "resumed" in kinds


def test_repeated_submit_reports_real_state_and_refuses_other_payload(db_url: str) -> None:
    from workledger.errors import PayloadMismatch

    ledger = make_ledger(db_url)
    job = ledger.job_named("batch")
    first = job.submit({"keys": ["a", "b"]}, key="same")
    again = job.submit({"keys": ["a", "b"]}, key="same")
    assert (again.created, again.run_id, again.state, again.next) == (
        False, first.run_id, "running", "workers")
    with pytest.raises(PayloadMismatch):
        job.submit({"keys": ["x"]}, key="same")
    ledger.work(concurrency=1, until_idle=True)
    done = job.submit({"keys": ["a", "b"]}, key="same")
    assert (done.created, done.state, done.next) == (False, "completed", "nobody: complete")
    assert len(ledger.runs()) == 1


def test_reconcile_repairs_total_99_with_three_terminal_items(db_url: str) -> None:
    ledger = make_ledger(db_url, fail={"b"})
    sub = ledger.job_named("batch").submit({"keys": ["a", "b", "c"]}, key="rc")
    ledger.work(concurrency=1, until_idle=True)
    _corrupt(db_url, sub.run_id, total=99, processed=0, failed=0, skipped=0, complete=False)
    dry = ledger.reconcile(sub.run_id, dry_run=True)
    assert (dry.stored.total, dry.derived.total, dry.repaired) == (99, 3, False)
    fixed = ledger.reconcile(sub.run_id)
    assert fixed.repaired
    run = ledger.store.run_get(sub.run_id)
    assert run is not None
    assert (run.total, run.processed, run.failed, run.skipped) == (3, 2, 1, 0)
    assert run.completed_at is not None
    assert not ledger.reconcile(sub.run_id, dry_run=True).repaired
    assert any(e.kind == "reconciled" for e in ledger.events(sub.run_id))


def test_reconcile_clears_a_premature_completion(db_url: str) -> None:
    ledger = make_ledger(db_url)
    sub = ledger.job_named("batch").submit({"keys": ["a"]}, key="pc")
    _corrupt(db_url, sub.run_id, total=1, processed=1, failed=0, skipped=0, complete=True)
    assert ledger.reconcile(sub.run_id).repaired
    run = ledger.store.run_get(sub.run_id)
    assert run is not None and run.completed_at is None and run.processed == 0


def _corrupt(url: str, run_id: int, **values: Any) -> None:
    from workledger.storage.port import Projection

    store = open_store(url)
    fake = Projection(**values)
    store.run_reconcile(run_id, lambda run, counts: fake, True, "test")
    store.close()


def test_audit_lists_failed_items_for_a_person(db_url: str) -> None:
    ledger = make_ledger(db_url, fail={"b"})
    sub = ledger.job_named("batch").submit({"keys": ["a", "b"]}, key="au")
    ledger.work(concurrency=1, until_idle=True)
    found = ledger.audit()
    failed = [f for f in found if f.kind == "failed"]
    assert len(failed) == 1 and failed[0].needs_person and failed[0].seq == 1
    assert f"retry {sub.run_id}" in failed[0].path
    assert not [f for f in found if f.kind == "projection_drift"]


def test_closing_hook_runs_once_even_with_racing_sweepers(db_url: str) -> None:
    ledger = make_ledger(db_url)
    closed: list[str] = []
    ledger.job_named("batch").on_complete(lambda status: closed.append(status.state))
    sub = ledger.job_named("batch").submit({"keys": ["a", "b"]}, key="close")
    ledger.work(concurrency=1, until_idle=True)
    assert closed == ["completed"]
    sweeps = [Ledger(db_url) for _ in range(2)]
    for other in sweeps:
        other.jobs = ledger.jobs
    threads = [threading.Thread(target=o.sweep) for o in sweeps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert closed == ["completed"]
    assert [e.kind for e in ledger.events(sub.run_id)].count("closed") == 1
    assert ledger.status(sub.run_id).state == "completed"


def test_expired_lease_of_non_idempotent_stage_becomes_unknown_then_resolved(db_url: str) -> None:
    ledger = make_ledger(db_url, idempotent=False)
    sub = ledger.job_named("batch").submit({"keys": ["a", "b"]}, key="unk")
    from workledger.storage.port import ClaimParams

    claimed = ledger.store.items_claim(ClaimParams(sub.run_id, 10, 0.2))
    assert len(claimed) == 2
    started(ledger, claimed)  # both handlers began: their effect may have happened
    wait_for(lambda: ledger.store.outlook([sub.run_id]).expired == 2)
    report = ledger.sweep()
    assert report.to_unknown == 2
    st = ledger.status(sub.run_id)
    assert (st.state, st.next) == ("awaiting_repair", "operator: resolve 2 unknown items")
    assert ledger.resolve(sub.run_id, "apply", 0, "processed", note="checked the sink")
    assert ledger.resolve(sub.run_id, "apply", 1, "pending")
    ledger.work(concurrency=1, until_idle=True)
    st = ledger.status(sub.run_id)
    assert (st.state, st.processed) == ("completed", 2)
    assert ledger.calls == ["b"]  # type: ignore[attr-defined]


def test_verify_hook_settles_expired_leases(db_url: str) -> None:
    answers = {"a": "done", "b": "not_done", "c": "unknown"}
    ledger = make_ledger(db_url, idempotent=False,
                         verify=lambda item, ctx: answers[item.key])
    sub = ledger.job_named("batch").submit({"keys": ["a", "b", "c"]}, key="ver")
    from workledger.storage.port import ClaimParams

    started(ledger, ledger.store.items_claim(ClaimParams(sub.run_id, 10, 0.2)))
    wait_for(lambda: ledger.store.outlook([sub.run_id]).expired == 3)
    ledger.sweep()
    states = {i.key: i.state for i in ledger.items(sub.run_id)}
    assert states == {"a": "processed", "b": "pending", "c": "unknown"}
    assert ledger.status(sub.run_id).state == "awaiting_repair"


def test_full_history_jobs_record_plain_claims_and_completions(db_url: str) -> None:
    ledger = Ledger(db_url)
    job = ledger.job("audited", full_history=True)
    job.decompose(lambda payload: (Item(key=k) for k in payload["keys"]))
    job.stage("apply", idempotent=True)(lambda item, ctx: {"ok": item.key})
    quiet = ledger.job("quiet")
    quiet.decompose(lambda payload: (Item(key=k) for k in payload["keys"]))
    quiet.stage("apply", idempotent=True)(lambda item, ctx: None)
    loud = job.submit({"keys": ["a", "b"]}, key="h")
    hush = quiet.submit({"keys": ["a", "b"]}, key="h")
    ledger.work(concurrency=1, until_idle=True)
    kinds = [e.kind for e in ledger.events(loud.run_id) if e.item_id is not None]
    assert sorted(kinds) == ["claimed", "claimed", "processed", "processed"]
    assert [e for e in ledger.events(hush.run_id) if e.item_id is not None] == []
