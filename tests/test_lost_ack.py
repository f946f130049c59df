"""Lost acknowledgements on PostgreSQL: the COMMIT reached the server and committed, its answer
never reached the store, and the store's retry layer (``_runtime/patience.py``) tries the call
again. Each retried statement must recognise its own earlier success (``storage/doubt.py``)
instead of doing its work a second time or reporting it as someone else's.

A real TCP proxy (``tests/net_faults.py``) stands between the store and the server and cuts the
connection right after it forwarded one COMMIT, before the reply reaches the store. The
opposite fault, a COMMIT that never arrived, must still be tried again, once.

SQLite has no such fault: the ledger is a local file and a commit returns from the same process
that wrote it (docs/reliability.md).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import closing
from urllib.parse import urlsplit

import psycopg
import pytest
from net_faults import CommitCutter
from writes_support import write_of

from workledger import Item, Ledger, Skip
from workledger._runtime.patience import Patience, patient
from workledger._runtime.repair.reconcile import derive_projection
from workledger.core.status import DECOMPOSITION_FAILED
from workledger.errors import CommitInDoubt, DatabaseUnavailable
from workledger.storage import open_store
from workledger.storage.port import (
    ClaimedItem,
    ClaimParams,
    Finish,
    FinishParams,
    ItemsInsert,
    ItemsQuery,
    LeaseParams,
    NewItem,
    NewRun,
    RunRow,
    Store,
)

pytestmark = pytest.mark.contract

JOB, STAGE = "ingest", "generate"


@pytest.fixture
def cutter(pg_url: str) -> Iterator[CommitCutter]:
    parts = urlsplit(pg_url)
    proxy = CommitCutter(parts.port or 5432, parts.hostname or "127.0.0.1")
    yield proxy
    proxy.close()


@pytest.fixture
def direct(pg_url: str) -> Iterator[Store]:
    """A store straight to the server: the test's own view of what was committed."""
    store = open_store(pg_url)
    store.migrate()
    yield store
    store.close()


@pytest.fixture
def through(pg_url: str, cutter: CommitCutter, direct: Store) -> Iterator[Store]:
    """The store under test: through the proxy, retried as long-lived processes retry."""
    store = open_store(cutter.url(pg_url))
    yield patient(store, Patience(30.0))
    store.close()


def decomposed(store: Store, n: int) -> RunRow:
    run, _ = store.run_submit(NewRun(JOB, "k1", json.dumps({"n": n})))
    store.items_insert_many(ItemsInsert(run.id, STAGE, [
        NewItem(seq=i, key=f"key-{i}", data=json.dumps({"seq": i})) for i in range(n)]))
    return store.run_mark_decomposed(run.id, STAGE)


def claim(store: Store, run_id: int) -> list[ClaimedItem]:
    return store.items_claim(ClaimParams(run_id=run_id, limit=100, lease_seconds=60.0))


def test_a_retried_record_error_counts_one_failure_once(
        direct: Store, through: Store, cutter: CommitCutter) -> None:
    run, _ = direct.run_submit(NewRun(JOB, "k1", json.dumps({"n": 1})))
    cutter.arm("after")
    through.run_record_error(run.id, "boom", "decomposer")
    assert cutter.cuts == 1
    failures = [e for e in direct.events_list(run.id) if e.kind == DECOMPOSITION_FAILED]
    assert len(failures) == 1
    found = direct.run_get(run.id)
    assert found is not None and found.error == "boom"


def test_a_retried_finish_reports_its_outcomes_applied_not_stale(
        direct: Store, through: Store, cutter: CommitCutter) -> None:
    run = decomposed(direct, 3)
    held = claim(direct, run.id)
    cutter.arm("after")
    result = through.items_finish_if_leased(FinishParams(run.id, [
        Finish(id=c.id, lease_token=c.lease_token, write=write_of("processed"))
        for c in held]))
    assert cutter.cuts == 1
    assert (result.applied, result.stale) == (sorted(c.id for c in held), [])
    assert [e for e in direct.events_list(run.id) if e.kind == "stale_result"] == []
    items = direct.items_list(ItemsQuery(run.id))
    assert {i.state for i in items} == {"processed"}
    assert {i.attempts for i in items} == {1}
    found = direct.run_get(run.id)
    assert found is not None and found.processed == 3 and found.completed_at is not None


def test_a_retried_mark_started_charges_its_suspect_once(
        direct: Store, through: Store, cutter: CommitCutter) -> None:
    run = decomposed(direct, 1)
    (held,) = claim(direct, run.id)
    cutter.arm("after")
    started = through.items_mark_started(LeaseParams(run.id, [held.id], held.lease_token))
    assert cutter.cuts == 1
    assert started == [held.id]  # still held: the handler may run
    (item,) = direct.items_list(ItemsQuery(run.id))
    assert item.attempts == held.attempts + 1
    assert item.started_at is not None


def test_a_retried_take_of_a_deferred_run_returns_the_run(
        pg_url: str, direct: Store, through: Store, cutter: CommitCutter) -> None:
    with closing(psycopg.connect(pg_url)) as caller:
        run, _ = direct.run_submit_in(caller, NewRun(JOB, "k1", json.dumps({"n": 3})))
        caller.commit()
    cutter.arm("after")
    taken = through.run_take_deferred(run.id)
    assert cutter.cuts == 1
    assert taken is not None and taken.id == run.id  # ours to decompose now, not in 30 s
    assert taken.payload == {"n": 3}
    assert direct.runs_deferred(None) == []  # and taken indeed


def test_a_commit_that_never_arrived_is_tried_again_once(
        direct: Store, through: Store, cutter: CommitCutter,
        caplog: pytest.LogCaptureFixture) -> None:
    """The server's session still sits in the transaction ('in progress' to others) when the
    store asks: it is ended, found aborted, and the call is tried again, once, at once (not
    after waiting on the old session's row lock until lock_timeout)."""
    run, _ = direct.run_submit(NewRun(JOB, "k1", json.dumps({"n": 1})))
    cutter.arm("before")
    with caplog.at_level(logging.WARNING, logger="workledger.db"):
        through.run_record_error(run.id, "boom", "decomposer")
    assert cutter.cuts == 1
    failures = [e for e in direct.events_list(run.id) if e.kind == DECOMPOSITION_FAILED]
    assert len(failures) == 1
    said = [r.getMessage() for r in caplog.records]
    assert any("asking the server whether transaction" in m for m in said), said
    assert not any("lock_timeout" in m or "trying again" in m for m in said), said


def test_an_outcome_that_cannot_be_learned_is_not_tried_again(
        pg_url: str, direct: Store, cutter: CommitCutter) -> None:
    """The server cannot be reached to ask (here: every new connection refused) for as long
    as the retry layer waits out an outage: CommitInDoubt, and the work is not done again."""
    run, _ = direct.run_submit(NewRun(JOB, "k1", json.dumps({"n": 1})))
    store = open_store(cutter.url(pg_url))
    try:
        cutter.arm("after", then_refuse=True)
        with pytest.raises(CommitInDoubt, match="could not be asked"):
            patient(store, Patience(1.0)).run_record_error(run.id, "boom", "decomposer")
    finally:
        store.close()
    failures = [e for e in direct.events_list(run.id) if e.kind == DECOMPOSITION_FAILED]
    assert len(failures) == 1  # it had committed; nobody wrote it twice


def test_a_retried_claim_returns_the_chunk_it_took(
        direct: Store, through: Store, cutter: CommitCutter) -> None:
    """Not one of the four reported, the same fault: tried again, the claim would take the
    next items and strand the first chunk until its lease expired."""
    run = decomposed(direct, 4)
    cutter.arm("after")
    held = through.items_claim(ClaimParams(run_id=run.id, limit=2, lease_seconds=60.0))
    assert cutter.cuts == 1
    claimed = [i for i in direct.items_list(ItemsQuery(run.id)) if i.state == "claimed"]
    assert sorted(c.id for c in held) == [i.id for i in claimed]
    assert {i.lease_token for i in claimed} == {held[0].lease_token}


def test_a_retried_submit_says_it_created_the_run(
        direct: Store, through: Store, cutter: CommitCutter) -> None:
    cutter.arm("after")
    run, created = through.run_submit(NewRun(JOB, "k1", json.dumps({"n": 1})))
    assert cutter.cuts == 1
    assert created  # not "already there": it was this very call
    assert [r.id for r in direct.runs_list()] == [run.id]


def test_an_outcome_learned_after_the_server_is_back_stands(
        direct: Store, through: Store, cutter: CommitCutter) -> None:
    """The server cannot be reached for a while after the lost answer (new connections
    refused), then it can: the store keeps asking and the committed call returns."""
    run, _ = direct.run_submit(NewRun(JOB, "k1", json.dumps({"n": 1})))
    cutter.arm("after", then_refuse=True)
    healed = threading.Timer(1.5, lambda: setattr(cutter, "refusing", False))
    healed.start()
    try:
        through.run_record_error(run.id, "boom", "decomposer")
    finally:
        healed.cancel()
    assert cutter.cuts == 1 and not cutter.refusing  # it was asked only once the way was back
    failures = [e for e in direct.events_list(run.id) if e.kind == DECOMPOSITION_FAILED]
    assert len(failures) == 1


def test_a_decomposition_cut_short_then_cancelled_keeps_its_total(
        pg_url: str, direct: Store, cutter: CommitCutter) -> None:
    """The fault campaign's failing rounds (seed 1305 round 92, seed 20261201 round 3): a
    ``submit`` loses its connection while it writes its third batch (the COMMIT never arrives;
    the command waits out no outage, so it exits), and an operator cancels the run before the
    sweeper resumes the decomposition. The sweeper never decomposes a cancelled run, so nothing
    marks this one decomposed: its stored ``total`` must already count the rows written
    (docs/design.md, invariant 2), or reconcile finds the run wrong for ever."""
    submitter = Ledger(cutter.url(pg_url))
    job = submitter.job(JOB, batch_size=4)

    @job.decompose
    def split(payload: dict[str, int]) -> Iterator[Item | Skip]:
        for i in range(payload["n"]):
            if i == 8:  # two batches are written: the next COMMIT is the third batch's
                cutter.arm("before")
            yield Skip(reason="no address", key=f"key-{i}") if i == 5 else Item(key=f"key-{i}")

    job.stage(STAGE)(lambda item, ctx: None)
    try:
        with pytest.raises(DatabaseUnavailable):
            job.submit({"n": 16}, key="k1")
    finally:
        submitter.close()
    assert cutter.cuts == 1
    (run,) = direct.runs_list()
    assert direct.run_cancel(run.id, "operator", None) == 7  # 8 rows: one a decomposer's skip
    assert direct.runs_undecomposed(0.0) == []  # the sweeper leaves a cancelled run alone
    check = direct.run_reconcile(run.id, derive_projection([STAGE]), False, "test")
    assert (check.derived.total, check.derived.skipped) == (8, 8)
    assert check.stored == check.derived
