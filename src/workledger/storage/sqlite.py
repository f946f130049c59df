"""SQLite adapter: the embedded default. One writer at a time under ``BEGIN IMMEDIATE``.

WAL mode with ``synchronous=FULL`` so no acknowledged commit is lost on power failure. The
write-ahead log is kept under ``WAL_LIMIT`` whenever no reader holds an old snapshot: see
``SqliteStore._trim_wal``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workledger.errors import Contention, DatabaseUnavailable, StorageError, UsageError
from workledger.storage import common
from workledger.storage.base import LedgerStore
from workledger.storage.dialect import Connection, CountRows
from workledger.storage.holders import HolderFile, look
from workledger.storage.port import ItemsInsert
from workledger.storage.queries import queries

MIN_VERSION = (3, 35, 0)
# The write-ahead log's bound in bytes once no reader holds an old snapshot: its
# journal_size_limit, and the size past which a commit or an idle worker truncates it. SQLite's
# own checkpoints (every 1,000 pages, about 4 MiB) keep it below this while nothing holds them
# up; a reader's long transaction does, and the log then grows with every write meanwhile.
WAL_LIMIT = 8 * 1024 * 1024
WAL_LOOK_EVERY = 1.0  # seconds between two looks at the log's size by one connection

log = logging.getLogger("workledger.storage")


def check_version(version: str = sqlite3.sqlite_version) -> None:
    parts = tuple(int(p) for p in version.split(".")[:3])
    if parts < MIN_VERSION:
        raise DatabaseUnavailable(
            f"SQLite {version} is too old: workledger needs 3.35 or newer (RETURNING, UPDATE FROM)"
        )


def _read_only(path: str) -> str | None:
    """Why a database cannot be opened for writing, if its folder is the reason: a ledger in
    WAL mode writes beside its file (``-wal``, ``-shm``), even to read."""
    if path == ":memory:":
        return None
    parent = Path(path).resolve().parent
    try:
        if os.statvfs(parent).f_flag & os.ST_RDONLY:
            return (f"{parent} is on a read-only file system: make it writable, then run the "
                    "command again")
    except OSError:
        return None
    if not os.access(parent, os.W_OK):
        return (f"the folder {parent} is not writable (SQLite writes its -wal and -shm files "
                "beside the ledger): make it writable, then run the command again")
    return None


# idle workers of this process wait on the event of their database file; SQLite has no way to
# tell other processes, which find new work at their next poll
_WAKE: dict[str, threading.Event] = {}
_WAKE_LOCK = threading.Lock()


def _wake_event(path: str) -> threading.Event:
    key = path if path == ":memory:" else str(Path(path).resolve())
    with _WAKE_LOCK:
        return _WAKE.setdefault(key, threading.Event())


class _Rows:
    """The caller's sqlite3 connection, its rows read by column name through cursors of our
    own: its own ``row_factory`` is left as it is."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Any = (), /) -> sqlite3.Cursor:
        cur = self.conn.cursor()
        cur.row_factory = sqlite3.Row
        return cur.execute(sql, params)


def _begin(conn: sqlite3.Connection) -> None:
    """Make sure the caller's connection is in a transaction, which the caller ends. One that
    commits every statement by itself (autocommit, outside a transaction) is refused."""
    if conn.in_transaction:
        return
    if conn.isolation_level is None or getattr(conn, "autocommit", None) is True:
        raise UsageError("the connection is in autocommit mode, outside any transaction: begin "
                         "one first (BEGIN, or Django's transaction.atomic()), so that the run "
                         "is recorded only if it commits")
    # what sqlite3 itself would do before the first write: the caller commits it
    conn.execute(f"BEGIN {conn.isolation_level}")


def _create_private(path: str) -> None:
    """A new ledger file is its owner's only (0600, whatever the umask): it holds payloads and
    results. SQLite gives the -wal and -shm files it makes the database file's mode."""
    with suppress(OSError):  # it exists (kept as it is), or sqlite3 says below why not
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


class SqliteStore(LedgerStore[sqlite3.Connection]):
    dialect = "sqlite"
    label = "SQLite"
    Q = queries("sqlite")
    finish_shapes = 4  # up to this many distinct outcomes in a chunk: one guarded UPDATE each
    json_as_text = True

    def __init__(self, path: str, *, timeout: float = 60.0) -> None:
        check_version()
        self.path = path
        # resolved once, here: a handler that changes the working directory later must not
        # make this process look for its holders elsewhere (storage/holders.py)
        self._real = os.path.realpath(path) if path != ":memory:" else path
        if path != ":memory:":
            parent = Path(path).resolve().parent  # open_store expanded ~ already
            if not parent.is_dir():
                raise DatabaseUnavailable(f"cannot open SQLite database {path}: no folder {parent}")
            _create_private(path)
        try:
            self._conn = sqlite3.connect(
                path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            self._conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")
        except sqlite3.Error as exc:
            raise DatabaseUnavailable(f"cannot open SQLite database {path}: "
                                      f"{_read_only(path) or exc}") from exc
        self._lock = threading.RLock()
        self._lead_fd: int | None = None
        self._holders: dict[str, HolderFile] = {}
        self._lead_scope = ""
        self._work = _wake_event(path)
        self._wake_on_commit = False
        self._busy_ms = int(timeout * 1000)
        self._wal = None if path == ":memory:" else path + "-wal"
        self._wal_look_at = 0.0

    # -- connection and transactions -------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with the write lock up front (no upgrade deadlocks)."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._error(exc, "cannot begin a transaction: ") from exc
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException as exc:
                self._wake_on_commit = False
                self._rollback()
                if isinstance(exc, sqlite3.Error):
                    raise self._error(exc) from exc
                raise
            if self._wake_on_commit:
                self._wake_on_commit = False
                self._work.set()

    def _trim_wal(self) -> None:
        """Truncate the write-ahead log if it grew past ``WAL_LIMIT``: while a worker waits for
        work, at most once a second (not after every commit: a TRUNCATE checkpoint in the
        middle of a drain cost it a quarter of its speed; while it drains, SQLite's own
        checkpoints and ``journal_size_limit`` keep the log bounded). A reader's long transaction
        makes it grow (SQLite cannot reuse frames a snapshot may still read), and it would keep
        that size for as long as any connection stays open. The checkpoint never waits (busy
        timeout 0): while such a reader still holds its snapshot it copies what it can and
        the next look tries again."""
        now = time.monotonic()
        if self._wal is None or now < self._wal_look_at:
            return
        self._wal_look_at = now + WAL_LOOK_EVERY
        try:
            if os.stat(self._wal).st_size <= WAL_LIMIT:
                return
        except OSError:
            return  # no log (yet, or any more)
        with self._lock:
            try:
                self._conn.execute("PRAGMA busy_timeout=0")
                try:
                    self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                finally:
                    self._conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            except sqlite3.Error:
                pass  # another checkpoint or a writer holds it: the next look tries again

    def _rollback(self) -> None:
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # a full disk can refuse even that; SQLite rolls back on the next open

    def _wake(self, conn: sqlite3.Connection) -> None:
        self._wake_on_commit = True  # set once it commits: a read before would not see it

    def wait_for_work(self, timeout: float) -> bool:
        self._trim_wal()  # an idle worker writes nothing: the log a long reader left shrinks
        woke = self._work.wait(timeout)
        if woke:
            self._work.clear()
        return woke

    # -- the caller's connection (submit inside the caller's transaction) -----------------

    @contextmanager
    def _foreign_tx(self, conn: Any) -> Iterator[Connection]:
        if not isinstance(conn, sqlite3.Connection):
            raise UsageError(f"this ledger is the SQLite file {self.path}: pass a sqlite3 "
                             f"connection to it, not a {common.kind_of(conn)}")
        theirs = _Rows(conn)
        try:
            self._check_same_ledger(theirs)
            _begin(conn)
            conn.execute("SAVEPOINT wl_submit")
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        try:
            yield theirs
        except BaseException as exc:
            try:
                conn.execute("ROLLBACK TO wl_submit")
                conn.execute("RELEASE wl_submit")  # inside the caller's transaction: no commit
            except sqlite3.Error:
                pass  # the caller's transaction is gone with it
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc) from exc
            raise
        try:
            conn.execute("RELEASE wl_submit")
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _identity(self, conn: Connection) -> tuple[tuple[Any, ...], str]:
        row = conn.execute(self.Q["ledger_identity"], {}).fetchone()
        file = str(row[0] or "") if row is not None else ""
        if not file:  # in memory, or a temporary file: no other connection shares it
            return ("", id(conn)), "an in-memory or temporary database"
        return (os.path.realpath(file),), f"the file {file}"

    def _error(self, exc: sqlite3.Error, doing: str = "") -> StorageError:
        """A busy or locked database (past the busy timeout) is contention, tried again by
        long-lived processes; anything else is the statement's."""
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return Contention(self._reason(exc, doing))
        return StorageError(self._reason(exc, doing))

    def _reason(self, exc: sqlite3.Error, doing: str = "") -> str:
        """One line a person can act on; nothing acknowledged was lost in either case."""
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code == sqlite3.SQLITE_FULL:
            return (f"SQLite: {self.path} cannot grow: the disk is full (or the ledger reached "
                    "its size limit); nothing already written is lost: free space, then run "
                    "the command again")
        if code == sqlite3.SQLITE_READONLY:
            return (f"SQLite: {self.path} is read-only (the file, its folder or the file "
                    "system): make it writable, then run the command again")
        return f"SQLite: {doing}{exc}"

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        """A read outside any transaction: one statement is one snapshot, and takes no lock."""
        with self._lock:
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise self._error(exc) from exc

    def _tuples(self, conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> list[Any]:
        """Plain tuples, not sqlite3.Row: cheaper where a statement returns a row per item."""
        cur = conn.cursor()
        cur.row_factory = None
        return cur.execute(sql, params).fetchall()

    def _many(self, conn: sqlite3.Connection, sql: str, rows: Sequence[dict[str, Any]]) -> None:
        conn.executemany(sql, rows)

    def _new_runs_rows(self, runs: Sequence[Any]) -> dict[str, Any]:
        return {"rows": json.dumps([[r.run.job, r.run.idempotency_key, r.run.payload,
                                     r.run.tolerate, r.run.priority, r.run.tenant, r.run.closing]
                                    for r in runs])}

    def _marks_rows(self, marks: list[list[int]]) -> dict[str, Any]:
        return {"rows": json.dumps(marks)}

    def _insert_items_of_runs(self, conn: sqlite3.Connection,
                              batches: Sequence[ItemsInsert]) -> None:
        conn.executemany(self.Q["items_insert_runs"], [row for b in batches
                                                       for row in self._item_rows(b)])

    def close(self) -> None:
        self.unlead()
        for holder in list(self._holders):
            self.holder_close(holder)
        with self._lock:
            self._conn.close()

    # -- one sweeper at a time ---------------------------------------------------------------

    def lead(self, scope: str = "") -> bool:
        """Hold (or take) the sweeper lock of ``scope`` (the jobs a sweeper sweeps): an OS lock
        on a file beside the database (``<db>.sweeper``, or ``<db>.sweeper-<hash of scope>``),
        so nothing is written to the ledger to elect the sweeper. False: another process holds
        it."""
        if self.path == ":memory:":
            return True
        with self._lock:
            if scope != self._lead_scope:
                self._drop_lead()
            self._lead_scope = scope
            if self._lead_fd is not None:
                return True
            suffix = f"-{hashlib.sha1(scope.encode()).hexdigest()[:12]}" if scope else ""
            try:
                fd = os.open(f"{self.path}.sweeper{suffix}", os.O_CREAT | os.O_RDWR, 0o644)
            except OSError:
                return False  # a read-only folder: sweep by hand
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return False
            self._lead_fd = fd
            return True

    def unlead(self) -> None:
        with self._lock:
            self._drop_lead()

    def _drop_lead(self) -> None:
        if self._lead_fd is not None:
            os.close(self._lead_fd)  # closing releases the lock
            self._lead_fd = None

    # -- holders whose life the OS tells (storage/holders.py) ----------------------------------

    def holder_open(self) -> tuple[str, str] | None:
        if self.path == ":memory:":
            return None
        try:
            holder = HolderFile(self._real)
        except OSError as exc:  # a read-only folder: its leases are judged by the clock
            log.warning("cannot keep a holder file beside %s (%s): leases are judged by "
                        "the clock alone", self.path, exc)
            return None
        with self._lock:
            self._holders[holder.id] = holder
        return holder.id, str(holder.path)

    def holder_close(self, holder: str) -> None:
        with self._lock:
            held = self._holders.pop(holder, None)
        if held is not None:
            held.close()

    def _reclaim_params(self) -> dict[str, Any]:
        seen = look(self._real) if self.path != ":memory:" else None
        if seen is None:
            return {"alive": "[]", "dead": "[]", "told": 1, "any_dead": 0}
        return {"alive": json.dumps(seen.alive), "dead": json.dumps(seen.dead),
                "told": int(seen.told), "any_dead": int(bool(seen.dead))}

    # -- schema ----------------------------------------------------------------------------

    def _versions(self, conn: sqlite3.Connection) -> set[int]:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS wl_schema_version ("
            " version INTEGER PRIMARY KEY,"
            " applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')))"
        )
        return {r[0] for r in conn.execute("SELECT version FROM wl_schema_version")}

    def _apply(self, conn: sqlite3.Connection, version: int, sql: str) -> None:
        for statement in common.split_statements(sql):  # execute() runs one statement
            conn.execute(statement)
        conn.execute("INSERT INTO wl_schema_version (version) VALUES (?)", (version,))

    def schema_version(self) -> int:
        try:
            rows = self._read("SELECT max(version) FROM wl_schema_version", {})
        except StorageError:
            return 0
        return int(rows[0][0] or 0)

    # -- statements ------------------------------------------------------------------------

    def _lease_token(self, conn: sqlite3.Connection) -> dict[str, Any]:
        """SQLite has no sequences and no writing CTE: the token is read in a statement of its
        own, and taken (``_lease_token_taken``) only by a claim that found rows."""
        return {"token": int(conn.execute(self.Q["lease_token_peek"]).fetchone()[0])}

    def _lease_token_taken(self, conn: sqlite3.Connection) -> None:
        conn.execute(self.Q["lease_token_next"]).fetchone()

    def _add_counts(self, conn: sqlite3.Connection, rows: CountRows) -> None:
        if rows:
            conn.executemany(self.Q["counts_add"], rows)

    def _item_rows(self, params: ItemsInsert) -> list[tuple[Any, ...]]:
        head = (params.run_id, params.stage)
        return [head + tuple(i) for i in params.items]

    def _lock_decomposition(self, conn: sqlite3.Connection, run_id: int) -> None:
        pass  # one writer at a time already

    def _insert_items(self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
        before = conn.total_changes
        conn.executemany(self.Q["items_insert"], rows)
        return conn.total_changes - before

    # -- parameters and values: JSON text, times as modifiers of strftime('now') -----------

    def _list(self, values: Iterable[Any]) -> str:
        return json.dumps(list(values))

    def _row_set(self, rows: list[list[Any]], names: Sequence[str]) -> dict[str, Any]:
        return {"rows": json.dumps(rows)}

    def _handoff_rows(self, handoffs: list[list[Any]]) -> dict[str, Any]:
        return {"rows": json.dumps(handoffs)}

    def _units_rows(self, rows: list[list[Any]]) -> dict[str, Any]:
        return {"rows": json.dumps(rows)}

    def _lease(self, seconds: float) -> str:
        return f"+{float(seconds):.3f} seconds"

    def _ago(self, seconds: float) -> str:
        return f"-{float(seconds):.3f} seconds"

    @staticmethod
    def _json(value: Any) -> Any:
        return common.loads(value)

    @staticmethod
    def _ts(value: str | None) -> str | None:
        """SQLite keeps UTC text to the millisecond; show it like PostgreSQL's timestamptz."""
        if value is None or len(value) != 23:
            return value
        return value + "000+00:00"

    @staticmethod
    def _ts_req(value: str) -> str:
        return value + "000+00:00" if len(value) == 23 else value

    @staticmethod
    def _at(value: datetime) -> str:
        """The column's own form, UTC text to the millisecond, so that equal times compare
        equal as text."""
        utc = value.astimezone(UTC)
        return f"{utc:%Y-%m-%d %H:%M:%S}.{utc.microsecond // 1000:03d}"

    @staticmethod
    def _time(value: str | None) -> datetime | None:
        return None if value is None else datetime.fromisoformat(value).replace(tzinfo=UTC)
