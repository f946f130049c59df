"""The port methods of schedules and deadlines (migration 0014), written once over the dialect
hooks; ``LedgerStore`` inherits them, to keep ``base.py`` about moving items.

A firing is one transaction (:meth:`Calendar.schedule_fire`): the compare-and-set of the
schedule's next fire time (or of its waiting firing), the overlap check, the run row (deferred:
its items are written after the commit by whoever takes it, as for a run submitted inside the
caller's transaction), its deadline and ``submitted`` event, and the firing's own row. Two
sweepers that read the same next fire time both try; the second finds it moved and writes
nothing (docs/design.md, "Schedules and deadlines").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from workledger.storage import common
from workledger.storage.dialect import C, Dialect
from workledger.storage.port import (
    DeadlineRow,
    Fired,
    Firing,
    FiringRow,
    NewEvent,
    NewRun,
    ScheduleDecl,
    ScheduleRow,
)

# a firing recorded as one of these is never written again; only a failed or a waiting one is
_REWRITABLE = frozenset({"failed", "waiting"})


class Calendar(Dialect[C]):
    """Schedules, firings and deadlines; mixed into ``LedgerStore``."""

    def db_now(self) -> datetime:
        rows = self._read_tuples(self.Q["db_now"], {})
        found = self._time(rows[0][0])
        assert found is not None
        return found

    def schedules_declare(self, decls: Sequence[ScheduleDecl], replace: bool) -> None:
        """Record the declared schedules; ``replace``: a recorded one whose spec, time zone or
        job differs takes this declaration (a sweeper's first pass), else it is kept."""
        if not decls:
            return
        sql = self.Q["schedule_declare"] if replace else self.Q["schedule_declare_new"]
        with self._tx() as conn:
            self._many(conn, sql, [
                {"name": d.name, "job": d.job, "spec": d.spec, "tz": d.tz,
                 "next_at": self._at(d.next_at)} for d in decls])

    def schedules_all(self) -> list[ScheduleRow]:
        t, ts = self._time, self._ts
        return [ScheduleRow(r["name"], r["job"], r["spec"], r["tz"], t(r["next_fire_at"]),
                            t(r["waiting_fire_at"]), int(r["missed"]), ts(r["paused_at"]),
                            r["paused_by"], t(r["last_fire_at"]), r["last_run_id"])
                for r in self._read(self.Q["schedules_all"], {})]

    def schedule_fire(self, firing: Firing) -> Fired:
        at, f = self._at, firing
        with self._tx() as conn:
            if f.advance is not None:
                expected, nxt = f.advance
                moved = conn.execute(self.Q["schedule_advance"], {
                    "name": f.schedule, "expected": at(expected), "next_at": at(nxt),
                    "missed": f.missed})
                if moved.rowcount == 0:
                    return Fired("raced")
            elif f.from_waiting:
                taken = conn.execute(self.Q["schedule_take_waiting"], {
                    "name": f.schedule, "expected": at(f.fire_at)})
                if taken.rowcount == 0:
                    return Fired("raced")
            found = conn.execute(self.Q["firing_get"], {
                "name": f.schedule, "fire_at": at(f.fire_at)}).fetchone()
            if found is not None and found["state"] not in _REWRITABLE:
                return Fired("recorded", found["run_id"], was=found["state"])
            fired = self._fire(conn, f)
            conn.execute(self.Q["firing_record"], {
                "name": f.schedule, "fire_at": at(f.fire_at), "state": fired.state,
                "run_id": fired.run_id, "error": None, "actor": f.actor})
        return fired

    def _fire(self, conn: Any, f: Firing) -> Fired:
        """The firing's run, or why there is none; in the firing's transaction."""
        if f.run is None:
            return Fired("none")
        if f.overlap != "allow":
            open_run = conn.execute(self.Q["schedule_open_run"],
                                    {"name": f.schedule, "job": f.job}).fetchone()
            if open_run is not None:
                blocker = int(open_run["id"])
                if f.overlap == "wait" and conn.execute(self.Q["schedule_wait"], {
                        "name": f.schedule, "fire_at": self._at(f.fire_at)}).rowcount == 1:
                    return Fired("waiting", blocker)
                return Fired("skipped", blocker)
        run_id, created = self._insert_run(conn, f.run, f)
        return Fired("submitted", run_id, created)

    def _insert_run(self, conn: Any, new: NewRun, f: Firing) -> tuple[int, bool]:
        params = common.run_params(new)
        inserted = conn.execute(self.Q["run_insert_deferred"], params).fetchone()
        row = self._first(conn.execute(self.Q["run_by_key"], params).fetchall())
        if inserted is None:
            return int(row["id"]), False
        self._set_deadline(conn, int(row["id"]), new)
        conn.execute(self.Q["events_add"], common.run_event(
            row["id"], "submitted", f.actor, key=new.idempotency_key, deferred=True,
            schedule=f.schedule, fire_at=f.fire_at.astimezone(UTC).isoformat()))
        self._wake(conn)  # an idle worker takes its decomposition
        return int(row["id"]), True

    def _set_deadline(self, conn: Any, run_id: int, new: NewRun) -> None:
        d = new.deadline
        if d is None or (d.at is None and d.after is None):
            return
        conn.execute(self.Q["run_set_deadline"], {
            "run_id": run_id, "deadline_at": None if d.at is None else self._at(d.at),
            "deadline_in": None if d.after is None else self._lease(d.after),
            "warn_before": None if d.warn_before is None else self._ago(d.warn_before)})

    def schedule_advance(self, name: str, expected: datetime, next_at: datetime,
                         missed: int) -> bool:
        with self._tx() as conn:
            moved = conn.execute(self.Q["schedule_advance"], {
                "name": name, "expected": self._at(expected), "next_at": self._at(next_at),
                "missed": missed})
            return bool(moved.rowcount)

    def schedule_firing_failed(self, name: str, fire_at: datetime, error: str,
                               actor: str) -> None:
        with self._tx() as conn:
            conn.execute(self.Q["firing_record"], {
                "name": name, "fire_at": self._at(fire_at), "state": "failed", "run_id": None,
                "error": error, "actor": actor})

    def schedule_open_run(self, name: str, job: str) -> int | None:
        rows = self._read_tuples(self.Q["schedule_open_run"], {"name": name, "job": job})
        return int(rows[0][0]) if rows else None

    def schedule_set_paused(self, name: str, paused: bool, actor: str) -> bool:
        sql = self.Q["schedule_pause"] if paused else self.Q["schedule_resume"]
        with self._tx() as conn:
            return bool(conn.execute(sql, {"name": name, "actor": actor}).rowcount)

    def firings_list(self, name: str, limit: int) -> list[FiringRow]:
        return [self._firing(r) for r in self._read(self.Q["firings_list"],
                                                    {"name": name, "limit": limit})]

    def firings_failed(self, limit: int) -> list[FiringRow]:
        return [self._firing(r) for r in self._read(self.Q["firings_failed"], {"limit": limit})]

    def _firing(self, r: Any) -> FiringRow:
        fire_at = self._time(r["fire_at"])
        assert fire_at is not None
        return FiringRow(r["schedule"], fire_at, r["state"], r["run_id"], r["error"],
                         int(r["attempts"]), r["actor"], self._ts_req(r["recorded_at"]))

    def runs_mark_deadline_missed(self, actor: str, limit: int) -> list[int]:
        with self._tx() as conn:
            rows = conn.execute(self.Q["runs_mark_deadline_missed"], {"limit": limit}).fetchall()
            for r in rows:
                done = int(r["processed"]) + int(r["failed"]) + int(r["skipped"])
                deadline = self._time(r["deadline_at"])
                conn.execute(self.Q["events_add"], common.event_params(NewEvent(
                    run_id=int(r["id"]), kind="deadline_missed", actor=actor,
                    detail=json.dumps({"deadline": None if deadline is None
                                       else deadline.isoformat(),
                                       "left": int(r["total"]) - done,
                                       "total": int(r["total"])}))))
        return sorted(int(r["id"]) for r in rows)

    def runs_deadlines(self, limit: int) -> tuple[datetime, list[DeadlineRow]]:
        rows = self._read(self.Q["runs_deadlines"], {"limit": limit})
        if not rows:
            return self.db_now(), []
        now = self._time(rows[0]["now"])
        assert now is not None
        found = []
        for r in rows:
            deadline = self._time(r["deadline_at"])
            assert deadline is not None
            done = int(r["processed"]) + int(r["failed"]) + int(r["skipped"])
            found.append(DeadlineRow(int(r["id"]), r["job"], r["idempotency_key"], deadline,
                                     self._time(r["warn_at"]), int(r["total"]) - done,
                                     int(r["total"])))
        return now, found
