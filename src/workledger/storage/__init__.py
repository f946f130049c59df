"""Storage: the port and its adapters. Only this package imports a database driver."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit, urlunsplit

from workledger.core.text import mask_url
from workledger.errors import BadInput, NoLedger
from workledger.storage.port import Store

DEFAULT_URL = "sqlite:///workledger.db"


def open_store(url: str, *, create: bool = True) -> Store:
    """Open a store for ``url``: ``sqlite:///rel.db``, ``sqlite:////abs.db``, ``postgresql://...``.

    ``create=False``: a database that holds no ledger yet (a SQLite file that does not exist, a
    PostgreSQL schema without the tables) raises :class:`NoLedger`, and nothing is created."""
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    store: Store
    if scheme == "sqlite":
        path = sqlite_path(url, create=create)
        from workledger.storage.sqlite import SqliteStore

        store = SqliteStore(path)
    elif scheme in ("postgresql", "postgres"):
        from workledger.storage.postgres import PostgresStore

        store = PostgresStore(url)
    else:
        raise BadInput(f"unknown database URL {mask_url(url)!r}: expected sqlite:///PATH or "
                       "postgresql://USER@HOST/DB")
    if not create and store.schema_version() == 0:
        store.close()
        raise no_ledger(url)
    return store


def no_ledger(url: str) -> NoLedger:
    return NoLedger(f"no ledger at {display_url(url)}: check --db, or run `workledger init`")


def sqlite_path(url: str, *, create: bool = True) -> str:
    """The file a ``sqlite:///`` URL names, checked before anything touches the disk.

    The path is percent-decoded (``%20`` is a space, ``%2e%2e`` is ``..``) and a leading ``~``
    is the home folder, in the folder check and the open alike; the query string is not
    interpreted (percent-encode ``?`` and ``#``)."""
    path = unquote(url[len("sqlite:///"):]) if url.lower().startswith("sqlite:///") else ""
    if not path:
        raise BadInput(f"bad SQLite URL {mask_url(url)!r}: use sqlite:///relative.db or "
                       "sqlite:////abs.db")
    if path == ":memory:":
        return path
    path = os.path.expanduser(path)
    if os.path.isdir(path):
        raise BadInput(f"cannot open SQLite database {mask_url(path)}: it is a folder")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise BadInput(f"cannot open SQLite database {mask_url(path)}: no folder {folder}")
    if not create and not os.path.exists(path):
        raise no_ledger(url)
    return path


def same_database(a: str, b: str) -> bool:
    """Whether two URLs name one ledger: the same SQLite file however its path is written
    (relative, ``~``, percent-encoded, a link), or the same PostgreSQL URL whatever its
    password."""
    if a == b:
        return True
    if a.lower().startswith("sqlite:///") and b.lower().startswith("sqlite:///"):
        return _sqlite_file(a) == _sqlite_file(b)
    return _no_password(a) == _no_password(b)


def _no_password(url: str) -> str:
    parts = urlsplit(url)
    if "@" in parts.netloc:
        user, _, host = parts.netloc.rpartition("@")
        parts = parts._replace(netloc=f"{user.partition(':')[0]}@{host}")
    return mask_url(urlunsplit(parts))


def _sqlite_file(url: str) -> str:
    path = unquote(url[len("sqlite:///"):])
    return path if path == ":memory:" else os.path.realpath(os.path.expanduser(path))


def display_url(url: str) -> str:
    """The URL without its password, in any form it was given, for messages."""
    return mask_url(url)
