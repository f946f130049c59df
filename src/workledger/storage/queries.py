"""Load named SQL queries and numbered migrations from the per-dialect ``.sql`` files."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_\w+\.sql$")


@cache
def queries(dialect: str) -> dict[str, str]:
    """Return ``{name: sql}`` for a dialect's ``queries.sql``."""
    text = resources.files("workledger.storage").joinpath(f"sql/{dialect}/queries.sql").read_text()
    parts = _NAME.split(text)
    found: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in found:
            raise ValueError(f"query {name} defined twice for {dialect}")
        found[name] = body.strip().rstrip(";")
    return found


@cache
def migrations(dialect: str) -> list[tuple[int, str, str]]:
    """Return ``[(version, filename, sql)]`` in version order."""
    folder = resources.files("workledger.storage").joinpath(f"sql/{dialect}/migrations")
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text()))
    found.sort()
    versions = [v for v, _, _ in found]
    if versions[:1] not in ([], [1]) or len(set(versions)) != len(versions):
        # numbers reserved for work on other branches may be missing: migrate() applies every
        # version not yet applied, whatever its order of arrival
        raise ValueError(f"{dialect} migrations are not numbered from 1, once each: {versions}")
    return found
