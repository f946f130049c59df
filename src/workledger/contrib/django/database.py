"""The ledger's URL from one of Django's ``DATABASES`` entries. Plain Python: no Django import,
so the mapping is tested without a configured project."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from workledger.errors import UsageError

SQLITE_ENGINES = ("django.db.backends.sqlite3",)
POSTGRES_ENGINES = ("django.db.backends.postgresql", "django.contrib.gis.db.backends.postgis")
# OPTIONS Django (or psycopg's Python API) reads itself: no libpq connection parameter
NOT_LIBPQ = frozenset({"pool", "server_side_binding", "isolation_level", "assume_role",
                       "cursor_factory", "context", "prepare_threshold", "init_command",
                       "transaction_mode", "timeout", "check_same_thread", "uri"})


def url_for(alias: str, entry: Mapping[str, Any]) -> str:
    """``sqlite:////abs/path.db`` or ``postgresql://user:password@host:port/name?...`` for the
    ``DATABASES`` entry ``entry``. The password is only in the URL returned, which the ledger
    masks wherever it shows it (``Ledger.where``)."""
    engine = str(entry.get("ENGINE") or "")
    if engine in SQLITE_ENGINES:
        return _sqlite(alias, entry.get("NAME"))
    if engine in POSTGRES_ENGINES:
        return _postgres(entry)
    raise UsageError(f"Django database {alias!r} uses {engine or 'no ENGINE'}: workledger "
                     "keeps its ledger in SQLite or PostgreSQL; set WORKLEDGER_DB")


def _sqlite(alias: str, name: Any) -> str:
    path = os.fspath(name) if name else ""
    if not path or path == ":memory:" or "mode=memory" in path or path.startswith("file:"):
        raise UsageError(f"Django database {alias!r} is not a SQLite file ({path or 'no NAME'}):"
                         " the ledger needs one that workers open too; set WORKLEDGER_DB")
    # percent-encoded: the ledger percent-decodes the path (a '%' or '?' in it survives)
    return "sqlite:///" + quote(os.path.abspath(path), safe="/")


def _postgres(entry: Mapping[str, Any]) -> str:
    user, password = str(entry.get("USER") or ""), str(entry.get("PASSWORD") or "")
    host, port = str(entry.get("HOST") or ""), str(entry.get("PORT") or "")
    params: dict[str, str] = {}
    auth = ""
    if user:
        auth = quote(user, safe="") + (":" + quote(password, safe="") if password else "") + "@"
    elif password:
        params["password"] = password
    if host.startswith("/"):  # a Unix socket folder: libpq takes it as a parameter
        params["host"] = host
        if port:
            params["port"] = port
        netloc = auth
    else:
        netloc = auth + (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    for key, value in (entry.get("OPTIONS") or {}).items():
        if key not in NOT_LIBPQ and isinstance(value, str | int) and not isinstance(value, bool):
            params[str(key)] = str(value)
    query = urlencode(params, quote_via=quote) if params else ""
    return f"postgresql://{netloc}/{quote(str(entry.get('NAME') or ''), safe='')}" + (
        f"?{query}" if query else "")
