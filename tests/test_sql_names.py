"""The two dialects name the same queries and number the same migrations (docs/contributing.md)."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from workledger.storage.queries import migrations, queries

pytestmark = pytest.mark.unit

DIALECTS = ("sqlite", "postgres")


def test_both_dialects_define_the_same_query_names() -> None:
    sqlite, postgres = set(queries("sqlite")), set(queries("postgres"))
    assert sqlite, "no queries found in sql/sqlite/queries.sql"
    assert sqlite - postgres == set(), "only in sqlite"
    assert postgres - sqlite == set(), "only in postgres"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_named_query_has_a_body(dialect: str) -> None:
    empty = [name for name, sql in queries(dialect).items() if not sql.strip()]
    assert empty == []


@pytest.mark.parametrize("dialect", DIALECTS)
def test_migrations_are_numbered_one_to_n(dialect: str) -> None:
    versions = [version for version, _name, _sql in migrations(dialect)]
    assert versions, f"{dialect} has no migrations"
    assert versions == list(range(1, len(versions) + 1))


def test_both_dialects_have_the_same_migration_versions() -> None:
    assert [v for v, _, _ in migrations("sqlite")] == [v for v, _, _ in migrations("postgres")]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_sql_file_in_migrations_is_picked_up(dialect: str) -> None:
    """A misnamed file ('2_add.sql', '0002-add.sql') would be silently skipped by migrate()."""
    folder = resources.files("workledger.storage").joinpath(f"sql/{dialect}/migrations")
    on_disk = sorted(e.name for e in folder.iterdir() if e.name.endswith(".sql"))
    loaded = sorted(name for _v, name, _sql in migrations(dialect))
    assert on_disk == loaded
    assert all(re.fullmatch(r"\d{4}_\w+\.sql", name) for name in on_disk)
