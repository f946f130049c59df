"""A quick walk through the PostgreSQL adapter on a throwaway database.

The full behaviour of the port is pinned by the contract suite on both backends; this file only
checks that the adapter's SQL runs and fits together on a real server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import replace
from urllib.parse import urlsplit, urlunsplit

import pytest
from conftest import BACKENDS
from writes_support import write_of

from workledger.core import writes
from workledger.errors import DatabaseUnavailable
from workledger.storage.port import (
    ClaimParams,
    Finish,
    FinishParams,
    ItemsInsert,
    ItemsQuery,
    LeaseParams,
    NewItem,
    NewRun,
    Projection,
    ReclaimParams,
    RunRow,
    Settle,
    SettleParams,
)
from workledger.storage.postgres import PostgresStore
from workledger.storage.queries import migrations

ADMIN_URL = os.environ.get(
    "WORKLEDGER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)

pytestmark = pytest.mark.contract


@pytest.fixture(scope="module")
def smoke_url() -> Iterator[str]:
    import psycopg

    if "postgres" not in BACKENDS:
        pytest.skip("PostgreSQL left out (WORKLEDGER_TEST_BACKENDS)")
    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"PostgreSQL is required in CI but unreachable: {exc}")
        pytest.skip(f"PostgreSQL unreachable: {str(exc).splitlines()[0]}")
    name = f"wl_smoke_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(ADMIN_URL)._replace(path="/" + name))
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def pg(smoke_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(smoke_url)
    store.migrate()
    try:
        yield store
    finally:
        store.close()


def _submit_ten(pg: PostgresStore, key: str) -> int:
    run, created = pg.run_submit(NewRun(job="payslips", idempotency_key=key, payload='{"m": 1}'))
    assert created
    items = [NewItem(seq=i, key=f"emp-{i}", data=f'{{"n": {i}}}') for i in range(9)]
    items.append(NewItem(seq=9, key="emp-9", data=None, state="skipped", error="no bank account"))
    assert pg.items_insert_many(ItemsInsert(run_id=run.id, stage="generate", items=items)) == 10
    assert pg.items_insert_many(ItemsInsert(run_id=run.id, stage="generate", items=items)) == 0
    return run.id


def test_migrate_is_idempotent(smoke_url: str) -> None:
    store = PostgresStore(smoke_url)
    try:
        store.migrate()
        assert store.migrate() == []
        assert store.schema_version() == migrations("postgres")[-1][0]
    finally:
        store.close()


def test_submit_twice_returns_the_first_run(pg: PostgresStore) -> None:
    new = NewRun(job="payslips", idempotency_key="k-submit", payload='{"month": "2024-05"}')
    first, created = pg.run_submit(new)
    again, created_again = pg.run_submit(new)
    assert created and not created_again
    assert again.id == first.id and again.payload == {"month": "2024-05"}
    assert pg.run_get(first.id) == replace(first, payload=None)  # readers skip the payload
    assert first.id in [r.id for r in pg.runs_list()]
    assert pg.run_get(10**12) is None


def test_claim_finish_and_count(pg: PostgresStore) -> None:
    run_id = _submit_ten(pg, "k-walk")
    run = pg.run_mark_decomposed(run_id, "generate")
    assert (run.total, run.skipped, run.decomposed_at is not None) == (10, 1, True)
    assert (run_id, "payslips", 0, None, 1) in pg.runs_claimable(["payslips", "other"])

    claimed = pg.items_claim(ClaimParams(run_id=run_id, limit=5, lease_seconds=30))
    assert [c.seq for c in claimed] == [0, 1, 2, 3, 4]
    token = claimed[0].lease_token
    assert token > 0 and all(c.lease_token == token for c in claimed)
    assert claimed[1].data == {"n": 1}
    ids = [c.id for c in claimed]
    assert pg.items_mark_started(LeaseParams(run_id, ids, token)) == ids
    assert pg.items_heartbeat(LeaseParams(run_id, ids, token, lease_seconds=60)) == 5
    assert pg.items_heartbeat(LeaseParams(run_id, ids, token + 1000, lease_seconds=60)) == 0

    finishes = [Finish(id=i, lease_token=token, write=write_of("processed"),
                       result='{"ok": true}', charge=0) for i in ids[:4]]
    finishes.append(Finish(id=ids[4], lease_token=token + 1000, write=write_of("processed")))
    result = pg.items_finish_if_leased(FinishParams(run_id, finishes))
    assert result.applied == ids[:4] and result.stale == [ids[4]]

    stale = pg.events_list(run_id, ids[4])
    assert [e.kind for e in stale] == ["stale_result"]
    assert stale[0].detail == {"discarded_state": "processed", "error": None}
    assert pg.run_counts(run_id) == {
        "generate": {"processed": 4, "claimed": 1, "pending": 4, "skipped": 1}
    }
    after = pg.run_get(run_id)
    assert after is not None
    assert (after.processed, after.skipped, after.failed, after.completed_at) == (4, 1, 0, None)
    done = pg.items_list(ItemsQuery(run_id=run_id, state="processed"))
    assert [i.result for i in done] == [{"ok": True}] * 4
    assert all(i.attempts == 1 and i.lease_until is None for i in done)

    second = pg.items_claim(ClaimParams(run_id=run_id, limit=2, lease_seconds=30))
    assert len(second) == 2 and not {c.id for c in second} & set(ids)
    assert second[0].lease_token != token

    o = pg.outlook([run_id])
    assert (o.ready, o.waiting, o.next_ready_in, o.leased, o.expired) == (2, 0, None, 3, 0)
    assert o.lease_ends_in is not None and 25 < o.lease_ends_in <= 60


def test_retry_handoff_release_and_reclaim(pg: PostgresStore) -> None:
    run_id = _submit_ten(pg, "k-paths")
    pg.run_mark_decomposed(run_id, "generate")
    a, b, c, d = pg.items_claim(ClaimParams(run_id=run_id, limit=4, lease_seconds=30,
                                            record_event=True))
    t = a.lease_token
    result = pg.items_finish_if_leased(FinishParams(run_id, [
        Finish(id=a.id, lease_token=t, write=write_of("pending"), error="timeout", delay=60,
               detail='{"delay": 60}'),
        Finish(id=b.id, lease_token=t, write=write_of("processed", last=False),
               next_stage="deliver"),
    ]))
    assert result.applied == [a.id, b.id]
    assert [e.kind for e in pg.events_list(run_id, a.id)] == ["claimed", "retry_scheduled"]
    deliver = pg.items_list(ItemsQuery(run_id=run_id, stage="deliver"))
    assert [(i.seq, i.key, i.data, i.state) for i in deliver] == [
        (b.seq, b.key, b.data, "pending")]
    assert pg.items_release(LeaseParams(run_id, [c.id], t)) == 1

    o = pg.outlook([run_id])
    assert (o.waiting, o.leased) == (1, 1)
    assert o.next_ready_in is not None and 55 < o.next_ready_in <= 60

    expiring = pg.items_claim(ClaimParams(run_id=run_id, limit=1, lease_seconds=0))
    assert [e.id for e in expiring] == [c.id]
    # its handler started (migration 0004): an item never started would go back to pending
    assert pg.items_mark_started(LeaseParams(run_id, [c.id], expiring[0].lease_token)) == [c.id]
    reclaimed = pg.leases_reclaim_expired(ReclaimParams(
        job="payslips", stage="generate", to_state="unknown", reason="lease expired"))
    assert [(i.id, i.state, i.error) for i in reclaimed] == [(c.id, "unknown", "lease expired")]
    assert pg.events_list(run_id, c.id)[-1].kind == "unknown"
    assert d.id not in {i.id for i in reclaimed}


def test_unreachable_server_is_one_clear_error() -> None:
    with pytest.raises(DatabaseUnavailable) as caught:
        PostgresStore("postgresql://postgres@127.0.0.1:5999/test")
    message = str(caught.value)
    assert message == "cannot connect to PostgreSQL at 127.0.0.1:5999: connection refused"
    assert caught.value.__cause__ is not None


def test_operator_moves_and_reconcile(pg: PostgresStore) -> None:
    run_id = _submit_ten(pg, "k-ops")
    pg.run_mark_decomposed(run_id, "generate")
    assert pg.run_set_paused(run_id, True, "ops", "maintenance") is True
    assert pg.items_claim(ClaimParams(run_id=run_id, limit=5, lease_seconds=30)) == []
    assert pg.run_set_paused(run_id, False, "ops", None) is True
    (held,) = pg.items_claim(ClaimParams(run_id=run_id, limit=1, lease_seconds=30))
    pg.items_finish_if_leased(FinishParams(run_id, [
        Finish(id=held.id, lease_token=held.lease_token, write=write_of("failed"),
               error="bad input")]))
    assert [i.id for i in pg.items_attention(["failed"])] == [held.id]

    moved = pg.items_settle(SettleParams(run_id=run_id, from_state="failed", settles=[
        Settle(id=held.id, write=writes.redriven("generate"), reset_attempts=True)]))
    again = pg.items_settle(SettleParams(run_id=run_id, from_state="failed", settles=[
        Settle(id=held.id, write=writes.redriven("generate"))]))
    assert (moved.applied, again.stale) == ([held.id], [held.id])
    assert pg.items_list(ItemsQuery(run_id=run_id, seq=held.seq))[0].state == "pending"

    assert pg.run_cancel(run_id, "ops", "not needed") == 9
    assert pg.run_cancel(run_id, "ops", None) == -1
    run = pg.run_get(run_id)
    assert run is not None and (run.skipped, run.failed, run.completed_at is not None) == (
        10, 0, True)

    def derive(row: RunRow, counts: dict[str, dict[str, int]]) -> Projection:
        skipped = counts["generate"].get("skipped", 0)
        return Projection(total=10, processed=0, failed=0, skipped=skipped, complete=True)

    checked = pg.run_reconcile(run_id, derive, repair=True, actor="ops")
    assert checked.stored == checked.derived and not checked.repaired
    kinds = [e.kind for e in pg.events_list(run_id) if e.item_id is None]
    assert kinds == ["submitted", "decomposed", "paused", "resumed", "cancelled"]
