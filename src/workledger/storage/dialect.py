"""What an adapter must supply: the hooks ``base.LedgerStore`` writes every port method over.

A dialect (``sqlite.py``, ``postgres.py``) implements only what truly differs between the
databases: the connection and its transactions, how a list or a row set travels as a parameter
(SQLite: JSON text; PostgreSQL: arrays), how its values decode (times, JSON), and the few
statements whose shape differs (taking a lease token, the batch insert, the stage-count upsert,
migrations). Row decoding is written here once over the value hooks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from workledger.errors import StorageError
from workledger.storage import common
from workledger.storage.port import EventRow, ItemRow, ItemsInsert, RunRow

CountRows = Sequence[tuple[int, str, str, int]]  # (run_id, stage, state, n), for counts_add


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """What the shared code asks of a driver's connection (sqlite3's and psycopg's have it).
    Rows from ``execute`` are read by column name; ``Dialect._tuples`` gives plain tuples."""

    def execute(self, sql: str, params: Any, /) -> Cursor: ...


C = TypeVar("C", bound=Connection)


class Dialect(ABC, Generic[C]):
    """The hooks, and the plumbing and row decoding built on them."""

    dialect: str
    label: ClassVar[str]  # the database's name in messages
    Q: ClassVar[dict[str, str]]  # the dialect's named queries
    finish_shapes: ClassVar[int]  # a chunk with up to this many outcome shapes: one UPDATE each
    json_as_text: ClassVar[bool]  # JSON columns arrive as text, to decode (SQLite)

    # -- connection and transactions ---------------------------------------------------------

    @abstractmethod
    def _tx(self) -> AbstractContextManager[C]:
        """One write transaction: committed when the block ends, rolled back when it raises."""

    @abstractmethod
    def _reader(self) -> AbstractContextManager[C]:
        """The connection for one read (in a transaction where the dialect needs one)."""

    @abstractmethod
    def _tuples(self, conn: C, sql: str, params: dict[str, Any]) -> list[Any]:
        """The statement's rows as plain tuples (cheap where it returns a row per item)."""

    @abstractmethod
    def _many(self, conn: C, sql: str, rows: Sequence[dict[str, Any]]) -> None:
        """One statement for each parameter set."""

    # -- statements whose shape differs ------------------------------------------------------

    @abstractmethod
    def _versions(self, conn: C) -> set[int]:
        """The migrations applied (the version table made first, under a lock if need be)."""

    @abstractmethod
    def _apply(self, conn: C, version: int, sql: str) -> None:
        """Run one migration file and record its version."""

    @abstractmethod
    def _lease_token(self, conn: C) -> dict[str, Any]:
        """Parameters ``items_claim`` takes besides the shared ones (a lease token)."""

    @abstractmethod
    def _lease_token_taken(self, conn: C) -> None:
        """After a claim that found rows: the token it used is taken (a claim that found none
        writes nothing at all)."""

    @abstractmethod
    def _add_counts(self, conn: C, rows: CountRows) -> None:
        """``counts_add`` for rows sorted by (run, stage, state), of one run or of several
        (nothing when there are none)."""

    @abstractmethod
    def _item_rows(self, params: ItemsInsert) -> Any:
        """A batch's rows, shaped for ``_insert_items`` (before the transaction starts)."""

    @abstractmethod
    def _lock_decomposition(self, conn: C, run_id: int) -> None:
        """Hold off another decomposition of the run until this transaction ends."""


    @abstractmethod
    def _new_runs_rows(self, runs: Sequence[Any]) -> dict[str, Any]:
        """The NewRunItems' runs as the parameters of ``runs_insert_many``."""

    @abstractmethod
    def _marks_rows(self, marks: list[list[int]]) -> dict[str, Any]:
        """``[run_id, total, skipped]`` rows as the parameters of ``runs_mark_new``."""

    @abstractmethod
    def _insert_items_of_runs(self, conn: C, batches: Sequence[ItemsInsert]) -> None:
        """``items_insert`` for the items of several new runs in one statement."""

    @abstractmethod
    def _insert_items(self, conn: C, rows: Any) -> int:
        """``items_insert`` the shaped rows; how many were new."""

    # -- the caller's connection (submit inside the caller's transaction) ---------------------

    @abstractmethod
    def _foreign_tx(self, conn: Any) -> AbstractContextManager[Connection]:
        """The caller's open connection, checked (this driver's, in a transaction the caller
        will end, on this ledger's database: ``UsageError`` otherwise) and wrapped so that its
        rows read by column name, inside a savepoint: released when the block ends (nothing is
        committed: that is the caller's), rolled back to when it raises, so a failure leaves
        nothing in the caller's transaction. Where the database can, idle workers are woken
        when (and only if) the caller commits."""

    @abstractmethod
    def _identity(self, conn: Connection) -> tuple[tuple[Any, ...], str]:
        """Which ledger ``conn`` is on: a key, equal for connections on the same ledger, and
        how to name it in a message."""

    # -- parameters and values ---------------------------------------------------------------

    @abstractmethod
    def _list(self, values: Iterable[Any]) -> Any:
        """An id or text list parameter."""

    @abstractmethod
    def _row_set(self, rows: list[list[Any]], names: Sequence[str]) -> dict[str, Any]:
        """Rows (id first) as the parameters of a statement that joins them; ``names``: the
        columns, for a dialect that sends them as parallel arrays."""

    @abstractmethod
    def _handoff_rows(self, handoffs: list[list[Any]]) -> dict[str, Any]:
        """``[id, next_stage]`` pairs as the parameters of ``items_handoff``, in their order."""

    @abstractmethod
    def _units_rows(self, rows: list[list[Any]]) -> dict[str, Any]:
        """``[run_id, processed, failed, skipped]`` rows as the parameters of
        ``runs_add_units``."""

    @abstractmethod
    def _lease(self, seconds: float) -> Any:
        """A lease length, for ``items_claim`` and ``items_heartbeat``."""

    @abstractmethod
    def _ago(self, seconds: float) -> Any:
        """A quiet time, for ``runs_undecomposed``."""

    @staticmethod
    @abstractmethod
    def _json(value: Any) -> Any:
        """A JSON column's value as Python."""

    @staticmethod
    @abstractmethod
    def _ts(value: Any) -> str | None:
        """A time column's value as text, UTC, like PostgreSQL's timestamptz."""

    @staticmethod
    @abstractmethod
    def _ts_req(value: Any) -> str:
        """The same for a NOT NULL time column."""

    @staticmethod
    @abstractmethod
    def _at(value: datetime) -> Any:
        """A timezone-aware time as a parameter of a time column (migration 0014)."""

    @staticmethod
    @abstractmethod
    def _time(value: Any) -> datetime | None:
        """A time column's value as a timezone-aware datetime in UTC (None for NULL)."""

    def _wake(self, conn: C) -> None:
        """Work becomes claimable when this transaction commits: tell idle workers."""

    # -- plumbing ----------------------------------------------------------------------------

    def _read(self, sql: str, params: dict[str, Any]) -> list[Any]:
        with self._reader() as conn:
            return conn.execute(sql, params).fetchall()

    def _read_tuples(self, sql: str, params: dict[str, Any]) -> list[Any]:
        with self._reader() as conn:
            return self._tuples(conn, sql, params)

    def _first(self, rows: list[Any]) -> Any:
        if not rows:
            raise StorageError(f"{self.label}: the statement returned no row")
        return rows[0]

    def _count(self, conn: C, run_id: int, tally: common.Tally) -> None:
        self._add_counts(conn, tally.rows(run_id))

    def _count_runs(self, conn: C, tallies: Mapping[int, common.Tally]) -> None:
        """The count moves of several runs (a chunk across runs) in one statement, sorted: the
        counter rows are still the last ones the transaction takes, in the one order."""
        self._add_counts(conn, [r for run_id in sorted(tallies)
                                for r in tallies[run_id].rows(run_id)])

    # -- rows --------------------------------------------------------------------------------

    def _run(self, r: Any) -> RunRow:
        ts, at = self._ts, self._ts_req
        return RunRow(
            id=r["id"], job=r["job"], idempotency_key=r["idempotency_key"],
            payload=self._json(r["payload"]), created_at=at(r["created_at"]),
            decomposed_at=ts(r["decomposed_at"]), completed_at=ts(r["completed_at"]),
            paused_at=ts(r["paused_at"]), cancelled_at=ts(r["cancelled_at"]), error=r["error"],
            total=r["total"], processed=r["processed"], failed=r["failed"],
            skipped=r["skipped"], tolerate=r["tolerate"], priority=int(r["priority"]),
            tenant=r["tenant"],
        )

    def _item(self, r: Any) -> ItemRow:
        ts, at, js = self._ts, self._ts_req, self._json
        return ItemRow(
            id=r["id"], run_id=r["run_id"], stage=r["stage"], seq=r["seq"], key=r["key"],
            data=js(r["data"]), state=r["state"], attempts=r["attempts"],
            lease_until=ts(r["lease_until"]), not_before=ts(r["not_before"]),
            lease_token=r["lease_token"], result=js(r["result"]), error=r["error"],
            created_at=at(r["created_at"]), updated_at=at(r["updated_at"]),
            started_at=ts(r["started_at"]), concurrency_key=r["concurrency_key"],
        )

    def _event(self, r: Any) -> EventRow:
        return EventRow(id=r["id"], run_id=r["run_id"], item_id=r["item_id"],
                        at=self._ts_req(r["at"]), kind=r["kind"], lease_token=r["lease_token"],
                        actor=r["actor"], detail=self._json(r["detail"]))
