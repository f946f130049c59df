"""Shared fixtures: a real SQLite file per test and a throwaway PostgreSQL schema per test.

PostgreSQL comes from ``WORKLEDGER_TEST_POSTGRES_URL`` (default the local server's ``test``
database). The suite creates its own database for the session and one schema per test.
Without a reachable server the PostgreSQL cases are skipped locally and fail under ``CI=true``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from workledger.storage import open_store
from workledger.storage.port import Store

ADMIN_URL = os.environ.get(
    "WORKLEDGER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
BACKENDS = ["sqlite", "postgres"]


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
def pg_url(pg_database: str) -> str:
    """A fresh schema in the session database; the URL pins ``search_path`` to it."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in pg_database else "?"
    return f"{pg_database}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty ledger database, once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A migrated store on each backend."""
    s = open_store(db_url)
    s.migrate()
    try:
        yield s
    finally:
        s.close()
