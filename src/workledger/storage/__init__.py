"""Storage: the port and its adapters. Only this package imports a database driver."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

from workledger.errors import BadInput
from workledger.storage.port import Store

DEFAULT_URL = "sqlite:///workledger.db"


def open_store(url: str) -> Store:
    """Open a store for ``url``: ``sqlite:///rel.db``, ``sqlite:////abs.db``, ``postgresql://...``."""
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme == "sqlite":
        path = url[len("sqlite:///"):] if url.lower().startswith("sqlite:///") else ""
        if not path:
            raise BadInput(f"bad SQLite URL {url!r}: use sqlite:///relative.db or sqlite:////abs.db")
        from workledger.storage.sqlite import SqliteStore

        return SqliteStore(unquote(path))
    if scheme in ("postgresql", "postgres"):
        from workledger.storage.postgres import PostgresStore

        return PostgresStore(url)
    raise BadInput(
        f"unknown database URL {url!r}: expected sqlite:///PATH or postgresql://USER@HOST/DB"
    )


def display_url(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
