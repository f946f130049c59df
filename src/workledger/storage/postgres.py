"""PostgreSQL adapter: the scale-out engine. Many workers on many machines share one database.

Concurrent claimers take disjoint chunks with ``FOR UPDATE SKIP LOCKED``; every lease time is the
database's ``now()``. One connection per store, used under a lock; every port method is one
transaction. A connection that was lost is replaced on the next call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg.types.json import set_json_loads

from workledger.core.text import read_json
from workledger.errors import DatabaseUnavailable, StorageError
from workledger.storage.base import LedgerStore
from workledger.storage.dialect import CountRows
from workledger.storage.port import ItemsInsert
from workledger.storage.queries import queries

CONNECT_TIMEOUT = 5
# pg_advisory_xact_lock key that serialises concurrent migrate() calls ("wl" + "migr").
MIGRATE_LOCK = 0x776C_6D69_6772
# pg_advisory_xact_lock(DECOMPOSE_LOCK, run_id % 2**31): two decompositions of one run (a
# sweeper and a slow original) write a batch one at a time, so each counts only its new rows.
DECOMPOSE_LOCK = 0x776C_6463

Conn = psycopg.Connection[DictRow]


class PostgresStore(LedgerStore[Conn]):
    dialect = "postgres"
    label = "PostgreSQL"
    Q = queries("postgres")
    finish_shapes = 1  # one shape per UPDATE over a sorted id array: rows lock in id order
    json_as_text = False

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.RLock()
        self._closed = False
        self._conn: Conn = self._connect()

    # -- plumbing --------------------------------------------------------------------------

    def _where(self) -> str:
        try:
            info = conninfo_to_dict(self.url)
        except psycopg.Error:
            return "(unparsable URL)"
        host = str(info.get("host") or info.get("hostaddr") or "local socket")
        return f"{host}:{info.get('port') or 5432}"

    def _connect(self) -> Conn:
        try:
            given = conninfo_to_dict(self.url)
        except psycopg.Error as exc:
            raise DatabaseUnavailable(f"bad PostgreSQL URL: {_reason(exc)}") from exc
        conninfo = self.url
        if "connect_timeout" not in given:  # an unreachable server fails fast
            conninfo = make_conninfo(self.url, connect_timeout=CONNECT_TIMEOUT)
        try:
            conn = psycopg.connect(conninfo, autocommit=False, row_factory=dict_row)
            set_json_loads(read_json, conn)  # a row too deep to decode is shown, not fatal
            # JIT compiles small ledger queries for tens of milliseconds when statistics are
            # missing; none of our statements scans enough rows to gain from it
            conn.execute("SET jit = off")
            conn.commit()
            return conn
        except psycopg.Error as exc:
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {self._where()}: {_reason(exc, connecting=True)}"
            ) from exc

    def _live(self) -> Conn:
        if self._closed:
            raise StorageError("PostgreSQL: this store is closed")
        if self._conn.closed:  # lost (server restart, killed session): start afresh
            self._conn = self._connect()
        return self._conn

    def _wrap(self, exc: psycopg.Error) -> Exception:
        if self._conn.broken or self._conn.closed:
            return DatabaseUnavailable(
                f"lost the connection to PostgreSQL at {self._where()}: {_reason(exc)}"
            )
        return StorageError(f"PostgreSQL: {_reason(exc)}")

    @contextmanager
    def _tx(self) -> Iterator[Conn]:
        """One transaction: committed when the block ends, rolled back when it raises."""
        with self._lock:
            conn = self._live()
            try:
                yield conn
                conn.commit()
            except BaseException as exc:
                _rollback(conn)
                if isinstance(exc, psycopg.Error):
                    raise self._wrap(exc) from exc
                raise

    _reader = _tx  # a read is a transaction of its own too

    def _tuples(self, conn: Conn, sql: str, params: dict[str, Any]) -> list[Any]:
        with conn.cursor(row_factory=tuple_row) as cur:
            return cur.execute(sql, params).fetchall()

    def _many(self, conn: Conn, sql: str, rows: Sequence[dict[str, Any]]) -> None:
        with conn.cursor() as cur:
            cur.executemany(sql, rows)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._conn.close()

    # -- schema ----------------------------------------------------------------------------

    def _versions(self, conn: Conn) -> set[int]:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS wl_schema_version ("
            " version integer PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        return {r["version"] for r in conn.execute("SELECT version FROM wl_schema_version")}

    def _apply(self, conn: Conn, version: int, sql: str) -> None:
        conn.execute(sql)  # no parameters: psycopg sends the whole file at once
        conn.execute("INSERT INTO wl_schema_version (version) VALUES (%s)", (version,))

    def schema_version(self) -> int:
        with self._tx() as conn:
            found = conn.execute("SELECT to_regclass('wl_schema_version') IS NOT NULL AS ok")
            if not self._first(found.fetchall())["ok"]:
                return 0
            row = self._first(conn.execute("SELECT max(version) AS v FROM wl_schema_version")
                              .fetchall())
        return int(row["v"] or 0)

    # -- statements ------------------------------------------------------------------------

    def _lease_token(self, conn: Conn) -> dict[str, Any]:
        return {}  # items_claim takes its token from wl_lease_token_seq in the statement

    def _add_counts(self, conn: Conn, run_id: int, rows: CountRows) -> None:
        if rows:
            conn.execute(self.Q["counts_add"], {"run_id": run_id, "stages": [r[1] for r in rows],
                                                "states": [r[2] for r in rows],
                                                "ns": [r[3] for r in rows]})

    def _item_rows(self, params: ItemsInsert) -> dict[str, Any]:
        items = params.items
        return {
            "run_id": params.run_id, "stage": params.stage,
            "seqs": [i.seq for i in items], "keys": [i.key for i in items],
            "datas": [i.data for i in items], "states": [i.state for i in items],
            "errors": [i.error for i in items],
        }

    def _lock_decomposition(self, conn: Conn, run_id: int) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (DECOMPOSE_LOCK, run_id % 2**31))

    def _insert_items(self, conn: Conn, rows: dict[str, Any]) -> int:
        return conn.execute(self.Q["items_insert"], rows).rowcount

    # -- parameters and values: arrays, seconds as floats, rows decoded by psycopg ---------

    def _list(self, values: Iterable[Any]) -> list[Any]:
        return sorted(values)  # id order: two transactions lock shared rows in one order

    def _row_set(self, rows: list[list[Any]], names: Sequence[str]) -> dict[str, Any]:
        return _columns(rows, names)

    def _handoff_rows(self, handoffs: list[list[Any]]) -> dict[str, Any]:
        return {"ids": [h[0] for h in handoffs], "stages": [h[1] for h in handoffs]}

    def _lease(self, seconds: float) -> float:
        return float(seconds)

    def _ago(self, seconds: float) -> float:
        return float(seconds)

    @staticmethod
    def _json(value: Any) -> Any:
        return value  # jsonb arrives decoded

    @staticmethod
    def _ts(value: datetime | None) -> str | None:
        return None if value is None else PostgresStore._ts_req(value)

    @staticmethod
    def _ts_req(value: datetime) -> str:
        """UTC, fixed width, so the strings sort like the times they name."""
        return value.astimezone(UTC).isoformat(sep=" ", timespec="microseconds")


# -- helpers ---------------------------------------------------------------------------------


def _reason(exc: BaseException, connecting: bool = False) -> str:
    """The driver's message as one line: 'connection refused', 'database "x" does not exist'."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    if connecting:  # 'connection failed: connection to server at "h", port 1 failed: <why>'
        text = text.rsplit(" failed: ", 1)[-1]
    for prefix in ("FATAL:", "ERROR:"):
        text = text.removeprefix(prefix).strip()
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        text = text[0].lower() + text[1:]  # 'Connection refused' -> 'connection refused'
    return text


def _rollback(conn: Conn) -> None:
    if conn.closed:
        return
    try:
        conn.rollback()
    except psycopg.Error:
        pass  # the connection is gone; the server rolls the transaction back


def _columns(rows: list[list[Any]], names: Sequence[str]) -> dict[str, Any]:
    """Rows (id first) to parallel arrays for ``unnest``, in id order so that two transactions
    moving the same items lock them in the same order; delays as floats (one array type)."""
    rows = sorted(rows, key=lambda row: int(row[0]))
    columns = {name: [row[i] for row in rows] for i, name in enumerate(names)}
    columns["delays"] = [None if d is None else float(d) for d in columns["delays"]]
    return columns
