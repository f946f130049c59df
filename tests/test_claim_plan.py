"""The claim stays O(chunk) however many finished rows sit in the table: its plan walks the
partial index of pending rows, never the whole table or the primary key with a filter. The
status queries read the stage counts and two small partial indexes, never the run's rows.

These tests mark 45,000 rows finished by hand, around the ledger's counters (counts_drift)."""

from __future__ import annotations

import sqlite3

import pytest

from workledger.storage import open_store
from workledger.storage.port import ItemsInsert, NewItem, NewRun
from workledger.storage.queries import queries

pytestmark = pytest.mark.contract

ROWS = 50_000
FINISHED = 45_000


def _ledger_with_finished_rows(url: str) -> int:
    store = open_store(url)
    store.migrate()
    run, _ = store.run_submit(NewRun("plan", "k", "{}"))
    for start in range(0, ROWS, 5000):
        rows = [NewItem(seq, f"k{seq}", None) for seq in range(start, start + 5000)]
        store.items_insert_many(ItemsInsert(run.id, "apply", rows))
    store.run_mark_decomposed(run.id, "apply")
    store.close()
    return run.id


def _pg_plans(pg_url: str, run_id: int) -> dict[str, str]:
    import psycopg

    q = queries("postgres")
    ids = list(range(FINISHED + 1, FINISHED + 101))  # one chunk (the worker's default, 100)
    statements = {
        "items_claim": {"run_id": run_id, "after_id": 0, "limit": 500, "lease": 30.0,
                        "closing": False, "holder": None},
        # another stage's claim: the run's 5,000 pending rows are all of stage "apply"
        "items_claim_stage": {"run_id": run_id, "stage": "deliver", "limit": 500,
                              "lease": 30.0, "token": None, "holder": None},
        "items_finish_if_leased": {
            "ids": ids, "tokens": [1] * 100, "states": ["processed"] * 100,
            "results": [None] * 100, "errors": [None] * 100, "delays": [None] * 100,
            "charges": [1] * 100},
        "items_finish_group": {
            "ids": ids, "token": 1, "state": "processed", "result": None, "error": None,
            "delay": None, "charge": 1},
        "items_heartbeat": {"ids": ids, "token": 1, "lease": 30.0},
        "items_handoff": {"ids": ids, "stages": ["next"] * 100},
        "run_counts": {"run_id": run_id},
        "run_waits": {"run_id": run_id, "verify": "lease_expired: awaiting verify"},
    }
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE wl_items SET state = 'processed' WHERE seq < %s", (FINISHED,))
        conn.execute("ANALYZE wl_items")
        return {
            name: "\n".join(r[0] for r in conn.execute("EXPLAIN " + q[name], params).fetchall())
            for name, params in statements.items()
        }


@pytest.mark.counts_drift
def test_postgres_hot_statements_never_scan_the_items_table(pg_url: str) -> None:
    plans = _pg_plans(pg_url, _ledger_with_finished_rows(pg_url))
    assert "wl_items_claimable" in plans["items_claim"], plans["items_claim"]
    # a limited job's claim walks one stage's pending rows (stage limits, migration 0005)
    assert "wl_items_stage_claimable" in plans["items_claim_stage"], plans["items_claim_stage"]
    # a chunk's statements fetch its rows by primary key, however many rows are claimed
    for name in ("items_finish_group", "items_finish_if_leased", "items_heartbeat"):
        assert "wl_items_pkey" in plans[name], f"{name}:\n{plans[name]}"
        assert "wl_items_leased" not in plans[name], f"{name}:\n{plans[name]}"
    assert "wl_items_leased" in plans["run_waits"], plans["run_waits"]
    assert "wl_items_waiting" in plans["run_waits"], plans["run_waits"]
    assert "wl_items" not in plans["run_counts"].replace("wl_stage_counts", ""), plans["run_counts"]
    for name, plan in plans.items():
        assert "Seq Scan on wl_items" not in plan, f"{name}:\n{plan}"


@pytest.mark.counts_drift
def test_sqlite_status_queries_read_counts_and_small_indexes(sqlite_url: str) -> None:
    run_id = _ledger_with_finished_rows(sqlite_url)
    conn = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    q = queries("sqlite")
    args = {"run_id": run_id, "verify": "lease_expired: awaiting verify"}
    plans = {name: [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + q[name], args)]
             for name in ("run_counts", "run_waits")}
    conn.close()
    assert not any("wl_items " in line or line.endswith("wl_items") for line in
                   plans["run_counts"]), plans["run_counts"]
    waits = " | ".join(plans["run_waits"])
    assert "wl_items_leased" in waits and "wl_items_waiting" in waits, waits


@pytest.mark.counts_drift
def test_sqlite_claim_plan_uses_the_pending_index(sqlite_url: str) -> None:
    run_id = _ledger_with_finished_rows(sqlite_url)
    path = sqlite_url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path)
    conn.execute("UPDATE wl_items SET state = 'processed' WHERE seq < ?", (FINISHED,))
    conn.commit()
    conn.execute("ANALYZE")
    sql = queries("sqlite")["items_claim"]
    params = {"token": 1, "lease": "+30 seconds", "run_id": run_id, "after_id": 0, "limit": 500,
              "closing": False, "holder": None}
    plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    conn.close()
    picked = [line for line in plan if "wl_items" in line and "INDEX" in line]
    assert any("wl_items_claimable" in line for line in picked), plan
    assert not any(line.startswith("SCAN wl_items") and "INDEX" not in line for line in plan), plan
