"""The two dialects name the same queries and number the same migrations (docs/contributing.md),
and every named query is used by the code (no dead query), found as a literal ``Q["name"]``."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

import workledger.storage
from workledger.storage.queries import migrations, queries

pytestmark = pytest.mark.unit

DIALECTS = ("sqlite", "postgres")
# The one query a single dialect needs: SQLite has neither sequences nor writing CTEs, so its
# claim takes a lease token in a statement of its own; PostgreSQL's items_claim takes it from
# its sequence in the claim itself.
DIALECT_ONLY = {"lease_token_peek": "sqlite", "lease_token_next": "sqlite"}

STORAGE = Path(workledger.storage.__file__).parent
REFERENCE = re.compile(r"""\bQ\[["'](\w+)["']\]""")  # Q["name"], self.Q["name"]
SUBSCRIPT = re.compile(r"\bQ\[")  # any lookup in a query table


def sources(dialect: str) -> dict[str, str]:
    """The storage modules a dialect's adapter runs: the shared ones and its own (``<d>.py``)."""
    others = {f"{d}.py" for d in DIALECTS if d != dialect}
    return {p.name: p.read_text() for p in sorted(STORAGE.glob("*.py")) if p.name not in others}


def referenced(dialect: str) -> set[str]:
    return {name for text in sources(dialect).values() for name in REFERENCE.findall(text)}


def test_both_dialects_define_the_same_query_names() -> None:
    sqlite, postgres = set(queries("sqlite")), set(queries("postgres"))
    assert sqlite, "no queries found in sql/sqlite/queries.sql"
    only = {"sqlite": sqlite - postgres, "postgres": postgres - sqlite}
    allowed = {d: {n for n, owner in DIALECT_ONLY.items() if owner == d} for d in DIALECTS}
    assert only["sqlite"] == allowed["sqlite"], "only in sqlite"
    assert only["postgres"] == allowed["postgres"], "only in postgres"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_named_query_is_used(dialect: str) -> None:
    """A query no code names is dead: it drifts from the schema unseen, or hides a lost call."""
    unused = set(queries(dialect)) - referenced(dialect)
    assert unused == set(), f"defined in sql/{dialect}/queries.sql, used by no storage module"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_used_query_is_defined(dialect: str) -> None:
    assert referenced(dialect) - set(queries(dialect)) == set()


def test_queries_are_named_by_literals() -> None:
    """``Q[name]`` or ``Q["a" if x else "b"]`` would hide a use from the tests above: write
    ``Q["a"] if x else Q["b"]``."""
    for path in sorted(STORAGE.glob("*.py")):
        text = path.read_text()
        assert len(SUBSCRIPT.findall(text)) == len(REFERENCE.findall(text)), path.name


def test_the_reference_pattern_sees_every_spelling() -> None:
    text = 'Q["a"] self.Q["b"] Q[\'c\'] (Q["d"] if x else Q["e"]) Q[name] Q["f" if x else "g"]'
    assert REFERENCE.findall(text) == ["a", "b", "c", "d", "e"]
    assert len(SUBSCRIPT.findall(text)) == 7


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_named_query_has_a_body(dialect: str) -> None:
    empty = [name for name, sql in queries(dialect).items() if not sql.strip()]
    assert empty == []


@pytest.mark.parametrize("dialect", DIALECTS)
def test_migrations_are_numbered_from_one_once_each(dialect: str) -> None:
    versions = [version for version, _name, _sql in migrations(dialect)]
    assert versions, f"{dialect} has no migrations"
    assert versions[0] == 1 and versions == sorted(set(versions))


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
