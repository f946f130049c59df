"""Chunks across runs (issue 25): one claim statement takes the claimable items of several runs of
one job, and one finish writes their outcomes, each run's counters and completion its own. On
SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_cli import cli_cmd, cli_env
from test_contract_store import JOB, LONG, S1, S2, decomposed, done, insert, row, rows, run_of
from writes_support import write_of

from workledger import Item, Ledger
from workledger.storage.port import (
    ClaimedItem,
    ClaimParams,
    Finish,
    FinishParams,
    LeaseParams,
    NewRun,
    Store,
)

pytestmark = pytest.mark.contract


def claim_runs(store: Store, run_ids: list[int], limit: int = 100,
               record_event: bool = False) -> list[ClaimedItem]:
    return store.items_claim(ClaimParams(run_id=run_ids[0], run_ids=tuple(run_ids), limit=limit,
                                         lease_seconds=LONG, record_event=record_event))


def finish_all(store: Store, chunk: list[ClaimedItem], *finishes: Finish):
    return store.items_finish_if_leased(FinishParams(
        chunk[0].run_id, finishes, run_of={c.id: c.run_id for c in chunk}))


def test_one_claim_takes_items_of_several_runs_under_one_token(store: Store) -> None:
    runs = [decomposed(store, 2, key=f"r{i}") for i in range(4)]
    chunk = claim_runs(store, [r.id for r in runs], limit=7)
    assert len(chunk) == 7
    assert len({c.lease_token for c in chunk}) == 1
    # run by run in the order given, each run's items in id order
    assert [(c.run_id, c.seq) for c in chunk] == [
        (r.id, s) for r in runs for s in range(2)][:7]
    for r in runs:
        assert store.run_counts(r.id)[S1] == (
            {"claimed": 2} if r is not runs[-1] else {"claimed": 1, "pending": 1})


def test_a_paused_cancelled_or_other_jobs_run_gives_nothing_to_a_claim_across_runs(
        store: Store) -> None:
    a, paused, cancelled, b = (decomposed(store, 2, key=k) for k in "apcb")
    other = decomposed(store, 2, key="o", job="other")
    undecomposed, _ = store.run_submit(NewRun(JOB, "u", json.dumps({})))
    insert(store, undecomposed.id, range(2))
    store.run_set_paused(paused.id, True, "test", None)
    store.run_cancel(cancelled.id, "test", None)
    ids = [a.id, paused.id, cancelled.id, undecomposed.id, b.id]
    chunk = claim_runs(store, ids)
    assert {c.run_id for c in chunk} == {a.id, b.id}
    assert len(chunk) == 4
    assert {r.state for r in rows(store, paused.id)} == {"pending"}
    assert {r.state for r in rows(store, other.id)} == {"pending"}


def test_a_finish_across_runs_counts_and_completes_each_run(store: Store) -> None:
    runs = [decomposed(store, 2, key=f"r{i}") for i in range(3)]
    chunk = claim_runs(store, [r.id for r in runs])
    failed = chunk[-1]
    result = finish_all(store, chunk, *[done(c) for c in chunk[:-1]],
                        Finish(failed.id, failed.lease_token, write_of("failed"), error="boom"))
    assert result.applied == sorted(c.id for c in chunk) and result.stale == []
    for r in runs[:2]:
        after = run_of(store, r.id)
        assert (after.processed, after.failed, after.completed_at is not None) == (2, 0, True)
        assert store.run_counts(r.id)[S1] == {"processed": 2}
    last = run_of(store, runs[2].id)
    assert (last.processed, last.failed, last.completed_at is not None) == (1, 1, True)
    assert store.run_counts(runs[2].id)[S1] == {"processed": 1, "failed": 1}
    (event,) = [e for e in store.events_list(runs[2].id) if e.kind == "failed"]
    assert event.item_id == failed.id


def test_a_stale_result_across_runs_is_recorded_in_its_own_run(store: Store) -> None:
    a, b = decomposed(store, 1, key="a"), decomposed(store, 1, key="b")
    chunk = claim_runs(store, [a.id, b.id])
    late = chunk[1]
    assert store.items_release(LeaseParams(b.id, [late.id], late.lease_token)) == 1
    result = finish_all(store, chunk, *[done(c) for c in chunk])
    assert result.stale == [late.id]
    assert [e.item_id for e in store.events_list(b.id) if e.kind == "stale_result"] == [late.id]
    assert [e for e in store.events_list(a.id) if e.kind == "stale_result"] == []
    assert run_of(store, a.id).processed == 1 and run_of(store, b.id).processed == 0


def test_a_hand_off_across_runs_lands_in_each_run_and_a_cancelled_run_skips_its_own(
        store: Store) -> None:
    a, b = decomposed(store, 1, key="a"), decomposed(store, 1, key="b")
    chunk = claim_runs(store, [a.id, b.id])
    store.run_cancel(b.id, "test", None)  # while its item is held
    later = write_of("processed", last=False)
    result = finish_all(store, chunk, *[Finish(c.id, c.lease_token, later, next_stage=S2)
                                         for c in chunk])
    assert len(result.applied) == 2
    assert [(r.stage, r.state) for r in rows(store, a.id, stage=S2)] == [(S2, "pending")]
    assert [(r.stage, r.state, r.error) for r in rows(store, b.id, stage=S2)] == [
        (S2, "skipped", "cancelled")]
    assert store.run_counts(a.id)[S2] == {"pending": 1}
    assert store.run_counts(b.id)[S2] == {"skipped": 1}
    assert run_of(store, b.id).skipped == 1


def test_claimed_events_across_runs_are_each_runs_own(store: Store) -> None:
    a, b = decomposed(store, 1, key="a"), decomposed(store, 2, key="b")
    chunk = claim_runs(store, [a.id, b.id], record_event=True)
    for r in (a, b):
        mine = [c.id for c in chunk if c.run_id == r.id]
        assert [e.item_id for e in store.events_list(r.id) if e.kind == "claimed"] == mine


def test_a_claim_across_runs_never_takes_a_closing_entry(store: Store) -> None:
    a, b = decomposed(store, 1, key="a"), decomposed(store, 1, key="b")
    insert(store, b.id, [0], stage="@close")
    chunk = claim_runs(store, [a.id, b.id])
    assert {c.stage for c in chunk} == {S1}
    assert row(store, b.id, [r.id for r in rows(store, b.id, stage="@close")][0]).state == (
        "pending")


# -- the worker: many small runs in few claims -------------------------------------------------


def _ledger(db_url: str) -> Ledger:
    ledger = Ledger(db_url)
    job = ledger.job("small")
    job.decompose(lambda p: (Item(key=f"{p['k']}-{i}", data={"i": i}) for i in range(p["n"])))
    job.stage("one", idempotent=True)(lambda item, ctx: item.data["i"])
    job.stage("two", after="one", idempotent=True)(lambda item, ctx: None)
    return ledger


@pytest.mark.integration
def test_many_small_runs_drain_in_chunks_that_span_runs(db_url: str) -> None:
    ledger = _ledger(db_url)
    try:
        job = ledger.job("small")
        runs = [job.submit({"k": i, "n": 2}, key=f"r{i}").run_id for i in range(300)]
        paused = runs[7]
        ledger.pause(paused)
        report = ledger.work(concurrency=1, chunk=100, until_idle=True)
        # 598 units of two stages: a claim per run would be 1,196 claims of one item
        assert report.processed == 2 * 2 * 299 and report.stale == 0
        assert report.chunks <= 40, report.chunks
        for run_id in runs:
            status = ledger.status(run_id)
            if run_id == paused:
                assert (status.processed, status.completed_at) == (0, None)
                continue
            assert (status.processed, status.failed, status.total) == (2, 0, 2), status
            assert status.completed_at is not None
        for run_id in runs[:20]:  # the counters each finish across runs wrote add up
            checked = ledger.reconcile(run_id, dry_run=True)
            assert checked.stored == checked.derived
            assert checked.stored_counts == checked.ledger_counts
    finally:
        ledger.close()


@pytest.mark.concurrency
def test_two_worker_processes_run_every_item_of_many_small_runs_once(
        db_url: str, tmp_path: Path) -> None:
    sink = tmp_path / "calls.log"
    ledger = Ledger(db_url)  # tests/apps/claims_app.py's job, to submit its runs from here
    try:
        job = ledger.job("notes")
        job.decompose(lambda p: (Item(key=f"k{i}", data={"sink": p["sink"], "hold": 0})
                                 for i in range(p["n"])))
        job.stage("note", idempotent=True)(lambda item, ctx: None)  # the workers run the app's
        for i in range(400):
            job.submit({"n": 3, "sink": str(sink), "hold": 0}, key=f"r{i}")
    finally:
        ledger.close()
    workers = [subprocess.Popen(cli_cmd("--db", db_url, "--app", "claims_app:ledger", "worker",
                                        "--until-idle", "--chunk", "50"),
                                cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in workers:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
    finally:
        for p in workers:
            p.kill()
    calls = [tuple(line.split()[:2]) for line in sink.read_text().splitlines()]
    assert len(calls) == 1200 and len(set(calls)) == 1200  # each item once, none twice
    assert len({line.split()[2] for line in sink.read_text().splitlines()}) == 2  # both worked
    ledger = Ledger(db_url)
    try:
        runs = ledger.runs(limit=500)
        assert len(runs) == 400 and all(r.processed == 3 and r.completed_at for r in runs)
    finally:
        ledger.close()
