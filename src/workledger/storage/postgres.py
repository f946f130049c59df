"""PostgreSQL adapter: the scale-out engine. Many workers on many machines share one database.

Concurrent claimers take disjoint chunks with ``FOR UPDATE SKIP LOCKED``; every lease time is the
database's ``now()``. A store holds a small pool of connections (``psycopg_pool``, checked
before use); every port method is one transaction on one of them. A connection that was lost is
replaced; a database that is away is reported as ``DatabaseUnavailable``, which long-lived
processes wait out (``_runtime/patience.py``). Every session has bounded waits
(``SESSION_DEFAULTS``) unless the URL sets its own.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool, PoolTimeout

from workledger.core.text import read_json
from workledger.errors import Contention, DatabaseUnavailable, StorageError, UsageError
from workledger.storage import common, doubt
from workledger.storage.base import LedgerStore
from workledger.storage.dialect import Connection, CountRows
from workledger.storage.holders import new_holder_id
from workledger.storage.port import (
    ClaimedItem,
    ClaimParams,
    IdentityClaim,
    ItemsInsert,
    LeaseParams,
)
from workledger.storage.queries import queries

CONNECT_TIMEOUT = 5
POOL_SIZE = 4  # connections per store: the claim loop, heartbeats, the sweeper, a reader
POOL_WAIT = 3.0  # seconds to wait for a pooled connection before the database counts as away
RECONNECT_FOR = 3600.0  # the pool keeps trying to reconnect for this long
# pg_try_advisory_lock(SWEEPER_LOCK, hashtext(current_schema())): held by the one process of a
# ledger (a database and schema) that sweeps ("wl")
SWEEPER_LOCK = 0x776C
# pg_advisory_lock(HOLDER_LOCK, hashtext(current_schema() || '/' || holder)): held by a worker
# for as long as it runs, on a session of its own ("wh"): its expired leases are taken back
# only once that session is gone (migration 0008)
HOLDER_LOCK = 0x7768
# a holder's session is dropped by the server this long after its worker's host goes silent
# (idle 10 s, then 3 probes 5 s apart), so a partitioned worker's items are not held for hours
_HOLDER_KEEPALIVE = ("SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; "
                     "SET tcp_keepalives_count = 3; SET tcp_user_timeout = 30000")
# Session settings every connection gets unless the URL sets them (in its `options`), so that no
# wait is unbounded: a statement, a lock, a transaction left open, a dead peer.
SESSION_DEFAULTS = {
    "statement_timeout": "60s",
    "lock_timeout": "30s",
    "idle_in_transaction_session_timeout": "60s",
    # JIT compiles small ledger queries for tens of milliseconds when statistics are missing;
    # none of our statements scans enough rows to gain from it
    "jit": "off",
}
CONNECTION_DEFAULTS = {
    "connect_timeout": str(CONNECT_TIMEOUT),  # an unreachable server fails fast
    "keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10",
    "keepalives_count": "3", "tcp_user_timeout": "30000",  # ms: a dead peer found in ~30 s
}
# the NOTIFY channel of new work; the payload is the ledger's schema
WAKE_CHANNEL = "wl_work"
_NOTIFY = "SELECT pg_notify(%s, current_schema())"
# pg_advisory_xact_lock key that serialises concurrent migrate() calls ("wl" + "migr").
MIGRATE_LOCK = 0x776C_6D69_6772
# pg_advisory_xact_lock(DECOMPOSE_LOCK, run_id % 2**31): two decompositions of one run (a
# sweeper and a slow original) write a batch one at a time, so each counts only its new rows.
DECOMPOSE_LOCK = 0x776C_6463

Conn = psycopg.Connection[DictRow]


class _OnePerOutage(logging.Filter):
    """psycopg_pool warns at every failed reconnection attempt; an outage is reported once
    when it starts and once when it ends, by the process that waits it out
    (``_runtime/patience.py``), so those per-attempt lines are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("error connecting in 'workledger'")


logging.getLogger("psycopg.pool").addFilter(_OnePerOutage())
# the server ended the session: shut down, crashed, restarting, or a terminated backend
_SERVER_GONE = (psycopg.errors.AdminShutdown, psycopg.errors.CrashShutdown,
                psycopg.errors.CannotConnectNow, psycopg.errors.IdleSessionTimeout,
                psycopg.errors.IdleInTransactionSessionTimeout)


def _ended(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle holder session was ended by the server: nothing is ever sent to it
    unasked, so a readable socket is the server's goodbye (or EOF). No round trip."""
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


class PostgresStore(LedgerStore[Conn]):
    dialect = "postgres"
    label = "PostgreSQL"
    Q = queries("postgres")
    finish_shapes = 1  # one shape per UPDATE over a sorted id array: rows lock in id order
    json_as_text = False
    # seconds to keep asking whether a COMMIT whose answer was lost happened (a retry layer
    # sets its own outage bound here: _runtime/patience.py)
    doubt_for = doubt.DOUBT_FOR

    def __init__(self, url: str, *, pool_size: int = POOL_SIZE) -> None:
        self.url = url
        self._closed = False
        self._conninfo = session_conninfo(url)
        self._check_reachable()  # the driver's own reason, not a pool timeout, when it is not
        self._pool: ConnectionPool[Conn] = ConnectionPool(
            self._conninfo, min_size=1, max_size=max(pool_size, 1), open=False,
            kwargs={"autocommit": False, "row_factory": dict_row}, configure=_configure,
            check=ConnectionPool.check_connection, timeout=POOL_WAIT, name="workledger",
            reconnect_timeout=RECONNECT_FOR)
        self._pool.open(wait=False)
        self._leader: psycopg.Connection[Any] | None = None
        self._leader_lock = threading.Lock()
        self._leader_scope = ""
        self._holders: dict[str, psycopg.Connection[Any] | None] = {}  # holder_open's sessions
        self._holders_lock = threading.Lock()
        self._listener: psycopg.Connection[Any] | None = None  # LISTENs for new work
        self._listen_lock = threading.Lock()
        self._schema = ""

    # -- plumbing --------------------------------------------------------------------------

    def _where(self) -> str:
        try:
            info = conninfo_to_dict(self.url)
        except psycopg.Error:
            return "(unparsable URL)"
        host = str(info.get("host") or info.get("hostaddr") or "local socket")
        return f"{host}:{info.get('port') or 5432}"

    def _check_reachable(self) -> None:
        try:
            with psycopg.connect(self._conninfo, autocommit=True):
                pass
        except psycopg.Error as exc:
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {self._where()}: {_reason(exc, connecting=True)}"
            ) from exc

    @contextmanager
    def _tx(self) -> Iterator[Conn]:
        """One transaction on a pooled connection (checked before use, replaced when lost):
        committed when the block ends, rolled back when it raises. A connection lost during
        the COMMIT is no failure if the transaction committed (``storage/doubt.py``): the
        block's result stands, and the caller's retry layer does not do the work again."""
        with self._transaction(asks=True) as conn:
            yield conn

    @contextmanager
    def _reader(self) -> Iterator[Conn]:
        """A read is a transaction of its own too; one that wrote nothing needs no answer."""
        with self._transaction(asks=False) as conn:
            yield conn

    @contextmanager
    def _transaction(self, asks: bool) -> Iterator[Conn]:
        if self._closed:
            raise StorageError("PostgreSQL: this store is closed")
        pending: doubt.Pending | None = None
        lost: psycopg.Error | None = None
        try:
            with self._pool.connection() as conn:
                try:
                    yield conn
                    pending = doubt.before_commit(conn) if asks else None
                except BaseException:
                    _rollback(conn)
                    raise
                lost = self._commit(conn, pending)
        except PoolTimeout as exc:
            raise DatabaseUnavailable(
                f"no connection to PostgreSQL at {self._where()} within {POOL_WAIT:g} s "
                "(the server is down, restarting or out of connections)") from exc
        except psycopg.Error as exc:
            raise self._wrap(exc) from exc
        if lost is not None and pending is not None:  # the pooled connection is discarded
            self._settle(pending, lost)

    def _commit(self, conn: Conn, pending: doubt.Pending | None) -> psycopg.Error | None:
        """COMMIT; the error when the connection broke during it after a transaction that
        wrote (its outcome is to be learned), raised when it is any other failure."""
        try:
            conn.commit()
        except psycopg.Error as exc:
            if pending is None or not isinstance(self._wrap(exc), DatabaseUnavailable):
                raise
            return exc
        return None

    def _settle(self, pending: doubt.Pending, lost: psycopg.Error) -> None:
        """Return if the transaction whose COMMIT lost its answer committed; raise the lost
        connection (to be tried again) if it did not, or if that cannot be trusted."""
        committed = doubt.learn(lambda: psycopg.connect(self._conninfo, autocommit=True),
                                pending, self.doubt_for)
        if not committed:
            raise self._wrap(lost) from lost

    def _wrap(self, exc: psycopg.Error) -> Exception:
        """A lost connection or a server going away is an outage, which long-lived processes
        wait out; anything else (a timeout, a deadlock, a constraint) is the statement's."""
        if isinstance(exc, _SERVER_GONE) or (
                isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None):
            return DatabaseUnavailable(
                f"lost the connection to PostgreSQL at {self._where()}: {_reason(exc)}")
        if isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
            return Contention(f"PostgreSQL: {_reason(exc)} (a statement_timeout or "
                              "lock_timeout: see docs/design.md, bounded waits)")
        if isinstance(exc, psycopg.errors.SerializationFailure
                      | psycopg.errors.DeadlockDetected):
            return Contention(f"PostgreSQL: {_reason(exc)}")
        return StorageError(f"PostgreSQL: {_reason(exc)}")

    def _tuples(self, conn: Conn, sql: str, params: dict[str, Any]) -> list[Any]:
        with conn.cursor(row_factory=tuple_row) as cur:
            return cur.execute(sql, params).fetchall()

    def _many(self, conn: Conn, sql: str, rows: Sequence[dict[str, Any]]) -> None:
        with conn.cursor() as cur:
            cur.executemany(sql, rows)

    def _new_runs_rows(self, runs: Sequence[Any]) -> dict[str, Any]:
        return {"jobs": [r.run.job for r in runs], "keys": [r.run.idempotency_key for r in runs],
                "payloads": [r.run.payload for r in runs],
                "tolerates": [r.run.tolerate for r in runs],
                "priorities": [r.run.priority for r in runs],
                "tenants": [r.run.tenant for r in runs],
                "closings": [r.run.closing for r in runs]}

    def _marks_rows(self, marks: list[list[int]]) -> dict[str, Any]:
        return {"run_ids": _ints(m[0] for m in marks), "totals": _ints(m[1] for m in marks),
                "skips": _ints(m[2] for m in marks)}

    def _insert_items_of_runs(self, conn: Conn, batches: Sequence[ItemsInsert]) -> None:
        items = [(b.run_id, b.stage, i) for b in batches for i in b.items]
        conn.execute(self.Q["items_insert_runs"], {
            "run_ids": [r for r, _, _ in items], "stages": [s for _, s, _ in items],
            "seqs": [i.seq for _, _, i in items], "keys": [i.key for _, _, i in items],
            "datas": [i.data for _, _, i in items], "states": [i.state for _, _, i in items],
            "errors": [i.error for _, _, i in items],
            "ckeys": [i.concurrency_key for _, _, i in items]})

    def close(self) -> None:
        self._closed = True
        self.unlead()
        for holder in list(self._holders):
            self.holder_close(holder)
        with self._listen_lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
        self._pool.close()

    # -- one sweeper at a time ---------------------------------------------------------------

    def lead(self, scope: str = "") -> bool:
        """Hold (or take) the sweeper lock of ``scope`` (the jobs a sweeper sweeps) in this
        ledger: a session advisory lock, on a connection of its own, so nothing is written to
        elect the sweeper. False: another process holds it. A lost connection loses the lock;
        the next call tries to take it again."""
        with self._leader_lock:
            if scope != self._leader_scope:
                self._drop_leader()
            self._leader_scope = scope
            conn = self._leader
            if conn is not None and not conn.closed and not conn.broken:
                try:
                    conn.execute("SELECT 1")
                    return True
                except psycopg.Error:
                    conn.close()
            self._leader = None
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True)
                row = conn.execute(
                    "SELECT pg_try_advisory_lock(%s, hashtext(current_schema() || '/' || %s))",
                    (SWEEPER_LOCK, scope)).fetchone()
            except psycopg.Error:
                return False  # the database is away: nobody sweeps until it is back
            if row is not None and row[0]:
                self._leader = conn
                return True
            conn.close()
            return False

    def holder_open(self) -> tuple[str, str] | None:
        """A session advisory lock on a connection of its own, held while the worker runs: an
        expired lease whose holder's session lives (a worker stopped or paused past its lease)
        is not taken back. No file: handler processes do not hold it."""
        holder = new_holder_id()
        with self._holders_lock:
            self._holders[holder] = None
        self._holder_session(holder)
        return holder, ""

    def holder_close(self, holder: str) -> None:
        with self._holders_lock:
            conn = self._holders.pop(holder, None)
        if conn is not None:
            conn.close()  # the session ends: the lock is released

    def _holder_session(self, holder: str) -> None:
        """(Re)take ``holder``'s lock if its session was lost (a restart, a cut): called at
        open and at every claim under it; without it its expired leases are taken back as
        before."""
        with self._holders_lock:
            if holder not in self._holders:
                return
            conn = self._holders[holder]
            if conn is not None and not conn.closed and not conn.broken and not _ended(conn):
                return
            if conn is not None:
                conn.close()
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True)
                conn.execute(_HOLDER_KEEPALIVE)
                conn.execute("SELECT pg_advisory_lock(%s, hashtext(current_schema() || '/' || %s))",
                             (HOLDER_LOCK, holder))
            except psycopg.Error:
                conn = None  # the database is away: the next claim tries again
            self._holders[holder] = conn

    def _reclaim_params(self) -> dict[str, Any]:
        return {"holder_lock": HOLDER_LOCK}

    def items_claim(self, params: ClaimParams) -> list[ClaimedItem]:
        if params.holder is not None:
            self._holder_session(params.holder)
        return super().items_claim(params)

    def items_claim_by_identity(self, params: IdentityClaim) -> list[ClaimedItem]:
        if params.holder is not None:
            self._holder_session(params.holder)
        return super().items_claim_by_identity(params)

    def items_heartbeat(self, params: LeaseParams) -> int:
        """Every renewal first retakes a holder lock whose session was ended (terminated, a
        restart): a worker that runs long handlers claims seldom, and its expired leases are
        taken back only while its lock is gone."""
        with self._holders_lock:
            holders = list(self._holders)
        for holder in holders:
            self._holder_session(holder)
        return super().items_heartbeat(params)

    def unlead(self) -> None:
        with self._leader_lock:
            self._drop_leader()

    def _drop_leader(self) -> None:
        if self._leader is not None:
            self._leader.close()  # the session ends: the lock is released
            self._leader = None

    # -- waking idle workers: LISTEN/NOTIFY ---------------------------------------------------

    wakes_other_processes = True

    def _wake(self, conn: Conn) -> None:
        # delivered when (and only if) the transaction commits, to every listening session
        conn.execute(_NOTIFY, (WAKE_CHANNEL,))

    def wait_for_work(self, timeout: float) -> bool:
        """Block up to ``timeout`` s on a connection of its own that LISTENs for work made
        claimable in this ledger (its schema); nothing is read or written meanwhile."""
        with self._listen_lock:
            conn = self._listener
            if conn is None or conn.closed or conn.broken:
                try:
                    conn = psycopg.connect(self._conninfo, autocommit=True)
                    row = conn.execute("SELECT current_schema()").fetchone()
                    self._schema = str(row[0]) if row else ""
                    conn.execute(f"LISTEN {WAKE_CHANNEL}")
                except psycopg.Error:
                    time.sleep(timeout)  # the database is away: the claim loop finds out
                    return False
                self._listener = conn
            try:
                return any(n.payload == self._schema
                           for n in conn.notifies(timeout=timeout, stop_after=1))
            except psycopg.Error:
                conn.close()
                self._listener = None
                return False

    # -- the caller's connection (submit inside the caller's transaction) -----------------

    @contextmanager
    def _foreign_tx(self, conn: Any) -> Iterator[Connection]:
        if not isinstance(conn, psycopg.Connection):
            raise UsageError("this ledger is PostgreSQL: pass a psycopg (3) connection to its "
                             f"database, not a {common.kind_of(conn)}")
        _check_open_transaction(conn)
        theirs = _DictRows(conn)
        try:
            conn.execute("SAVEPOINT wl_submit")  # begins the caller's transaction if need be
        except psycopg.Error as exc:
            raise self._wrap(exc) from exc
        try:
            self._check_same_ledger(theirs)
            yield theirs
            theirs.execute(_NOTIFY, (WAKE_CHANNEL,))  # delivered when the caller commits
            conn.execute("RELEASE SAVEPOINT wl_submit")
        except BaseException as exc:
            try:
                conn.execute("ROLLBACK TO SAVEPOINT wl_submit")
                conn.execute("RELEASE SAVEPOINT wl_submit")
            except psycopg.Error:
                pass  # the connection is gone, and the caller's transaction with it
            if isinstance(exc, psycopg.Error):
                raise self._wrap(exc) from exc
            raise

    def _identity(self, conn: Connection) -> tuple[tuple[Any, ...], str]:
        r = self._first(conn.execute(self.Q["ledger_identity"], {}).fetchall())
        started = r["server_started"]
        key = (r["database_oid"], r["runs_table"], r["schema"],
               None if started is None else started.timestamp())
        where = f"database {r['database']!r}, schema {r['schema']!r}"
        if r["runs_table"] is None:
            where += " (whose search_path names no wl_runs table)"
        return key, where

    # -- schema ----------------------------------------------------------------------------

    def _versions(self, conn: Conn) -> set[int]:
        # a migration may count every item of the ledger (0002): no statement or lock limit
        conn.execute("SET LOCAL statement_timeout = 0")
        conn.execute("SET LOCAL lock_timeout = 0")
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

    def _lease_token_taken(self, conn: Conn) -> None:
        return None  # nextval ran inside items_claim, only for a claim that found rows

    def _add_counts(self, conn: Conn, rows: CountRows) -> None:
        if rows:
            conn.execute(self.Q["counts_add"], {"run_ids": _ints(r[0] for r in rows),
                                                "stages": [r[1] for r in rows],
                                                "states": [r[2] for r in rows],
                                                "ns": [r[3] for r in rows]})

    def _item_rows(self, params: ItemsInsert) -> dict[str, Any]:
        items = params.items
        return {
            "run_id": params.run_id, "stage": params.stage,
            "seqs": [i.seq for i in items], "keys": [i.key for i in items],
            "datas": [i.data for i in items], "states": [i.state for i in items],
            "errors": [i.error for i in items],
            "ckeys": [i.concurrency_key for i in items],
        }

    def _lock_decomposition(self, conn: Conn, run_id: int) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (DECOMPOSE_LOCK, run_id % 2**31))

    def _insert_items(self, conn: Conn, rows: dict[str, Any]) -> int:
        return conn.execute(self.Q["items_insert"], rows).rowcount

    # -- parameters and values: arrays, seconds as floats, rows decoded by psycopg ---------

    def _list(self, values: Iterable[Any]) -> list[Any] | str:
        """Sorted (id order: two transactions lock shared rows in one order). Whole numbers go
        as one array literal, which the statement casts (``::bigint[]``): psycopg dumps a list
        element by element in Python, about 8x slower for a chunk's 500 ids."""
        ordered = sorted(values)
        if ordered and type(ordered[0]) is int:  # sorted: a list of ints has no str in it
            return _ints(ordered)
        return ordered

    def _row_set(self, rows: list[list[Any]], names: Sequence[str]) -> dict[str, Any]:
        return _columns(rows, names)

    def _handoff_rows(self, handoffs: list[list[Any]]) -> dict[str, Any]:
        return {"ids": [h[0] for h in handoffs], "stages": [h[1] for h in handoffs]}

    def _units_rows(self, rows: list[list[Any]]) -> dict[str, Any]:
        # parallel columns: in the rows' order, not sorted one by one
        return {"run_ids": _ints(r[0] for r in rows),
                **{u: _ints(r[i] for r in rows)
                   for i, u in enumerate(("processed", "failed", "skipped"), 1)}}

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

    @staticmethod
    def _at(value: datetime) -> datetime:
        return value

    @staticmethod
    def _time(value: datetime | None) -> datetime | None:
        return None if value is None else value.astimezone(UTC)


# -- helpers ---------------------------------------------------------------------------------


class _DictRows:
    """The caller's psycopg connection, its rows read by column name through cursors of our
    own: its own row factory and loaders are left as they are."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Any = None, /) -> psycopg.Cursor[DictRow]:
        return self.conn.cursor(row_factory=dict_row).execute(sql, params)


def _check_open_transaction(conn: psycopg.Connection[Any]) -> None:
    """The caller's connection must be in a transaction it will end: one in autocommit mode
    outside a transaction, or whose transaction already failed, is refused."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise UsageError("the connection's transaction has failed already: roll it back; "
                         "nothing was recorded")
    if status == TransactionStatus.IDLE and conn.autocommit:
        raise UsageError("the connection is in autocommit mode, outside any transaction: begin "
                         "one first (conn.transaction(), or Django's transaction.atomic()), so "
                         "that the run is recorded only if it commits")
    if status not in (TransactionStatus.IDLE, TransactionStatus.INTRANS):
        raise UsageError(f"the connection is not ready for a statement ({status.name.lower()})")



def session_conninfo(url: str) -> str:
    """``url`` with the defaults of :data:`CONNECTION_DEFAULTS` and :data:`SESSION_DEFAULTS`
    for whatever it does not set itself (``?statement_timeout`` is not a libpq key: a URL
    overrides a session setting in ``options``, e.g. ``options=-cstatement_timeout%3D5min``)."""
    try:
        given = conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise DatabaseUnavailable(f"bad PostgreSQL URL: {_reason(exc)}") from exc
    extra: dict[str, Any] = {k: v for k, v in CONNECTION_DEFAULTS.items() if k not in given}
    # a URL without options leaves them to PGOPTIONS, which libpq ignores once we set any
    options = str(given.get("options") or os.environ.get("PGOPTIONS") or "")
    added = [f"-c {k}={v}" for k, v in SESSION_DEFAULTS.items() if k not in options]
    if added:
        extra["options"] = " ".join(filter(None, [options, *added]))
    return make_conninfo(url, **extra) if extra else url


def _configure(conn: Conn) -> None:
    """Every pooled connection: JSON too deep to decode is shown, not fatal."""
    set_json_loads(read_json, conn)


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


def _ints(values: Iterable[int]) -> str:
    """Whole numbers as one array literal, in the order given (the statement casts it)."""
    return "{" + ",".join(map(str, values)) + "}"
