"""The adapters' shared body: every port method written once, over ``dialect.Dialect``'s hooks.

What a transaction writes, in which order, and where a failpoint marks its durable boundary is
decided here, once for both databases. Statements run in PostgreSQL's lock order: item rows
first, then the ``wl_runs`` row, then the ``wl_stage_counts`` rows sorted by (stage, state) as
the transaction's last statement. Statements that return a row per item are read as plain
tuples (``_tuples``); the few others by column name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from operator import attrgetter
from typing import Any

from workledger.core import writes
from workledger.core.states import AWAITING_VERIFY, Actor, ItemState, move
from workledger.core.status import DECOMPOSITION_FAILED
from workledger.core.writes import Unit
from workledger.errors import Refused, StorageError, UnknownRun, UsageError
from workledger.storage import common
from workledger.storage.calendar import Calendar
from workledger.storage.dialect import C, Connection
from workledger.storage.dispatching import Dispatching
from workledger.storage.overview import Overview
from workledger.storage.port import (
    AuditItems,
    ClaimableRun,
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
    NewRunItems,
    Outlook,
    Projection,
    ReclaimParams,
    Reconciled,
    RunRow,
    SettleParams,
    TenantRow,
)
from workledger.storage.queries import migrations

# the moves the adapters write themselves (the rest come as writes: core/writes.py)
_CLAIM = move("claim", Actor.WORKER)
_CANCEL = move("cancel", Actor.OPERATOR)
_CLAIMABLE, _HELD = _CLAIM.from_state.value, _CLAIM.target.value  # pending, claimed
_UNITS = tuple(u.value for u in Unit)  # the columns of runs_add_units' rows, after the run id

# The columns of a finish's and a settle's row set (``common.finish_rows``, ``settle_rows``),
# named as the parameters of a dialect that sends a row set as parallel arrays.
FINISH_COLUMNS = ("ids", "tokens", "states", "results", "errors", "delays", "charges")
SETTLE_COLUMNS = ("ids", "states", "results", "errors", "delays", "resets")


class LedgerStore(Overview[C], Dispatching[C], Calendar[C]):
    """The storage port over a dialect's hooks; ``SqliteStore`` and ``PostgresStore`` are it."""

    # -- schema ----------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        if self._up_to_date():
            return []
        applied: list[int] = []
        with self._tx() as conn:
            done = self._versions(conn)
            for version, _name, sql in migrations(self.dialect):
                if version not in done:
                    self._apply(conn, version, sql)
                    applied.append(version)
        return applied

    def _up_to_date(self) -> bool:
        """Every migration applied, read without a write transaction: opening a ledger whose
        schema is current takes no lock, so it never waits on a caller's open SQLite write
        transaction (a submit inside it opens the ledger first)."""
        try:
            found = self._read_tuples("SELECT version FROM wl_schema_version", {})
        except StorageError:  # no version table yet
            return False
        return {int(r[0]) for r in found} >= {v for v, _n, _s in migrations(self.dialect)}

    # -- runs --------------------------------------------------------------------------------

    # -- waking idle workers -------------------------------------------------------------------

    wakes_other_processes = False

    def wait_for_work(self, timeout: float) -> bool:
        time.sleep(timeout)
        return False

    def run_submit(self, new: NewRun) -> tuple[RunRow, bool]:
        params = common.run_params(new)
        with self._tx() as conn:
            inserted = conn.execute(self.Q["run_insert"], params).fetchone()
            row = self._first(conn.execute(self.Q["run_by_key"], params).fetchall())
            if inserted is not None:
                self._set_deadline(conn, int(row["id"]), new)
                conn.execute(self.Q["events_add"], common.run_event(
                    row["id"], "submitted", None, key=new.idempotency_key))
        if inserted is not None:
            common.failpoint("submit.after_commit")
        return self._run(row), inserted is not None

    def runs_submit_many(self, runs: Sequence[NewRunItems],
                         check: Callable[[RunRow, NewRun], None] | None = None
                         ) -> list[tuple[RunRow, bool]]:
        """Many small runs in one transaction (docs/design.md, "Many runs at once"): the
        run rows, then every new run's items, counts, events and mark, each a statement over
        all of them, so that 10,000 runs cost a few statements, not a transaction each."""
        if not runs:
            return []
        out: list[tuple[RunRow, bool] | None] = [None] * len(runs)
        with self._tx() as conn:
            made = {str(r[1]): int(r[0]) for r in self._tuples(
                conn, self.Q["runs_insert_many"], self._new_runs_rows(runs))}
            new: dict[int, int] = {}  # index -> run id of the runs this call records
            for i, entry in enumerate(runs):
                key = entry.run.idempotency_key
                if key in made:
                    new[i] = made[key]
                    continue
                run = self._run(self._first(conn.execute(
                    self.Q["run_by_key"], common.run_params(entry.run)).fetchall()))
                if check is not None:
                    check(run, entry.run)
                out[i] = (run, False)
            if new:
                self._record_many(conn, runs, new, out)
        if new:
            common.failpoint("submit.after_commit")
        return [got for got in out if got is not None]

    def _record_many(self, conn: C, runs: Sequence[NewRunItems], new: dict[int, int],
                     out: list[tuple[RunRow, bool] | None]) -> None:
        for i, run_id in new.items():
            if runs[i].run.deadline is not None:
                self._set_deadline(conn, run_id, runs[i].run)
        ids = self._list(new.values())
        conn.execute(self.Q["events_submitted_many"], {"run_ids": ids})
        batches = [ItemsInsert(run_id, runs[i].stage, runs[i].items)
                   for i, run_id in new.items() if runs[i].items]
        tallies = {b.run_id: common.inserted_tally(b.stage, b.items, set()) for b in batches}
        if batches:
            self._insert_items_of_runs(conn, batches)
            self._count_runs(conn, tallies)
        marks = [[run_id, len(runs[i].items),
                  sum(n for (_, state), n in tallies[run_id].delta.items()
                      if state == ItemState.SKIPPED.value) if run_id in tallies else 0]
                 for i, run_id in new.items()]
        rows = {r.id: r for r in map(self._run, conn.execute(
            self.Q["runs_mark_new"], self._marks_rows(marks)).fetchall())}
        conn.execute(self.Q["events_decomposed_many"], {"run_ids": ids})
        self._wake(conn)
        for i, run_id in new.items():
            out[i] = (rows[run_id], True)

    # -- submitting inside the caller's transaction (docs/design.md) ---------------------------

    _same: tuple[Any, ...] | None = None  # this ledger's identity (``_identity``), once read

    def run_submit_in(self, conn: Any, new: NewRun) -> tuple[RunRow, bool]:
        """Only the run row (marked deferred) and its ``submitted`` event, on the caller's
        connection: a large payload's items are written after the commit, by whoever takes
        the run (``run_take_deferred``), so they never hold the caller's transaction open."""
        params = common.run_params(new)
        with self._foreign_tx(conn) as theirs:
            inserted = theirs.execute(self.Q["run_insert_deferred"], params).fetchone()
            row = self._first(theirs.execute(self.Q["run_by_key_in"], params).fetchall())
            if inserted is not None:
                self._set_deadline(theirs, int(row["id"]), new)
                theirs.execute(self.Q["events_add"], common.run_event(
                    row["id"], "submitted", None, key=new.idempotency_key, deferred=True))
        # the caller's driver decodes JSON its own way: the payload was read as text
        run = replace(self._run(row), payload=common.loads(row["payload_text"]))
        return run, inserted is not None

    def _check_same_ledger(self, theirs: Connection) -> None:
        """``UsageError`` unless the caller's connection is on this ledger (``_foreign_tx``)."""
        found, where = self._identity(theirs)
        if found == self._same:
            return
        with self._reader() as own:  # read again: a restarted server is the same ledger
            self._same, mine = self._identity(own)
        if found != self._same:
            other = " (another server)" if where == mine else ""
            raise UsageError(
                f"the connection is not on this ledger's database: it is on {where}, the "
                f"ledger on {mine}{other}; pass a connection to the ledger's database (the "
                "same file; on PostgreSQL the same database and schema)")

    def runs_deferred(self, jobs: Sequence[str] | None, limit: int = 100) -> list[RunRow]:
        rows = self._read(self.Q["runs_deferred"], {
            "jobs": None if jobs is None else self._list(jobs), "limit": limit})
        return [self._run(r) for r in rows]

    def run_take_deferred(self, run_id: int) -> RunRow | None:
        with self._tx() as conn:
            row = conn.execute(self.Q["run_take_deferred"], {"run_id": run_id}).fetchone()
        return None if row is None else self._run(row)

    def run_get(self, run_id: int) -> RunRow | None:
        rows = self._read(self.Q["run_get"], {"run_id": run_id})
        return self._run(rows[0]) if rows else None

    def run_payload(self, run_id: int) -> Any:
        rows = self._read_tuples(self.Q["run_payload"], {"run_id": run_id})
        if not rows:
            raise UnknownRun(f"no run {run_id}")
        return self._json(rows[0][0])

    def runs_list(self, limit: int = 100, before: int | None = None,
                  tenant: str | None = None) -> list[RunRow]:
        rows = self._read(self.Q["runs_list"], {"limit": limit, "before": before,
                                                "tenant": tenant})
        return [self._run(r) for r in rows]

    def runs_count(self, before: int | None = None, tenant: str | None = None) -> int:
        return int(self._first(self._read_tuples(self.Q["runs_count"], {
            "before": before, "tenant": tenant}))[0])

    def run_mark_decomposed(self, run_id: int, first_stage: str) -> RunRow:
        common.failpoint("decompose.before_mark")
        with self._tx() as conn:
            # The run row first, then the recount in a statement of its own: an UPDATE that
            # waited for the row (a cancel, a batch) would otherwise write the counts of the
            # snapshot it took before the wait (PostgreSQL, READ COMMITTED).
            conn.execute(self.Q["run_lock"], {"run_id": run_id}).fetchone()
            row = conn.execute(self.Q["run_mark_decomposed"],
                               {"run_id": run_id, "stage": first_stage}).fetchone()
            if row is None:
                raise UnknownRun(f"no run {run_id}")
            conn.execute(self.Q["events_add"], common.run_event(run_id, "decomposed", None,
                                                                total=row["total"]))
            self._wake(conn)
        common.failpoint("decompose.after_mark")
        return self._run(row)

    def run_record_error(self, run_id: int, error: str | None,
                         actor: str | None = None) -> None:
        """Record the decomposer's error on the run, and a ``decomposition_failed`` event (their
        count is how often it failed: status and audit report a run that keeps failing)."""
        with self._tx() as conn:
            conn.execute(self.Q["run_record_error"], {"run_id": run_id, "error": error})
            if error is not None:
                conn.execute(self.Q["events_add"], common.run_event(
                    run_id, DECOMPOSITION_FAILED, actor, error=error))

    def runs_claimable(self, jobs: Sequence[str]) -> list[ClaimableRun]:
        rows = self._read_tuples(self.Q["runs_claimable"], {"jobs": self._list(jobs)})
        return [ClaimableRun(int(r[0]), str(r[1]), int(r[2]), r[3], int(r[4])) for r in rows]

    def runs_top_priority(self, jobs: Sequence[str]) -> int | None:
        rows = self._read_tuples(self.Q["runs_top_priority"], {"jobs": self._list(jobs)})
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def run_set_priority(self, run_id: int, priority: int, actor: str,
                         note: str | None) -> bool:
        with self._tx() as conn:
            was = conn.execute(self.Q["run_priority"], {"run_id": run_id}).fetchone()
            if was is None:  # completed since the caller looked (or never was)
                raise Refused(f"run {run_id} is complete or unknown: a finished run is not "
                              "given a new priority; nothing changed")
            if int(was["priority"]) == priority:
                return False
            conn.execute(self.Q["run_set_priority"], {"run_id": run_id, "priority": priority})
            conn.execute(self.Q["events_add"], common.run_event(
                run_id, "priority_changed", actor, **{"from": int(was["priority"]), "to": priority,
                                                      "note": note}))
            self._wake(conn)  # idle workers look again: the claim order changed
        return True

    def tenant_set_weight(self, name: str, weight: int, actor: str,
                          note: str | None) -> bool:
        with self._tx() as conn:
            was = conn.execute(self.Q["tenant_weight"], {"name": name}).fetchone()
            if was is not None and int(was["weight"]) == weight:
                return False
            conn.execute(self.Q["tenant_set_weight"], {"name": name, "weight": weight,
                                                       "actor": actor, "note": note})
        return True

    def tenants_list(self) -> list[TenantRow]:
        return [TenantRow(str(r["name"]), int(r["weight"]), self._ts_req(r["updated_at"]),
                          r["updated_by"], r["note"])
                for r in self._read(self.Q["tenants_list"], {})]

    def tenant_open_runs(self, name: str) -> int:
        return int(self._first(self._read_tuples(self.Q["tenant_open_runs"],
                                                 {"tenant": name}))[0])

    def run_counts(self, run_id: int) -> dict[str, dict[str, int]]:
        return common.counts_of(self._read_tuples(self.Q["run_counts"], {"run_id": run_id}))

    def run_waits(self, run_id: int) -> tuple[int, int, int]:
        expired, waiting, verifying = self._first(self._read_tuples(
            self.Q["run_waits"], {"run_id": run_id, "verify": AWAITING_VERIFY}))
        return int(expired), int(waiting), int(verifying)

    def runs_undecomposed(self, grace_seconds: float, backoff: float = 0.0) -> list[RunRow]:
        rows = self._read(self.Q["runs_undecomposed"], {"grace": self._ago(grace_seconds),
                                                        "backoff": float(backoff)})
        return [self._run(r) for r in rows]

    def runs_to_close(self, jobs: Sequence[str], stage: str) -> list[int]:
        rows = self._read_tuples(self.Q["runs_to_close"],
                                 {"jobs": self._list(jobs), "stage": stage})
        return [int(r[0]) for r in rows]

    def run_set_paused(self, run_id: int, paused: bool, actor: str, note: str | None) -> bool:
        sql = self.Q["run_pause"] if paused else self.Q["run_resume"]
        with self._tx() as conn:
            done = conn.execute(sql, {"run_id": run_id}).fetchone()
            if done is not None and not paused:
                self._wake(conn)
            if done is not None:
                kind = "paused" if paused else "resumed"
                conn.execute(self.Q["events_add"],
                             common.run_event(run_id, kind, actor, note=note))
        return done is not None

    def run_cancel(self, run_id: int, actor: str, note: str | None) -> int:
        with self._tx() as conn:
            if conn.execute(self.Q["run_cancel"], {"run_id": run_id}).fetchone() is None:
                return -1
            tally = common.Tally()
            n = self._cancel_pending(conn, run_id, actor, tally)
            conn.execute(self.Q["events_add"], common.run_event(run_id, "cancelled", actor,
                                                                note=note, items=n))
            self._count(conn, run_id, tally)
        return n

    def _cancel_pending(self, conn: C, run_id: int, actor: str, tally: common.Tally) -> int:
        """Skip the run's pending items (reason ``cancelled``); an item that had a reason or
        charged attempts keeps them in a ``skipped`` event. Returns how many were skipped."""
        kept = self._tuples(conn, self.Q["items_pending_history"], {"run_id": run_id})
        cancelled = self._tuples(conn, self.Q["items_cancel_pending"], {"run_id": run_id})
        if kept:
            self._many(conn, self.Q["events_add"], common.cancel_events(run_id, kept, actor))
        if cancelled:
            tally.merge(common.Tally.moves((r[1] for r in cancelled),
                                           _CANCEL.from_state.value, _CANCEL.target.value))
            units = sum(1 for r in cancelled if writes.unit_of(_CANCEL.target, r[1], True))
            conn.execute(self.Q["run_add_units"], {"run_id": run_id, **common.no_units(),
                                                   Unit.SKIPPED.value: units})
        return len(cancelled)

    def _skip_if_cancelled(self, conn: C, run_id: int, actor: str, tally: common.Tally,
                           units: dict[str, int] | None = None) -> None:
        """Add ``units`` to the run's counters; if the run was cancelled meanwhile, skip what
        is pending in it: a cancel wins over every way back to pending (a retry or a hand-off,
        a release, an expired lease, a late decomposition batch), since nothing would ever
        claim it in a cancelled run."""
        add = {**common.no_units(), **(units or {})}
        row = conn.execute(self.Q["run_add_units"], {"run_id": run_id, **add}).fetchone()
        if row is not None and row["cancelled_at"] is not None:
            self._cancel_pending(conn, run_id, actor, tally)

    def _runs_add_units(self, conn: C, plans: common.RunPlans, actor: str) -> None:
        """``_skip_if_cancelled`` for the runs of a chunk claimed across runs: their run rows
        locked in id order, then every run's counters in one statement."""
        ids = sorted(plans)
        self._tuples(conn, self.Q["runs_lock"], {"run_ids": self._list(ids)})
        rows = [[run_id, *(plans[run_id][0].units.get(u, 0) for u in _UNITS)] for run_id in ids]
        for run_id, cancelled_at in self._tuples(conn, self.Q["runs_add_units"],
                                                 self._units_rows(rows)):
            if cancelled_at is not None:
                self._cancel_pending(conn, int(run_id), actor, plans[int(run_id)][1])

    def run_reconcile(
        self, run_id: int, derive: Callable[[RunRow, dict[str, dict[str, int]]], Projection],
        repair: bool, actor: str,
    ) -> Reconciled:
        # One transaction holding the run row and then its counter rows, in the writers' order
        # (PostgreSQL: FOR UPDATE, so a transaction that moves them waits; SQLite: one writer).
        # Items and counters are then read by one statement, from one snapshot.
        with self._tx() as conn:
            locked = conn.execute(self.Q["run_lock"], {"run_id": run_id}).fetchone()
            if locked is None:
                raise UnknownRun(f"no run {run_id}")
            run = self._run(locked)
            conn.execute(self.Q["counts_lock"], {"run_id": run_id}).fetchall()
            counts, stored_counts = common.compared_counts(
                self._tuples(conn, self.Q["run_counts_compare"], {"run_id": run_id}))
            derived = derive(run, counts)
            stored = common.projection_of(run)
            fix = repair and (stored != derived or stored_counts != counts)
            if fix:
                conn.execute(self.Q["run_set_projection"], {"run_id": run_id, **vars(derived)})
                conn.execute(self.Q["events_add"], common.reconcile_event(
                    run_id, actor, stored, derived, stored_counts, counts))
                self._add_counts(conn, common.count_repairs(run_id, stored_counts, counts))
                common.failpoint("reconcile.before_commit")
        return Reconciled(stored=stored, derived=derived, repaired=fix,
                          stored_counts=stored_counts, ledger_counts=counts)

    def outlook(self, run_ids: Sequence[int]) -> Outlook:
        rows = self._read_tuples(self.Q["outlook"], {"run_ids": self._list(run_ids)})
        return common.outlook_from_row(tuple(self._first(rows)))

    # -- items: decomposition and leases -----------------------------------------------------

    def items_insert_many(self, params: ItemsInsert) -> int:
        items = params.items
        if not items:
            return 0
        rows = self._item_rows(params)
        with self._tx() as conn:
            self._lock_decomposition(conn, params.run_id)
            # the rows already there (a re-decomposition) are not counted again
            present = {r[0] for r in self._tuples(conn, self.Q["items_keys"], {
                "run_id": params.run_id, "stage": params.stage, **common.seq_range(items)})}
            inserted = self._insert_items(conn, rows)
            tally = common.inserted_tally(params.stage, items, present)
            if inserted:
                # counted now, not only by the mark: a run cancelled before its cut-short
                # decomposition was resumed is never marked decomposed (invariant 2)
                self._skip_if_cancelled(conn, params.run_id, "decomposer", tally,
                                        common.inserted_units(params.stage, tally))
            self._count(conn, params.run_id, tally)
        common.failpoint("decompose.after_batch")
        return inserted

    def items_claim(self, params: ClaimParams) -> list[ClaimedItem]:
        with self._tx() as conn:
            if params.stages:
                rows = self._claim_by_stage(conn, params)
            elif params.run_ids:
                rows = self._tuples(conn, self.Q["items_claim_runs"], {
                    "lease": self._lease(params.lease_seconds), "run_id": params.run_id,
                    "run_ids": self._list(params.run_ids), "limit": params.limit,
                    "holder": params.holder, **self._lease_token(conn)})
            else:
                rows = self._tuples(conn, self.Q["items_claim"], {
                    "lease": self._lease(params.lease_seconds), "run_id": params.run_id,
                    "after_id": params.after_id, "limit": params.limit,
                    "closing": params.closing, "holder": params.holder,
                    **self._lease_token(conn)})
            claimed = common.claimed_items(rows, decode=self.json_as_text)
            if claimed:
                self._lease_token_taken(conn)
            if params.record_event and claimed:
                # a limited claim's events carry the time its buckets were spent
                events = self.Q["events_add_now"] if params.stages else self.Q["events_add"]
                self._many(conn, events, common.claim_events(claimed, params.actor))
            if claimed:
                self._count_runs(conn, common.tallies_of_claim(rows, _CLAIMABLE, _HELD))
        common.failpoint("claim.after_commit")
        return claimed

    def items_mark_started(self, params: LeaseParams, charge: int = 1) -> list[int]:
        with self._tx() as conn:
            return self._mark_started(conn, params.ids, params.lease_token, charge)

    def items_heartbeat(self, params: LeaseParams) -> int:
        with self._tx() as conn:
            cur = conn.execute(self.Q["items_heartbeat"], {
                "ids": self._list(params.ids), "token": params.lease_token,
                "lease": self._lease(params.lease_seconds)})
            return int(cur.rowcount)

    def items_release(self, params: LeaseParams) -> int:
        with self._tx() as conn:
            rows = self._tuples(conn, self.Q["items_release"], {
                "ids": self._list(params.ids), "token": params.lease_token})
            tally = common.Tally.moves((r[0] for r in rows), _HELD, _CLAIMABLE)
            if rows:
                self._skip_if_cancelled(conn, params.run_id, params.actor, tally)
            self._count(conn, params.run_id, tally)
            return len(rows)

    def leases_reclaim_expired(self, params: ReclaimParams) -> list[ItemRow]:
        with self._tx() as conn:
            rows = conn.execute(self.Q["leases_reclaim_expired"], {
                "to_state": params.to_state, "reason": params.reason, "job": params.job,
                "stage": params.stage, "limit": params.limit,
                "unstarted": params.unstarted, "again": params.again,
                **self._reclaim_params()}).fetchall()
            items = sorted(map(self._item, rows), key=attrgetter("id"))
            if items:
                self._wake(conn)
                self._many(conn, self.Q["events_add"], [
                    common.event_params(e) for e in common.reclaim_events(items, params)])
                tallies = common.reclaim_tallies(items)
                back = {i.run_id for i in items if i.state == _CLAIMABLE}
                for run_id in sorted(tallies):
                    if run_id in back:
                        self._skip_if_cancelled(conn, run_id, params.actor, tallies[run_id])
                    self._count(conn, run_id, tallies[run_id])
                common.failpoint("reclaim.before_commit")
        if items:
            common.failpoint("reclaim.after_commit")
        return items

    # -- items: outcomes ---------------------------------------------------------------------

    def items_finish_if_leased(self, params: FinishParams) -> FinishResult:
        if not params.finishes:
            return self._start_only(params)
        common.checked_finishes(params)
        with self._tx() as conn:
            groups = common.finish_groups(params.finishes, self.finish_shapes)
            if groups is None:
                plans, applied = self._finish_rows(conn, params)
            else:
                plans, applied = self._finish_groups(conn, params, groups)
            started = self._mark_started(conn, params.start, params.start_token,
                                         params.start_charge)
            self._write_plans(conn, plans, params.actor)
            common.failpoint("complete.before_commit")
            if any(plan.handoffs for plan, _ in plans.values()):
                common.failpoint("handoff.before_commit")
        common.failpoint("complete.after_commit")
        stale = [i for plan, _ in plans.values() for i in plan.stale]
        return FinishResult(applied=sorted(applied), stale=sorted(stale), started=started)

    def _start_only(self, params: FinishParams) -> FinishResult:
        if not params.start:
            return FinishResult(applied=[], stale=[])
        with self._tx() as conn:
            started = self._mark_started(conn, params.start, params.start_token,
                                         params.start_charge)
        return FinishResult(applied=[], stale=[], started=started)

    def _mark_started(self, conn: C, ids: Sequence[int], token: int, charge: int = 0
                      ) -> list[int]:
        if not ids:
            return []
        rows = self._tuples(conn, self.Q["items_mark_started"], {
            "ids": self._list(ids), "token": token, "charge": charge})
        return sorted(int(r[0]) for r in rows)

    def _finish_rows(self, conn: C, params: FinishParams) -> tuple[common.RunPlans, set[int]]:
        """The fenced update with a value per column per row (outcomes of many shapes)."""
        found = self._tuples(conn, self.Q["items_finish_if_leased"], self._row_set(
            common.finish_rows(params.finishes), FINISH_COLUMNS))
        applied = {int(r[0]) for r in found}
        plans: common.RunPlans = {}
        for run_params, run_found in common.by_run(params, found):
            plan = common.plan_after_finish(run_params, applied)
            plans[run_params.run_id] = (plan, common.Tally.of_moves(run_found, plan.moved, _HELD))
        return plans, applied

    def _finish_groups(self, conn: C, params: FinishParams,
                       groups: dict[common.GroupKey, list[int]]
                       ) -> tuple[common.RunPlans, set[int]]:
        """One fenced update per outcome shape, over an id list (most chunks: one shape), over
        every run of the chunk at once."""
        by_group = {key: self._tuples(conn, self.Q["items_finish_group"], {
            "token": key[0], "state": key[1].state, "result": key[2], "error": key[3],
            "delay": key[4], "charge": key[5], "ids": self._list(ids)})
            for key, ids in groups.items()}
        plans = common.plans_after_groups(params, groups, by_group)
        return plans, {r[0] for rows in by_group.values() for r in rows}

    def items_settle(self, params: SettleParams) -> FinishResult:
        common.checked_settles(params)
        args = self._row_set(common.settle_rows(params.settles), SETTLE_COLUMNS)
        args.update(from_state=params.from_state, run_id=params.run_id)
        with self._tx() as conn:
            found = self._tuples(conn, self.Q["items_settle"], args)
            applied = {int(r[0]) for r in found}
            if applied:  # a redrive, a resolution or a verdict may make items claimable
                self._wake(conn)
            plan = common.plan_after_settle(params, applied)
            self._write_plans(conn, {params.run_id: (plan, common.Tally.of_moves(
                found, plan.moved, params.from_state))}, params.actor)
        return FinishResult(applied=sorted(applied), stale=plan.stale)

    def _write_plans(self, conn: C, plans: common.RunPlans, actor: str) -> None:
        """What a finish or a settle writes besides the items, for each run of its chunk:
        hand-offs, counters, history. Each plan's tally holds the count moves of the guarded
        update itself. The run rows are taken in id order, and the stage counts go last, all
        runs' in one sorted statement: they are the rows every transaction of a run touches."""
        handoffs = [h for plan, _ in plans.values() for h in plan.handoffs]
        if handoffs:
            for run_id, stage in self._tuples(conn, self.Q["items_handoff"],
                                              self._handoff_rows(handoffs)):
                plans[run_id][1].add(stage, _CLAIMABLE)
        if len(plans) == 1:
            for run_id, (plan, tally) in plans.items():
                self._skip_if_cancelled(conn, run_id, actor, tally, plan.units)
        else:
            self._runs_add_units(conn, plans, actor)
        events = [common.event_params(e) for plan, _ in plans.values() for e in plan.events]
        if events:
            self._many(conn, self.Q["events_add"], events)
        self._count_runs(conn, {run_id: tally for run_id, (_, tally) in plans.items()})

    # -- items: reads ------------------------------------------------------------------------

    def items_list(self, query: ItemsQuery) -> list[ItemRow]:
        rows = self._read(self.Q["items_list"], {
            "run_id": query.run_id, "stage": query.stage, "state": query.state,
            "limit": query.limit, "after_id": query.after_id, "seq": query.seq})
        return [self._item(r) for r in rows]

    def items_count(self, query: ItemsQuery) -> int:
        rows = self._read_tuples(self.Q["items_count"], {
            "run_id": query.run_id, "stage": query.stage, "state": query.state,
            "after_id": query.after_id})
        return int(self._first(rows)[0])

    def items_keys(self, run_id: int, stage: str, lo: int, hi: int) -> dict[int, str | None]:
        rows = self._read_tuples(self.Q["items_keys"],
                                 {"run_id": run_id, "stage": stage, "lo": lo, "hi": hi})
        return {int(r[0]): r[1] for r in rows}

    def items_attention(self, states: Sequence[str], limit: int = 1000,
                        after_id: int = 0) -> list[ItemRow]:
        rows = self._read(self.Q["items_attention"], {"states": self._list(states),
                                                      "limit": limit, "after_id": after_id})
        return [self._item(r) for r in rows]

    def _reclaim_params(self) -> dict[str, Any]:
        """What a dialect adds to judge a lease expired (SQLite: the live holders)."""
        return {}

    def leases_expired(self, limit: int = 1000, after_id: int = 0) -> list[ItemRow]:
        rows = self._read(self.Q["leases_expired"], {"limit": limit, "after_id": after_id,
                                                     **self._reclaim_params()})
        return [self._item(r) for r in rows]

    def items_audit(self, params: AuditItems) -> list[ItemRow]:
        query = self.Q["audit_expired"] if params.kind == "expired" else self.Q["audit_attention"]
        rows = self._read(query, {
            "run_id": params.run_id, "job": params.job, "since": params.since,
            "after_id": params.after_id, "limit": params.limit})
        return [self._item(r) for r in rows]

    # -- events ------------------------------------------------------------------------------

    def events_add(self, events: Sequence[NewEvent]) -> None:
        if not events:
            return
        with self._tx() as conn:
            self._many(conn, self.Q["events_add"], [common.event_params(e) for e in events])

    def events_list(self, run_id: int, item_id: int | None = None,
                    kind: str | None = None) -> list[EventRow]:
        rows = self._read(self.Q["events_list"], {"run_id": run_id, "item_id": item_id,
                                                  "kind": kind})
        return [self._event(r) for r in rows]
