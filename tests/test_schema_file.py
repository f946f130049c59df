"""The schema is an artefact: ``src/workledger/storage/sql/<dialect>/schema.sql`` is what a fresh
ledger holds after every migration, and this test diffs the two on each backend: tables,
columns in order with their types, nullability and defaults, constraints (primary key, unique,
check), indexes with their partial predicates, sequences. A migration without a regenerated
file, or a file edited by hand, fails here; `make schema` (tests/schema_files.py) rewrites it.
"""

from __future__ import annotations

import difflib

import pytest
from schema_files import body_of, connect, describe, schema_path

from workledger.storage import open_store

pytestmark = pytest.mark.contract


def dialect_of(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgres"


def drift(expected: str, found: str, found_name: str) -> str:
    lines = difflib.unified_diff(expected.splitlines(), found.splitlines(), "schema.sql",
                                 found_name, lineterm="")
    return ("schema.sql and the database differ (after a new migration, run `make schema`):\n"
            + "\n".join(lines))


def test_a_migrated_ledger_has_exactly_the_schema_of_schema_sql(db_url: str) -> None:
    store = open_store(db_url)
    try:
        store.migrate()
    finally:
        store.close()
    with connect(db_url) as conn:
        found = describe(conn)
    expected = body_of(schema_path(dialect_of(db_url)).read_text())
    assert found == expected, drift(expected, found, "migrated database")


def test_schema_sql_run_on_an_empty_database_builds_that_schema(db_url: str) -> None:
    """The file is SQL a reader can run, not only a text to compare."""
    text = schema_path(dialect_of(db_url)).read_text()
    with connect(db_url) as conn:
        if dialect_of(db_url) == "sqlite":
            conn.executescript(text)
        else:
            conn.execute(text)
        found = describe(conn)
    assert found == body_of(text), drift(body_of(text), found, "database built from it")
