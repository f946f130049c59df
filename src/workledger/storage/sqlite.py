"""SQLite adapter: the embedded default. One writer at a time under ``BEGIN IMMEDIATE``.

WAL mode with ``synchronous=FULL`` so no acknowledged commit is lost on power failure.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from operator import itemgetter
from pathlib import Path
from typing import Any

from workledger.errors import DatabaseUnavailable, StorageError, UnknownRun
from workledger.storage import common
from workledger.storage.port import (
    ClaimedItem,
    ClaimParams,
    EventRow,
    FinishParams,
    FinishResult,
    ItemRow,
    ItemsInsert,
    ItemsQuery,
    LeaseParams,
    NewEvent,
    NewRun,
    Outlook,
    Projection,
    ReclaimParams,
    Reconciled,
    RunRow,
    SettleParams,
)
from workledger.storage.queries import migrations, queries

MIN_VERSION = (3, 35, 0)
FINISH_SHAPES = 4  # up to this many distinct outcomes in a chunk: one guarded UPDATE each
Q = queries("sqlite")


def check_version(version: str = sqlite3.sqlite_version) -> None:
    parts = tuple(int(p) for p in version.split(".")[:3])
    if parts < MIN_VERSION:
        raise DatabaseUnavailable(
            f"SQLite {version} is too old: workledger needs 3.35 or newer (RETURNING, UPDATE FROM)"
        )


def _lease(seconds: float) -> str:
    return f"+{float(seconds):.3f} seconds"


class SqliteStore:
    dialect = "sqlite"

    def __init__(self, path: str, *, timeout: float = 60.0) -> None:
        check_version()
        self.path = path
        if path != ":memory:":
            parent = Path(path).expanduser().resolve().parent
            if not parent.is_dir():
                raise DatabaseUnavailable(f"cannot open SQLite database {path}: no folder {parent}")
        try:
            self._conn = sqlite3.connect(
                path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
        except sqlite3.Error as exc:
            raise DatabaseUnavailable(f"cannot open SQLite database {path}: {exc}") from exc
        self._lock = threading.RLock()

    # -- plumbing --------------------------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with the write lock up front (no upgrade deadlocks)."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StorageError(f"SQLite: cannot begin a transaction: {exc}") from exc
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StorageError(f"SQLite: {exc}") from exc
                raise

    def _read(self, sql: str, params: dict[str, Any] | None = None) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, params or {}).fetchall()
            except sqlite3.Error as exc:
                raise StorageError(f"SQLite: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- schema ----------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        applied: list[int] = []
        with self._tx() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS wl_schema_version ("
                " version INTEGER PRIMARY KEY,"
                " applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')))"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM wl_schema_version")}
            for version, _name, sql in migrations("sqlite"):
                if version in done:
                    continue
                for statement in common.split_statements(sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO wl_schema_version (version) VALUES (?)", (version,))
                applied.append(version)
        return applied

    def schema_version(self) -> int:
        try:
            rows = self._read("SELECT max(version) FROM wl_schema_version")
        except StorageError:
            return 0
        return int(rows[0][0] or 0)

    # -- runs ------------------------------------------------------------------------------

    def run_submit(self, new: NewRun) -> tuple[RunRow, bool]:
        params = {"job": new.job, "key": new.idempotency_key, "payload": new.payload,
                  "tolerate": new.tolerate}
        with self._tx() as conn:
            inserted = conn.execute(Q["run_insert"], params).fetchone()
            row = conn.execute(Q["run_by_key"], params).fetchone()
            if inserted is not None:
                conn.execute(Q["events_add"], common.run_event(row["id"], "submitted", None,
                                                               key=new.idempotency_key))
        if inserted is not None:
            common.failpoint("submit.after_commit")
        return _run(row), inserted is not None

    def run_get(self, run_id: int) -> RunRow | None:
        rows = self._read(Q["run_get"], {"run_id": run_id})
        return _run(rows[0]) if rows else None

    def runs_list(self, limit: int = 100) -> list[RunRow]:
        return [_run(r) for r in self._read(Q["runs_list"], {"limit": limit})]

    def run_mark_decomposed(self, run_id: int, first_stage: str) -> RunRow:
        common.failpoint("decompose.before_mark")
        with self._tx() as conn:
            row = conn.execute(Q["run_mark_decomposed"], {"run_id": run_id, "stage": first_stage})
            fetched = row.fetchone()
            if fetched is None:
                raise UnknownRun(f"no run {run_id}")
            conn.execute(Q["events_add"], common.run_event(run_id, "decomposed", None,
                                                           total=fetched["total"]))
        common.failpoint("decompose.after_mark")
        return _run(fetched)

    def run_record_error(self, run_id: int, error: str | None) -> None:
        with self._tx() as conn:
            conn.execute(Q["run_record_error"], {"run_id": run_id, "error": error})

    def runs_claimable(self, jobs: Sequence[str]) -> list[tuple[int, str]]:
        rows = self._read(Q["runs_claimable"], {"jobs": json.dumps(list(jobs))})
        return [(int(r[0]), str(r[1])) for r in rows]

    def run_counts(self, run_id: int) -> dict[str, dict[str, int]]:
        return common.counts_of(self._read(Q["run_counts"], {"run_id": run_id}))

    def run_waits(self, run_id: int) -> tuple[int, int]:
        expired, waiting = self._read(Q["run_waits"], {"run_id": run_id})[0]
        return int(expired), int(waiting)

    # -- items -----------------------------------------------------------------------------

    def items_insert_many(self, params: ItemsInsert) -> int:
        items = params.items
        if not items:
            return 0
        head = (params.run_id, params.stage)
        rows = [head + tuple(i) for i in items]
        with self._tx() as conn:
            # the rows already there (a re-decomposition) are not counted again
            present = {r[0] for r in conn.execute(Q["items_keys"], {
                "run_id": params.run_id, "stage": params.stage, **common.seq_range(items)})}
            before = conn.total_changes
            conn.executemany(Q["items_insert"], rows)
            inserted = conn.total_changes - before
            _count(conn, params.run_id, common.inserted_tally(params.stage, items, present))
        common.failpoint("decompose.after_batch")
        return inserted

    def items_claim(self, params: ClaimParams) -> list[ClaimedItem]:
        with self._tx() as conn:
            token = int(conn.execute(Q["lease_token_next"]).fetchone()[0])
            rows = _tuples(conn, Q["items_claim"], {
                "token": token, "lease": _lease(params.lease_seconds), "run_id": params.run_id,
                "after_id": params.after_id, "limit": params.limit})
            claimed = common.claimed_items(rows, decode=True)
            if params.record_event and claimed:
                conn.executemany(Q["events_add"], common.claim_events(claimed, params.actor))
            if claimed:
                _count(conn, params.run_id, common.Tally.moves(
                    map(itemgetter(2), rows), "pending", "claimed"))
        common.failpoint("claim.after_commit")
        return claimed

    def items_mark_started(self, params: LeaseParams) -> list[int]:
        with self._tx() as conn:
            rows = conn.execute(
                Q["items_mark_started"], {"ids": json.dumps(list(params.ids)),
                                          "token": params.lease_token}
            ).fetchall()
        return sorted(int(r[0]) for r in rows)

    def items_heartbeat(self, params: LeaseParams) -> int:
        with self._tx() as conn:
            cur = conn.execute(
                Q["items_heartbeat"],
                {"ids": json.dumps(list(params.ids)), "token": params.lease_token,
                 "lease": _lease(params.lease_seconds)},
            )
            return int(cur.rowcount)

    def items_release(self, params: LeaseParams) -> int:
        with self._tx() as conn:
            rows = conn.execute(
                Q["items_release"], {"ids": json.dumps(list(params.ids)),
                                     "token": params.lease_token}
            ).fetchall()
            _count(conn, params.run_id, common.Tally.moves(
                (r[0] for r in rows), "claimed", "pending"))
            return len(rows)

    def items_finish_if_leased(self, params: FinishParams) -> FinishResult:
        if not params.finishes:
            return FinishResult(applied=[], stale=[])
        with self._tx() as conn:
            groups = common.finish_groups(params.finishes, FINISH_SHAPES)
            if groups is None:
                rows = json.dumps(common.finish_rows(params.finishes))
                found = conn.execute(Q["items_finish_if_leased"], {"rows": rows}).fetchall()
                applied = {int(r[0]) for r in found}
                plan = common.plan_after_finish(params, applied)
                tally = common.Tally.of_moves(found, plan.moved, "claimed")
            else:
                by_group = {key: _tuples(conn, Q["items_finish_group"], {
                    "token": key[0], "state": key[1], "result": key[2], "error": key[3],
                    "delay": key[4], "charge": key[5], "ids": json.dumps(ids)})
                    for key, ids in groups.items()}
                plan, tally = common.plan_after_groups(params, groups, by_group)
                applied = {r[0] for rows in by_group.values() for r in rows}
            self._write_plan(conn, params.run_id, plan, tally)
            common.failpoint("complete.before_commit")
            if plan.handoffs:
                common.failpoint("handoff.before_commit")
        common.failpoint("complete.after_commit")
        return FinishResult(applied=sorted(applied), stale=plan.stale)

    def items_list(self, query: ItemsQuery) -> list[ItemRow]:
        rows = self._read(
            Q["items_list"],
            {"run_id": query.run_id, "stage": query.stage, "state": query.state,
             "limit": query.limit, "after_id": query.after_id, "seq": query.seq},
        )
        return [_item(r) for r in rows]

    def leases_reclaim_expired(self, params: ReclaimParams) -> list[ItemRow]:
        with self._tx() as conn:
            rows = conn.execute(
                Q["leases_reclaim_expired"],
                {"to_state": params.to_state, "reason": params.reason, "job": params.job,
                 "stage": params.stage, "limit": params.limit},
            ).fetchall()
            items = sorted((_item(r) for r in rows), key=lambda i: i.id)
            for run_id, tally in common.reclaim_tallies(items, params.to_state).items():
                _count(conn, run_id, tally)
            if items:
                conn.executemany(
                    Q["events_add"], [common.event_params(e) for e in common.reclaim_events(
                        items, params)]
                )
                common.failpoint("reclaim.before_commit")
        if items:
            common.failpoint("reclaim.after_commit")
        return items

    def items_settle(self, params: SettleParams) -> FinishResult:
        with self._tx() as conn:
            rows = json.dumps(common.settle_rows(params.settles))
            found = conn.execute(
                Q["items_settle"], {"rows": rows, "from_state": params.from_state,
                                    "run_id": params.run_id}).fetchall()
            applied = {int(r[0]) for r in found}
            plan = common.plan_after_settle(params, applied)
            self._write_plan(conn, params.run_id, plan,
                             common.Tally.of_moves(found, plan.moved, params.from_state))
        return FinishResult(applied=sorted(applied), stale=plan.stale)

    def _write_plan(self, conn: sqlite3.Connection, run_id: int, plan: common.FinishPlan,
                    tally: common.Tally) -> None:
        """What a finish or a settle writes besides the items: hand-offs, counters, history.
        ``tally`` holds the count moves of the guarded update itself."""
        if plan.handoffs:
            for (stage,) in conn.execute(Q["items_handoff"],
                                         {"rows": json.dumps(plan.handoffs)}).fetchall():
                tally.add(stage, "pending")
        row = conn.execute(Q["run_add_units"], {"run_id": run_id, **plan.units}).fetchone()
        if row is not None and row[0] is not None:
            # the run was cancelled while this chunk ran: a retry or a hand-off must not
            # leave a pending item behind in it
            cancelled = conn.execute(Q["items_cancel_pending"], {"run_id": run_id}).fetchall()
            if cancelled:
                tally.merge(common.Tally.moves((r[1] for r in cancelled), "pending", "skipped"))
                conn.execute(Q["run_add_units"], {"run_id": run_id, "processed": 0, "failed": 0,
                                                  "skipped": len(cancelled)}).fetchone()
        if plan.events:
            conn.executemany(Q["events_add"], [common.event_params(e) for e in plan.events])
        _count(conn, run_id, tally)

    def items_keys(self, run_id: int, stage: str, lo: int, hi: int) -> dict[int, str | None]:
        rows = self._read(Q["items_keys"], {"run_id": run_id, "stage": stage, "lo": lo, "hi": hi})
        return {int(r[0]): r[1] for r in rows}

    def items_attention(self, states: Sequence[str], limit: int = 1000) -> list[ItemRow]:
        rows = self._read(Q["items_attention"], {"states": json.dumps(list(states)),
                                                 "limit": limit})
        return [_item(r) for r in rows]

    def leases_expired(self, limit: int = 1000) -> list[ItemRow]:
        return [_item(r) for r in self._read(Q["leases_expired"], {"limit": limit})]

    def runs_undecomposed(self, grace_seconds: float) -> list[RunRow]:
        rows = self._read(Q["runs_undecomposed"], {"grace": f"-{float(grace_seconds):.3f} seconds"})
        return [_run(r) for r in rows]

    def runs_to_close(self, jobs: Sequence[str], stage: str) -> list[int]:
        rows = self._read(Q["runs_to_close"], {"jobs": json.dumps(list(jobs)), "stage": stage})
        return [int(r[0]) for r in rows]

    def run_set_paused(self, run_id: int, paused: bool, actor: str, note: str | None) -> bool:
        with self._tx() as conn:
            done = conn.execute(Q["run_pause" if paused else "run_resume"],
                                {"run_id": run_id}).fetchone()
            if done is not None:
                kind = "paused" if paused else "resumed"
                conn.execute(Q["events_add"], common.run_event(run_id, kind, actor, note=note))
        return done is not None

    def run_cancel(self, run_id: int, actor: str, note: str | None) -> int:
        with self._tx() as conn:
            if conn.execute(Q["run_cancel"], {"run_id": run_id}).fetchone() is None:
                return -1
            cancelled = conn.execute(Q["items_cancel_pending"], {"run_id": run_id}).fetchall()
            n = len(cancelled)
            conn.execute(Q["run_add_units"], {"run_id": run_id, "processed": 0, "failed": 0,
                                              "skipped": n}).fetchone()
            conn.execute(Q["events_add"], common.run_event(run_id, "cancelled", actor,
                                                           note=note, items=n))
            _count(conn, run_id, common.Tally.moves((r[1] for r in cancelled), "pending",
                                                    "skipped"))
        return n

    def run_reconcile(
        self, run_id: int, derive: Callable[[RunRow, dict[str, dict[str, int]]], Projection],
        repair: bool, actor: str,
    ) -> Reconciled:
        # one transaction: the counters and the items are read at one moment, and a repair
        # cannot interleave with a worker's completion (SQLite has one writer).
        with self._tx() as conn:
            locked = conn.execute(Q["run_lock"], {"run_id": run_id}).fetchone()
            if locked is None:
                raise UnknownRun(f"no run {run_id}")
            run = _run(locked)
            conn.execute(Q["counts_lock"], {"run_id": run_id}).fetchall()  # as PostgreSQL
            counts, stored_counts = common.compared_counts(
                conn.execute(Q["run_counts_compare"], {"run_id": run_id}).fetchall())
            derived = derive(run, counts)
            stored = common.projection_of(run)
            fix = repair and (stored != derived or stored_counts != counts)
            if fix:
                conn.execute(Q["run_set_projection"], {"run_id": run_id, **vars(derived)})
                conn.execute(Q["events_add"], common.reconcile_event(
                    run_id, actor, stored, derived, stored_counts, counts))
                _count_rows(conn, common.count_repairs(run_id, stored_counts, counts))
                common.failpoint("reconcile.before_commit")
        return Reconciled(stored=stored, derived=derived, repaired=fix,
                          stored_counts=stored_counts, ledger_counts=counts)

    def outlook(self, run_ids: Sequence[int]) -> Outlook:
        row = self._read(Q["outlook"], {"run_ids": json.dumps(list(run_ids))})[0]
        return common.outlook_from_row(tuple(row))

    # -- events ----------------------------------------------------------------------------

    def events_add(self, events: Sequence[NewEvent]) -> None:
        with self._tx() as conn:
            conn.executemany(Q["events_add"], [common.event_params(e) for e in events])

    def events_list(self, run_id: int, item_id: int | None = None) -> list[EventRow]:
        rows = self._read(Q["events_list"], {"run_id": run_id, "item_id": item_id})
        return [
            EventRow(id=r["id"], run_id=r["run_id"], item_id=r["item_id"], at=_ts_req(r["at"]),
                     kind=r["kind"], lease_token=r["lease_token"], actor=r["actor"],
                     detail=common.loads(r["detail"]))
            for r in rows
        ]


def _tuples(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> list[Any]:
    """Plain tuples, not sqlite3.Row: cheaper where a statement returns a row per item."""
    cur = conn.cursor()
    cur.row_factory = None
    return cur.execute(sql, params).fetchall()


def _count(conn: sqlite3.Connection, run_id: int, tally: common.Tally) -> None:
    _count_rows(conn, tally.rows(run_id))


def _count_rows(conn: sqlite3.Connection, rows: Sequence[tuple[int, str, str, int]]) -> None:
    if rows:
        conn.executemany(Q["counts_add"], rows)


def _ts(value: str | None) -> str | None:
    """SQLite keeps UTC text to the millisecond; show it like PostgreSQL's timestamptz."""
    if value is None or len(value) != 23:
        return value
    return value + "000+00:00"


def _ts_req(value: str) -> str:
    return value + "000+00:00" if len(value) == 23 else value


def _run(r: sqlite3.Row) -> RunRow:
    return RunRow(
        id=r["id"], job=r["job"], idempotency_key=r["idempotency_key"],
        payload=common.loads(r["payload"]), created_at=_ts_req(r["created_at"]),
        decomposed_at=_ts(r["decomposed_at"]), completed_at=_ts(r["completed_at"]),
        paused_at=_ts(r["paused_at"]), cancelled_at=_ts(r["cancelled_at"]), error=r["error"],
        total=r["total"], processed=r["processed"], failed=r["failed"], skipped=r["skipped"],
        tolerate=r["tolerate"],
    )


def _item(r: sqlite3.Row) -> ItemRow:
    return ItemRow(
        id=r["id"], run_id=r["run_id"], stage=r["stage"], seq=r["seq"], key=r["key"],
        data=common.loads(r["data"]), state=r["state"], attempts=r["attempts"],
        lease_until=_ts(r["lease_until"]), not_before=_ts(r["not_before"]),
        lease_token=r["lease_token"],
        result=common.loads(r["result"]), error=r["error"], created_at=_ts_req(r["created_at"]),
        updated_at=_ts_req(r["updated_at"]),
    )
