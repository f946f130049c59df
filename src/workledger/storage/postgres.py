"""PostgreSQL adapter: the scale-out engine. Many workers on many machines share one database.

Concurrent claimers take disjoint chunks with ``FOR UPDATE SKIP LOCKED``; every lease time is the
database's ``now()``. One connection per store, used under a lock; every port method is one
transaction. A connection that was lost is replaced on the next call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row, tuple_row

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

Q = queries("postgres")
CONNECT_TIMEOUT = 5
# pg_advisory_xact_lock key that serialises concurrent migrate() calls ("wl" + "migr").
MIGRATE_LOCK = 0x776C_6D69_6772
# pg_advisory_xact_lock(DECOMPOSE_LOCK, run_id % 2**31): two decompositions of one run (a
# sweeper and a slow original) write a batch one at a time, so each counts only its new rows.
DECOMPOSE_LOCK = 0x776C_6463

Conn = psycopg.Connection[DictRow]
_OUTLOOK = ("ready", "waiting", "next_ready_in", "leased", "lease_ends_in", "expired")


class PostgresStore:
    dialect = "postgres"

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

    def _read(self, sql: str, params: dict[str, Any] | None = None) -> list[DictRow]:
        with self._tx() as conn:
            return conn.execute(sql, params or {}).fetchall()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._conn.close()

    # -- schema ----------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        applied: list[int] = []
        with self._tx() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS wl_schema_version ("
                " version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["version"] for r in conn.execute("SELECT version FROM wl_schema_version")}
            for version, _name, sql in migrations("postgres"):
                if version in done:
                    continue
                conn.execute(sql)  # no parameters: psycopg sends the whole file at once
                conn.execute("INSERT INTO wl_schema_version (version) VALUES (%s)", (version,))
                applied.append(version)
        return applied

    def schema_version(self) -> int:
        with self._tx() as conn:
            found = conn.execute("SELECT to_regclass('wl_schema_version') IS NOT NULL AS ok")
            if not _first(found.fetchall())["ok"]:
                return 0
            row = _first(conn.execute("SELECT max(version) AS v FROM wl_schema_version").fetchall())
        return int(row["v"] or 0)

    # -- runs ------------------------------------------------------------------------------

    def run_submit(self, new: NewRun) -> tuple[RunRow, bool]:
        params = {"job": new.job, "key": new.idempotency_key, "payload": new.payload,
                  "tolerate": new.tolerate}
        with self._tx() as conn:
            inserted = conn.execute(Q["run_insert"], params).fetchone()
            row = _first(conn.execute(Q["run_by_key"], params).fetchall())
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
            row = conn.execute(Q["run_mark_decomposed"],
                               {"run_id": run_id, "stage": first_stage}).fetchone()
            if row is None:
                raise UnknownRun(f"no run {run_id}")
            conn.execute(Q["events_add"], common.run_event(run_id, "decomposed", None,
                                                           total=row["total"]))
        common.failpoint("decompose.after_mark")
        return _run(row)

    def run_record_error(self, run_id: int, error: str | None) -> None:
        with self._tx() as conn:
            conn.execute(Q["run_record_error"], {"run_id": run_id, "error": error})

    def runs_claimable(self, jobs: Sequence[str]) -> list[tuple[int, str]]:
        rows = self._read(Q["runs_claimable"], {"jobs": list(jobs)})
        return [(int(r["id"]), str(r["job"])) for r in rows]

    def run_counts(self, run_id: int) -> dict[str, dict[str, int]]:
        rows = self._read(Q["run_counts"], {"run_id": run_id})
        return common.counts_of((r["stage"], r["state"], r["n"]) for r in rows)

    def run_waits(self, run_id: int) -> tuple[int, int]:
        row = _first(self._read(Q["run_waits"], {"run_id": run_id}))
        return int(row["expired"]), int(row["waiting"])

    def runs_undecomposed(self, grace_seconds: float) -> list[RunRow]:
        rows = self._read(Q["runs_undecomposed"], {"grace": float(grace_seconds)})
        return [_run(r) for r in rows]

    def runs_to_close(self, jobs: Sequence[str], stage: str) -> list[int]:
        rows = self._read(Q["runs_to_close"], {"jobs": list(jobs), "stage": stage})
        return [int(r["id"]) for r in rows]

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
                                              "skipped": n})
            conn.execute(Q["events_add"], common.run_event(run_id, "cancelled", actor,
                                                           note=note, items=n))
            _count(conn, run_id, common.Tally.moves((r["stage"] for r in cancelled), "pending",
                                                    "skipped"))
        return n

    def run_reconcile(
        self, run_id: int, derive: Callable[[RunRow, dict[str, dict[str, int]]], Projection],
        repair: bool, actor: str,
    ) -> Reconciled:
        # One transaction holding the run row and then the run's counter rows (FOR UPDATE, in
        # the writers' order): a transaction that moves them waits, its item changes not yet
        # visible. Items and counters are then read by one statement, from one snapshot.
        with self._tx() as conn:
            locked = conn.execute(Q["run_lock"], {"run_id": run_id}).fetchone()
            if locked is None:
                raise UnknownRun(f"no run {run_id}")
            run = _run(locked)
            conn.execute(Q["counts_lock"], {"run_id": run_id}).fetchall()
            with conn.cursor(row_factory=tuple_row) as cur:
                counts, stored_counts = common.compared_counts(
                    cur.execute(Q["run_counts_compare"], {"run_id": run_id}).fetchall())
            derived = derive(run, counts)
            stored = common.projection_of(run)
            fix = repair and (stored != derived or stored_counts != counts)
            if fix:
                conn.execute(Q["run_set_projection"], {"run_id": run_id, **vars(derived)})
                conn.execute(Q["events_add"], common.reconcile_event(
                    run_id, actor, stored, derived, stored_counts, counts))
                _add_counts(conn, run_id, common.count_repairs(run_id, stored_counts, counts))
                common.failpoint("reconcile.before_commit")
        return Reconciled(stored=stored, derived=derived, repaired=fix,
                          stored_counts=stored_counts, ledger_counts=counts)

    # -- items -----------------------------------------------------------------------------

    def items_insert_many(self, params: ItemsInsert) -> int:
        items = params.items
        columns = {
            "run_id": params.run_id, "stage": params.stage,
            "seqs": [i.seq for i in items], "keys": [i.key for i in items],
            "datas": [i.data for i in items], "states": [i.state for i in items],
            "errors": [i.error for i in items],
        }
        inserted = 0
        if items:
            with self._tx() as conn:
                conn.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                              (DECOMPOSE_LOCK, params.run_id % 2**31))
                # the rows already there (a re-decomposition) are not counted again
                present = {r["seq"] for r in conn.execute(Q["items_keys"], {
                    "run_id": params.run_id, "stage": params.stage,
                    **common.seq_range(items)})}
                inserted = conn.execute(Q["items_insert"], columns).rowcount
                _count(conn, params.run_id, common.inserted_tally(params.stage, items, present))
        common.failpoint("decompose.after_batch")
        return inserted

    def items_claim(self, params: ClaimParams) -> list[ClaimedItem]:
        with self._tx() as conn:
            with conn.cursor(row_factory=tuple_row) as cur:
                rows = cur.execute(Q["items_claim"], {
                    "lease": float(params.lease_seconds), "run_id": params.run_id,
                    "after_id": params.after_id, "limit": params.limit}).fetchall()
            claimed = common.claimed_items(rows, decode=False)
            if params.record_event and claimed:
                _many(conn, Q["events_add"], common.claim_events(claimed, params.actor))
            if claimed:
                _count(conn, params.run_id, common.Tally.moves(
                    map(itemgetter(2), rows), "pending", "claimed"))
        common.failpoint("claim.after_commit")
        return claimed

    def items_mark_started(self, params: LeaseParams) -> list[int]:
        with self._tx() as conn:
            rows = conn.execute(
                Q["items_mark_started"], {"ids": list(params.ids), "token": params.lease_token}
            ).fetchall()
        return sorted(int(r["id"]) for r in rows)

    def items_heartbeat(self, params: LeaseParams) -> int:
        with self._tx() as conn:
            cur = conn.execute(
                Q["items_heartbeat"],
                {"ids": list(params.ids), "token": params.lease_token,
                 "lease": float(params.lease_seconds)},
            )
            return int(cur.rowcount)

    def items_release(self, params: LeaseParams) -> int:
        with self._tx() as conn:
            rows = conn.execute(
                Q["items_release"], {"ids": list(params.ids), "token": params.lease_token}
            ).fetchall()
            _count(conn, params.run_id, common.Tally.moves(
                (r["stage"] for r in rows), "claimed", "pending"))
            return len(rows)

    def items_finish_if_leased(self, params: FinishParams) -> FinishResult:
        if not params.finishes:
            return FinishResult(applied=[], stale=[])
        with self._tx() as conn:
            groups = common.finish_groups(params.finishes, 1)
            if groups is None:
                columns = _columns(common.finish_rows(params.finishes), (
                    "ids", "tokens", "states", "results", "errors", "delays", "charges"))
                found = conn.execute(Q["items_finish_if_leased"], columns).fetchall()
                applied = {int(r["id"]) for r in found}
                plan = common.plan_after_finish(params, applied)
                tally = common.Tally.of_moves(((r["id"], r["stage"]) for r in found),
                                              plan.moved, "claimed")
            else:
                # one shape (most chunks): one UPDATE over the sorted id array
                ((key, ids),) = groups.items()
                with conn.cursor(row_factory=tuple_row) as cur:
                    rows = cur.execute(Q["items_finish_group"], {
                        "token": key[0], "state": key[1], "result": key[2], "error": key[3],
                        "delay": key[4], "charge": key[5], "ids": sorted(ids)}).fetchall()
                plan, tally = common.plan_after_groups(params, groups, {key: rows})
                applied = {r[0] for r in rows}
            _write_plan(conn, params.run_id, plan, tally)
            common.failpoint("complete.before_commit")
            if plan.handoffs:
                common.failpoint("handoff.before_commit")
        common.failpoint("complete.after_commit")
        return FinishResult(applied=sorted(applied), stale=plan.stale)

    def items_settle(self, params: SettleParams) -> FinishResult:
        columns: dict[str, Any] = _columns(common.settle_rows(params.settles),
                                           ("ids", "states", "results", "errors", "delays",
                                            "resets"))
        columns.update(from_state=params.from_state, run_id=params.run_id)
        with self._tx() as conn:
            found = conn.execute(Q["items_settle"], columns).fetchall()
            applied = {int(r["id"]) for r in found}
            plan = common.plan_after_settle(params, applied)
            _write_plan(conn, params.run_id, plan, common.Tally.of_moves(
                ((r["id"], r["stage"]) for r in found), plan.moved, params.from_state))
        return FinishResult(applied=sorted(applied), stale=plan.stale)

    def items_keys(self, run_id: int, stage: str, lo: int, hi: int) -> dict[int, str | None]:
        rows = self._read(Q["items_keys"], {"run_id": run_id, "stage": stage, "lo": lo, "hi": hi})
        return {int(r["seq"]): r["key"] for r in rows}

    def items_attention(self, states: Sequence[str], limit: int = 1000) -> list[ItemRow]:
        rows = self._read(Q["items_attention"], {"states": list(states), "limit": limit})
        return [_item(r) for r in rows]

    def leases_expired(self, limit: int = 1000) -> list[ItemRow]:
        return [_item(r) for r in self._read(Q["leases_expired"], {"limit": limit})]

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
            if items:
                _many(conn, Q["events_add"],
                      [common.event_params(e) for e in common.reclaim_events(items, params)])
                tallies = common.reclaim_tallies(items, params.to_state)
                for run_id in sorted(tallies):
                    _count(conn, run_id, tallies[run_id])
                common.failpoint("reclaim.before_commit")
        if items:
            common.failpoint("reclaim.after_commit")
        return items

    def outlook(self, run_ids: Sequence[int]) -> Outlook:
        row = _first(self._read(Q["outlook"], {"run_ids": list(run_ids)}))
        return common.outlook_from_row(tuple(row[name] for name in _OUTLOOK))

    # -- events ----------------------------------------------------------------------------

    def events_add(self, events: Sequence[NewEvent]) -> None:
        if not events:
            return
        with self._tx() as conn:
            _many(conn, Q["events_add"], [common.event_params(e) for e in events])

    def events_list(self, run_id: int, item_id: int | None = None) -> list[EventRow]:
        rows = self._read(Q["events_list"], {"run_id": run_id, "item_id": item_id})
        return [
            EventRow(id=r["id"], run_id=r["run_id"], item_id=r["item_id"], at=_ts_req(r["at"]),
                     kind=r["kind"], lease_token=r["lease_token"], actor=r["actor"],
                     detail=r["detail"])
            for r in rows
        ]


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


def _many(conn: Conn, sql: str, rows: Sequence[dict[str, Any]]) -> None:
    with conn.cursor() as cur:
        cur.executemany(sql, rows)


def _first(rows: list[DictRow]) -> DictRow:
    if not rows:
        raise StorageError("PostgreSQL: the statement returned no row")
    return rows[0]


def _columns(rows: list[list[Any]], names: Sequence[str]) -> dict[str, list[Any]]:
    """Rows (id first) to parallel arrays for ``unnest``, in id order so that two transactions
    moving the same items lock them in the same order; delays as floats (one array type)."""
    rows = sorted(rows, key=lambda row: int(row[0]))
    columns = {name: [row[i] for row in rows] for i, name in enumerate(names)}
    columns["delays"] = [None if d is None else float(d) for d in columns["delays"]]
    return columns


def _write_plan(conn: Conn, run_id: int, plan: common.FinishPlan, tally: common.Tally) -> None:
    """What a finish or a settle writes besides the items: hand-offs, counters, history.
    ``tally`` holds the count moves of the guarded update itself. The stage counts go last:
    they are the rows every transaction of the run touches."""
    if plan.handoffs:
        for r in conn.execute(Q["items_handoff"], {"ids": [h[0] for h in plan.handoffs],
                                                   "stages": [h[1] for h in plan.handoffs]}):
            tally.add(r["stage"], "pending")
    row = conn.execute(Q["run_add_units"], {"run_id": run_id, **plan.units}).fetchone()
    if row is not None and row["cancelled_at"] is not None:
        # the run was cancelled while this chunk ran: a retry or a hand-off must not leave a
        # pending item behind in it
        cancelled = conn.execute(Q["items_cancel_pending"], {"run_id": run_id}).fetchall()
        if cancelled:
            tally.merge(common.Tally.moves((r["stage"] for r in cancelled), "pending", "skipped"))
            conn.execute(Q["run_add_units"], {"run_id": run_id, "processed": 0, "failed": 0,
                                              "skipped": len(cancelled)})
    if plan.events:
        _many(conn, Q["events_add"], [common.event_params(e) for e in plan.events])
    _count(conn, run_id, tally)


def _count(conn: Conn, run_id: int, tally: common.Tally) -> None:
    _add_counts(conn, run_id, tally.rows(run_id))


def _add_counts(conn: Conn, run_id: int, rows: Sequence[tuple[int, str, str, int]]) -> None:
    if rows:
        conn.execute(Q["counts_add"], {"run_id": run_id, "stages": [r[1] for r in rows],
                                       "states": [r[2] for r in rows],
                                       "ns": [r[3] for r in rows]})


def _ts(value: datetime | None) -> str | None:
    return None if value is None else _ts_req(value)


def _ts_req(value: datetime) -> str:
    """UTC, fixed width, so the strings sort like the times they name."""
    return value.astimezone(UTC).isoformat(sep=" ", timespec="microseconds")


def _run(r: DictRow) -> RunRow:
    return RunRow(
        id=r["id"], job=r["job"], idempotency_key=r["idempotency_key"], payload=r["payload"],
        created_at=_ts_req(r["created_at"]), decomposed_at=_ts(r["decomposed_at"]),
        completed_at=_ts(r["completed_at"]), paused_at=_ts(r["paused_at"]),
        cancelled_at=_ts(r["cancelled_at"]), error=r["error"], total=r["total"],
        processed=r["processed"], failed=r["failed"], skipped=r["skipped"],
        tolerate=r["tolerate"],
    )


def _item(r: DictRow) -> ItemRow:
    return ItemRow(
        id=r["id"], run_id=r["run_id"], stage=r["stage"], seq=r["seq"], key=r["key"],
        data=r["data"], state=r["state"], attempts=r["attempts"],
        lease_until=_ts(r["lease_until"]), not_before=_ts(r["not_before"]),
        lease_token=r["lease_token"], result=r["result"], error=r["error"],
        created_at=_ts_req(r["created_at"]), updated_at=_ts_req(r["updated_at"]),
    )
