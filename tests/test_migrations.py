"""After migrate(), a fresh schema has exactly the public columns (docs/design.md, public schema).

The schema is read back through a raw driver connection opened from the test URL (only tests do
this; src/ keeps drivers inside workledger.storage).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote

import pytest

from workledger.storage import open_store
from workledger.storage.queries import migrations

pytestmark = pytest.mark.contract

PUBLIC_COLUMNS = {
    "wl_runs": {
        "id",
        "job",
        "idempotency_key",
        "payload",
        "created_at",
        "decomposed_at",
        "completed_at",
        "paused_at",
        "cancelled_at",
        "error",
        "total",
        "processed",
        "failed",
        "skipped",
        "tolerate",
        "deferred_at",
        "closing",
        "deadline_at",
        "warn_at",
        "deadline_missed_at",
        "priority",
        "tenant",
    },
    "wl_items": {
        "id",
        "run_id",
        "stage",
        "seq",
        "key",
        "data",
        "state",
        "attempts",
        "lease_until",
        "not_before",
        "lease_token",
        "started_at",
        "redispatch_at",
        "dispatches",
        "holder",
        "held_until",
        "concurrency_key",
        "result",
        "error",
        "created_at",
        "updated_at",
    },
    "wl_events": {"id", "run_id", "item_id", "at", "kind", "lease_token", "actor", "detail"},
    "wl_stage_counts": {"id", "run_id", "stage", "state", "n"},
    "wl_stage_limits": {"job", "stage", "tokens", "refreshed_at", "rate", "burst",
                        "max_in_flight", "held_until"},
    "wl_schedules": {"name", "job", "spec", "tz", "next_fire_at", "waiting_fire_at", "missed",
                     "paused_at", "paused_by", "created_at", "updated_at"},
    "wl_firings": {"schedule", "fire_at", "state", "run_id", "error", "attempts", "actor",
                   "recorded_at"},
    "wl_tenants": {"name", "weight", "updated_at", "updated_by", "note"},
}

PG_UNIQUE_INDEXES = """
SELECT array_agg(a.attname::text ORDER BY k.ord) AS columns
FROM pg_index AS i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k (attnum, ord)
JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND NOT i.indisprimary
GROUP BY i.indexrelid
"""


@contextmanager
def raw(db_url: str) -> Iterator[Any]:
    """A plain driver connection to the test database (autocommit)."""
    conn: Any
    if db_url.startswith("sqlite:///"):
        conn = sqlite3.connect(unquote(db_url[len("sqlite:///") :]), isolation_level=None)
    else:
        import psycopg

        conn = psycopg.connect(db_url, autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


def columns_of(conn: Any, table: str) -> set[str]:
    if isinstance(conn, sqlite3.Connection):
        return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
    found = conn.execute(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = %s",
        (table,),
    ).fetchall()
    return {r[0] for r in found}


def unique_keys_of(conn: Any, table: str) -> set[tuple[str, ...]]:
    if isinstance(conn, sqlite3.Connection):
        keys = set()
        for index in conn.execute(f"PRAGMA index_list({table})").fetchall():
            name, unique = index[1], index[2]
            if unique:
                info = conn.execute(f"PRAGMA index_info({name})").fetchall()
                keys.add(tuple(r[2] for r in sorted(info)))
        return keys
    return {tuple(r[0]) for r in conn.execute(PG_UNIQUE_INDEXES, (table,)).fetchall()}


@pytest.fixture
def migrated_url(db_url: str) -> str:
    store = open_store(db_url)
    try:
        store.migrate()
    finally:
        store.close()
    return db_url


@pytest.mark.parametrize("table", sorted(PUBLIC_COLUMNS))
def test_fresh_schema_has_exactly_the_public_columns(migrated_url: str, table: str) -> None:
    with raw(migrated_url) as conn:
        assert columns_of(conn, table) == PUBLIC_COLUMNS[table]


def test_items_are_unique_by_run_stage_and_seq(migrated_url: str) -> None:
    with raw(migrated_url) as conn:
        assert ("run_id", "stage", "seq") in unique_keys_of(conn, "wl_items")


@pytest.mark.counts_drift  # writes item rows by hand, around the ledger's counters
def test_the_database_refuses_a_second_row_for_the_same_run_stage_and_seq(
    migrated_url: str,
) -> None:
    with raw(migrated_url) as conn:
        p = "?" if isinstance(conn, sqlite3.Connection) else "%s"
        run_id = conn.execute(
            f"INSERT INTO wl_runs (job, idempotency_key, payload) VALUES ({p}, {p}, {p})"
            " RETURNING id",
            ("job", "k", "{}"),
        ).fetchone()[0]
        insert = f"INSERT INTO wl_items (run_id, stage, seq) VALUES ({p}, {p}, {p})"
        conn.execute(insert, (run_id, "apply", 1))
        conn.execute(insert, (run_id, "deliver", 1))  # another stage: fine
        with pytest.raises(integrity_error(conn)) as raised:
            conn.execute(insert, (run_id, "apply", 1))
        assert "unique" in f"{type(raised.value).__name__} {raised.value}".lower()


def integrity_error(conn: Any) -> type[Exception]:
    if isinstance(conn, sqlite3.Connection):
        return sqlite3.IntegrityError
    import psycopg

    return psycopg.IntegrityError


def test_migrating_twice_leaves_the_same_schema(migrated_url: str) -> None:
    with raw(migrated_url) as conn:
        before = {t: columns_of(conn, t) for t in PUBLIC_COLUMNS}
    store = open_store(migrated_url)
    try:
        assert store.migrate() == []
    finally:
        store.close()
    with raw(migrated_url) as conn:
        assert {t: columns_of(conn, t) for t in PUBLIC_COLUMNS} == before


def test_migration_2_counts_the_items_a_version_1_ledger_already_holds(db_url: str) -> None:
    """An existing ledger (schema 1) gets wl_stage_counts filled from its items on upgrade."""
    dialect = "sqlite" if db_url.startswith("sqlite") else "postgres"
    version, _name, sql = migrations(dialect)[0]
    with raw(db_url) as conn:
        p = "?" if dialect == "sqlite" else "%s"
        if dialect == "sqlite":
            conn.executescript(sql)
        else:
            conn.execute(sql)
        conn.execute("CREATE TABLE wl_schema_version (version integer PRIMARY KEY)")
        conn.execute(f"INSERT INTO wl_schema_version (version) VALUES ({p})", (version,))
        for run in (1, 2):
            conn.execute(f"INSERT INTO wl_runs (id, job, idempotency_key, payload) "
                         f"VALUES ({p}, 'old', {p}, '{{}}')", (run, f"k{run}"))
        rows = [(1, "a", seq, state) for seq, state in enumerate(
            ["processed"] * 5 + ["pending"] * 3 + ["failed", "unknown"])]
        rows += [(1, "b", seq, "pending") for seq in range(5)]
        rows += [(2, "a", seq, "skipped") for seq in range(2)]
        for row in rows:
            conn.execute(f"INSERT INTO wl_items (run_id, stage, seq, state) "
                         f"VALUES ({p}, {p}, {p}, {p})", row)
    store = open_store(db_url)
    try:
        assert store.migrate() == [v for v, _, _ in migrations(dialect)][1:]
        assert store.run_counts(1) == {"a": {"failed": 1, "pending": 3, "processed": 5,
                                             "unknown": 1}, "b": {"pending": 5}}
        assert list(store.run_counts(1)) == ["a", "b"]  # stages in the order they appeared
        assert store.run_counts(2) == {"a": {"skipped": 2}}
    finally:
        store.close()
