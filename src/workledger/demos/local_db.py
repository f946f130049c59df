"""A demo's own side database (the downstream system, the HR store, the mail sink's record):
a SQLite file in WAL mode with one connection per thread, its schema created on first use."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path


class LocalDb:
    def __init__(self, path: str | Path, schema: str) -> None:
        self.path = Path(path)
        self.schema = schema
        self._local = threading.local()

    def conn(self) -> sqlite3.Connection:
        """This thread's connection (WAL survives a killed process; NORMAL is enough here)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(self.schema)
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close this thread's connection, if it has one."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
