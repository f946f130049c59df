"""Shared fixtures: a real SQLite file per test and a throwaway PostgreSQL schema per test.

PostgreSQL comes from ``WORKLEDGER_TEST_POSTGRES_URL`` (default the local server's ``test``
database). The suite creates its own database for the session and one schema per test.
Without a reachable server the PostgreSQL cases are skipped locally and fail under ``CI=true``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from workledger.storage import open_store
from workledger.storage.port import Store

ADMIN_URL = os.environ.get(
    "WORKLEDGER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
# WORKLEDGER_TEST_BACKENDS=sqlite (what `make check` sets) leaves PostgreSQL out: its cases are
# not collected, and tests that need the server are skipped (also under CI=true).
BACKENDS = [b.strip() for b in os.environ.get("WORKLEDGER_TEST_BACKENDS", "sqlite,postgres")
            .split(",") if b.strip()]


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


def _pg_unreachable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"PostgreSQL is required in CI but unreachable: {reason}")
    pytest.skip(f"PostgreSQL unreachable: {reason}")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A database of our own on the test server, dropped when the session ends."""
    if "postgres" not in BACKENDS:
        pytest.skip("PostgreSQL left out (WORKLEDGER_TEST_BACKENDS)")
    try:
        import psycopg

        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
    except Exception as exc:  # noqa: BLE001 - any failure to connect means "unreachable"
        _pg_unreachable(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))
        raise AssertionError("unreachable") from exc  # for type checkers; skip/fail raised
    name = f"wl_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(ADMIN_URL, name)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, pg_database: str) -> Iterator[str]:
    """A fresh schema in the session database; the URL pins ``search_path`` to it."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in pg_database else "?"
    url = f"{pg_database}{sep}options={quote(f'-csearch_path={schema}')}"
    yield url
    _check_counts(request, url)


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    yield url
    _check_counts(request, url)


# wl_stage_counts (the projection status reads) against the items it summarises: rows in one
# and not the other. Every test on db_url ends with this check, so a write path that forgets to
# move a counter fails whichever test takes it.
DRIFT_SQL = """
SELECT 'stored' AS side, run_id, stage, state, n FROM (
    SELECT run_id, stage, state, n FROM wl_stage_counts WHERE n <> 0
    EXCEPT SELECT run_id, stage, state, count(*) FROM wl_items GROUP BY run_id, stage, state) AS a
UNION ALL
SELECT 'ledger', run_id, stage, state, n FROM (
    SELECT run_id, stage, state, count(*) AS n FROM wl_items GROUP BY run_id, stage, state
    EXCEPT SELECT run_id, stage, state, n FROM wl_stage_counts WHERE n <> 0) AS b
ORDER BY 2, 3, 4, 1
"""


def counts_drift(url: str) -> list[tuple[object, ...]] | None:
    """Where wl_stage_counts disagrees with the items; None when the ledger has no such table."""
    if url.startswith("sqlite:///"):
        import sqlite3

        path = url[len("sqlite:///"):]
        if not Path(path).exists():
            return None
        with closing(sqlite3.connect(path)) as conn:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'wl_stage_counts'")
            if found.fetchone() is None:
                return None
            return [tuple(r) for r in conn.execute(DRIFT_SQL)]
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        if pg.execute("SELECT to_regclass('wl_stage_counts')").fetchone() == (None,):
            return None
        return [tuple(r) for r in pg.execute(DRIFT_SQL)]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty ledger database, once per backend. After the test, the stage
    counts must agree with the items (tests that corrupt them on purpose are marked
    ``counts_drift``)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
        yield url
        _check_counts(request, url)
    else:
        yield str(request.getfixturevalue("pg_url"))  # pg_url checks after the test


def _check_counts(request: pytest.FixtureRequest, url: str) -> None:
    if request.node.get_closest_marker("counts_drift") is None:
        drift = counts_drift(url)
        assert not drift, f"wl_stage_counts disagrees with wl_items: {drift}"


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A migrated store on each backend."""
    s = open_store(db_url)
    s.migrate()
    try:
        yield s
    finally:
        s.close()
