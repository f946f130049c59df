"""Where a cell's data lives, and "the limit" that runs on it.

* ``SqliteBackend`` and ``PostgresBackend`` give every cell a fresh database (``fresh()``
  yields its URL): a new SQLite file in a temporary folder on disk, or a new PostgreSQL
  database ``wl_bench_<tag>_<n>`` created from the admin URL and dropped right after the cell.
  ``ceiling.py`` uses them too.
* The raw-SQL loop, "the limit": a minimal hand-written table and a claim / no-op / guarded
  UPDATE loop doing the same durable work as workledger. Its functions have the shapes of a
  system in ``systems.py``: ``raw_insert`` (load), ``raw_prepare`` and ``raw_drain`` (in a
  worker process), ``raw_verify``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

DEFAULT_PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
INSERT_BATCH = 5000  # workledger._runtime.decompose.BATCH: the raw twin uses the same batches


# =============================================================================================
# A fresh database per cell
# =============================================================================================


class SqliteBackend:
    name = "sqlite"

    def __init__(self, tmpdir: str | None) -> None:
        self.root = tempfile.mkdtemp(prefix="wl_bench_", dir=tmpdir)
        self.n = 0

    @contextlib.contextmanager
    def fresh(self) -> Iterator[str]:
        self.n += 1
        folder = os.path.join(self.root, f"cell{self.n}")
        os.makedirs(folder)
        try:
            yield "sqlite:///" + os.path.join(folder, "bench.db")  # absolute: sqlite:////...
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def describe(self) -> str:
        fs = _fstype(self.root)
        return f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=FULL) in {self.root} [{fs}]"


class PostgresBackend:
    name = "postgres"

    def __init__(self, admin_url: str) -> None:
        import psycopg

        self.admin_url = admin_url
        self.tag = f"wl_bench_{uuid.uuid4().hex[:8]}"
        self.n = 0
        self.admin = psycopg.connect(admin_url, autocommit=True, connect_timeout=5)
        self.created: list[str] = []

    @contextlib.contextmanager
    def fresh(self) -> Iterator[str]:
        self.n += 1
        name = f"{self.tag}_{self.n}"
        self.admin.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        try:
            yield urlunsplit(urlsplit(self.admin_url)._replace(path="/" + name))
        finally:
            self._drop(name)

    def _drop(self, name: str) -> None:
        self.admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.created:
            self.created.remove(name)

    def close(self) -> None:
        for name in list(self.created):
            with contextlib.suppress(Exception):
                self._drop(name)
        self.admin.close()

    def describe(self) -> str:
        row = self.admin.execute("SHOW server_version").fetchone()
        settings: dict[str, str] = dict(self.admin.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('fsync', 'synchronous_commit', 'autovacuum', 'shared_buffers')").fetchall())
        where = urlsplit(self.admin_url)
        return (f"PostgreSQL {row[0] if row else '?'} at {where.hostname}:{where.port or 5432} "
                f"(fsync={settings.get('fsync')}, synchronous_commit="
                f"{settings.get('synchronous_commit')}, autovacuum={settings.get('autovacuum')},"
                f" shared_buffers={settings.get('shared_buffers')}x8kB), databases {self.tag}_*")


def _fstype(path: str) -> str:
    best, fstype = "", "?"
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        real = os.path.realpath(path)
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            mount = parts[1]
            inside = real == mount or real.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best):
                best, fstype = mount, f"{parts[2]} on {parts[0]}"
    return fstype


# =============================================================================================
# The limit: a minimal hand-written raw-SQL loop
# =============================================================================================

RAW_SQLITE_SCHEMA = """
CREATE TABLE q (
    id          INTEGER PRIMARY KEY,
    seq         INTEGER NOT NULL,
    key         TEXT,
    state       TEXT NOT NULL DEFAULT 'pending',
    lease_token INTEGER,
    lease_until TEXT,
    result      TEXT
);
CREATE INDEX q_pending ON q (id) WHERE state = 'pending';
CREATE TABLE q_token (v INTEGER NOT NULL);
INSERT INTO q_token VALUES (0);
"""

RAW_SQLITE_CLAIM = """
UPDATE q SET state = 'claimed', lease_token = :token,
    lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', '+30 seconds')
WHERE id IN (SELECT id FROM q WHERE state = 'pending' AND id > :after ORDER BY id LIMIT :limit)
RETURNING id, key
"""

RAW_SQLITE_FINISH = """
UPDATE q SET state = 'processed', result = 'null', lease_until = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND lease_token = :token AND state = 'claimed'
"""

RAW_PG_SCHEMA = """
CREATE TABLE q (
    id          bigserial PRIMARY KEY,
    seq         integer NOT NULL,
    key         text,
    state       text NOT NULL DEFAULT 'pending',
    lease_token bigint,
    lease_until timestamptz,
    result      jsonb
);
CREATE INDEX q_pending ON q (id) WHERE state = 'pending';
CREATE SEQUENCE q_token;
"""

RAW_PG_CLAIM = """
WITH c AS (
    SELECT id FROM q WHERE state = 'pending' AND id > %(after)s ORDER BY id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), t AS (SELECT nextval('q_token') AS v)
UPDATE q SET state = 'claimed', lease_token = t.v, lease_until = now() + interval '30 seconds'
FROM c, t WHERE q.id = c.id
RETURNING q.id, q.key, q.lease_token
"""

RAW_PG_FINISH = """
UPDATE q SET state = 'processed', result = 'null'::jsonb, lease_until = NULL
WHERE id = ANY(%(ids)s) AND lease_token = %(token)s AND state = 'claimed'
"""


def _raw_noop(item_id: int, key: str | None) -> None:
    return None


def _sqlite_path(url: str) -> str:
    return url[len("sqlite:///"):]


def _sqlite_connect(url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(_sqlite_path(url), timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


def raw_insert(url: str, items: int) -> tuple[float, int, dict[str, Any]]:
    rows = ((i, str(i)) for i in range(items))
    if url.startswith("sqlite"):
        conn = _sqlite_connect(url)
        conn.executescript(RAW_SQLITE_SCHEMA)
        t = time.perf_counter()
        while batch := [r for _, r in zip(range(INSERT_BATCH), rows, strict=False)]:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO q (seq, key) VALUES (?, ?)", batch)
            conn.execute("COMMIT")
        seconds = time.perf_counter() - t
        conn.close()
        return seconds, 0, {}
    import psycopg

    with psycopg.connect(url) as pg:
        pg.execute(RAW_PG_SCHEMA)
        pg.commit()
        t = time.perf_counter()
        while batch := [r for _, r in zip(range(INSERT_BATCH), rows, strict=False)]:
            with pg.cursor() as cur, cur.copy("COPY q (seq, key) FROM STDIN") as copy:
                for r in batch:
                    copy.write_row(r)
            pg.commit()
        seconds = time.perf_counter() - t
    return seconds, 0, {}


def raw_prepare(url: str, chunk: int) -> Any:
    if url.startswith("sqlite"):
        return _sqlite_connect(url)
    import psycopg

    return psycopg.connect(url)


def raw_drain_sqlite(url: str, chunk: int, conn: sqlite3.Connection
                     ) -> tuple[int, float, dict[str, Any]]:
    done, last, after, chunks = 0, 0.0, 0, 0
    while True:
        conn.execute("BEGIN IMMEDIATE")
        token = conn.execute("UPDATE q_token SET v = v + 1 RETURNING v").fetchone()[0]
        rows = conn.execute(RAW_SQLITE_CLAIM,
                            {"token": token, "after": after, "limit": chunk}).fetchall()
        conn.execute("COMMIT")
        if not rows:
            if after == 0:
                break
            after = 0  # one sweep from the start, as workledger's cursor does
            continue
        for item_id, key in rows:
            _raw_noop(item_id, key)
        ids = [r[0] for r in rows]
        after = max(ids)
        conn.execute("BEGIN IMMEDIATE")
        cur = conn.execute(RAW_SQLITE_FINISH, {"ids": json.dumps(ids), "token": token})
        conn.execute("COMMIT")
        done += cur.rowcount
        chunks += 1
        last = time.monotonic()
    conn.close()
    return done, last, {"chunks": chunks}


def raw_drain_pg(url: str, chunk: int, conn: Any) -> tuple[int, float, dict[str, Any]]:
    done, last, after, chunks = 0, 0.0, 0, 0
    while True:
        rows = conn.execute(RAW_PG_CLAIM, {"after": after, "limit": chunk}).fetchall()
        conn.commit()
        if not rows:
            if after == 0:
                break
            after = 0
            continue
        for item_id, key, _token in rows:
            _raw_noop(item_id, key)
        ids = [r[0] for r in rows]
        after = max(ids)
        cur = conn.execute(RAW_PG_FINISH, {"ids": ids, "token": rows[0][2]})
        conn.commit()
        done += cur.rowcount
        chunks += 1
        last = time.monotonic()
    conn.close()
    return done, last, {"chunks": chunks}


def raw_drain(url: str, chunk: int, conn: Any) -> tuple[int, float, dict[str, Any]]:
    if url.startswith("sqlite"):
        return raw_drain_sqlite(url, chunk, conn)
    return raw_drain_pg(url, chunk, conn)


def raw_verify(url: str, run_id: int, items: int) -> None:
    if url.startswith("sqlite"):
        conn = _sqlite_connect(url)
        n = conn.execute("SELECT count(*) FROM q WHERE state = 'processed'").fetchone()[0]
        conn.close()
    else:
        import psycopg

        with psycopg.connect(url) as pg:
            row = pg.execute("SELECT count(*) FROM q WHERE state = 'processed'").fetchone()
            n = row[0] if row else 0
    if n != items:
        raise RuntimeError(f"raw loop processed {n} rows, expected {items}")
