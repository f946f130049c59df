"""Where a round's ledger lives, and the oracle's own way into it.

Each round gets a fresh ledger: a new SQLite file, or a new database on the campaign's private
PostgreSQL server (pgserver.py). The oracle reads it through :class:`Db`: plain SQL on a
connection of its own (sqlite3 or psycopg), never through workledger's code.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import netns
import psycopg
from pgserver import PrivatePostgres

ORACLE_APP = "chaos-oracle"


class Unreachable(RuntimeError):
    """The database cannot be read right now (a PostgreSQL restart in progress)."""


class Db:
    """The oracle's connection. SQL is written with ``%s`` placeholders for both backends."""

    def __init__(self, url: str, application: str = ORACLE_APP) -> None:
        self.url = url
        self.application = application
        self.sqlite = url.startswith("sqlite:///")
        self._conn: Any = None

    def _connect(self) -> Any:
        if self.sqlite:
            conn = sqlite3.connect(self.url[len("sqlite:///"):], timeout=120.0,
                                   isolation_level=None)
            return conn
        sep = "&" if "?" in self.url else "?"
        return psycopg.connect(f"{self.url}{sep}application_name={self.application}",
                               autocommit=True, connect_timeout=5)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.sqlite:
            sql = sql.replace("%s", "?")
        for attempt in (1, 2):
            try:
                if self._conn is None:
                    self._conn = self._connect()
                return [tuple(r) for r in self._conn.execute(sql, tuple(params)).fetchall()]
            except (psycopg.OperationalError, psycopg.errors.AdminShutdown) as exc:
                self.close()
                if attempt == 2:
                    raise Unreachable(str(exc).strip().splitlines()[0]) from exc
        raise AssertionError("unreachable")

    def hold_snapshot(self, seconds: float) -> None:
        """One read transaction kept open for ``seconds``: a long report, a stuck dashboard."""
        if self._conn is None:
            self._conn = self._connect()
        begin = "BEGIN" if self.sqlite else "BEGIN ISOLATION LEVEL REPEATABLE READ"
        self._conn.execute(begin)
        self._conn.execute("SELECT count(*), max(updated_at) FROM wl_items").fetchall()
        time.sleep(seconds)  # the fault itself: a reader that holds its snapshot this long
        self._conn.execute("COMMIT")

    def wal_bytes(self) -> int:
        """The size of a SQLite ledger's write-ahead log now (0 when it has none)."""
        try:
            return Path(self.url[len("sqlite:///"):] + "-wal").stat().st_size
        except OSError:
            return 0

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close
                pass
            self._conn = None


class SqliteBackend:
    name = "sqlite"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def new_round(self, number: int) -> str:
        return f"sqlite:///{self.workdir / f'round-{number}' / 'ledger.db'}"

    def drop_round(self, url: str) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(url[len("sqlite:///"):] + suffix).unlink(missing_ok=True)
        shutil.rmtree(url[len("sqlite:///"):] + ".holders", ignore_errors=True)

    def up(self) -> bool:
        return True

    def close(self) -> None:
        pass


class PostgresBackend:
    """Rounds on a private server: sessions terminated and the server restarted are ours."""

    name = "postgres"

    def __init__(self, workdir: Path, seed: int, partition: bool = False) -> None:
        """``partition``: make a network namespace the server also listens into (netns.py),
        for the partition fault."""
        self.workdir = workdir
        self.tag = f"{seed % 10**8}"
        self.partition: netns.Partition | None = None
        if partition:
            self.partition = netns.Partition(seed)
            self.partition.create()
        try:
            self.server = PrivatePostgres(
                self.partition.host if self.partition else None,
                netns.SUBNET if self.partition else None)
            self.server.create()
        except BaseException:
            if self.partition is not None:
                self.partition.remove()
            raise
        self._down = threading.Event()
        self._restarting = threading.Lock()

    def new_round(self, number: int) -> str:
        return self.server.create_database(f"chaos_{self.tag}_{number}")

    def drop_round(self, url: str) -> None:
        self.server.drop_database(url.rsplit("/", 1)[1])

    def up(self) -> bool:
        return not self._down.is_set()

    def terminate(self, url: str, mode: str, pick: float) -> int:
        """``pg_terminate_backend`` on the round database's sessions (not the oracle's)."""
        database = url.rsplit("/", 1)[1]
        with psycopg.connect(self.server.url(), autocommit=True, connect_timeout=5) as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name <> %s"
                " AND pid <> pg_backend_pid() ORDER BY pid", (database, ORACLE_APP))]
            if mode == "one" and pids:
                pids = [pids[int(pick * len(pids))]]
            for pid in pids:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return len(pids)

    def restart(self, mode: str, downtime: float) -> None:
        """Stop the server (``immediate`` is a crash: recovery from the WAL at start) and start
        it again after ``downtime``; meant to run in a thread of its own."""
        with self._restarting:
            self._down.set()
            try:
                self.server.stop(mode)
                threading.Event().wait(downtime)  # the outage itself, not a wait for anything
                self.server.start()
            finally:
                self._down.clear()

    def ensure_up(self) -> None:
        with self._restarting:
            if not self.server.running():
                self.server.start()

    def sessions_from(self, address: str) -> int:
        """How many sessions the server has from clients at ``address`` (0 when unreachable)."""
        try:
            with psycopg.connect(self.server.url(), autocommit=True, connect_timeout=5) as conn:
                row = conn.execute("SELECT count(*) FROM pg_stat_activity"
                                   " WHERE client_addr = %s::inet", (address,)).fetchone()
        except psycopg.Error:
            return 0
        return int(row[0]) if row else 0

    def partitioned_url(self, url: str) -> str:
        """The round's database as a worker inside the partition's namespace reaches it."""
        assert self.partition is not None
        return self.server.url(url.rsplit("/", 1)[1], host=self.partition.host)

    def close(self) -> None:
        try:
            self.server.remove()
        finally:
            if self.partition is not None:
                self.partition.remove()
