"""The port methods an operator's view and retention need, written once over the dialect hooks.

Reads for the HTTP layer and metrics (run pages, reasons grouped, ledger-wide counts) and the
steps of pruning a finished run. Every read is bounded: a page, a window of index entries, or a
summary of a few rows, so that none of them walks a run of a million items. ``LedgerStore``
inherits these; they are here to keep ``base.py`` about moving items.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from workledger.core.states import ItemState
from workledger.storage import common
from workledger.storage.dialect import C, Dialect
from workledger.storage.port import (
    Attention,
    EventRow,
    FinishedRuns,
    ItemRow,
    ItemsQuery,
    ReasonGroup,
    RunRow,
    RunsQuery,
)

NO_CURSOR = 2**62  # above every run id: the first page


class Overview(Dialect[C]):
    """Reads for operators and the steps of retention; mixed into ``LedgerStore``."""

    # -- reads -------------------------------------------------------------------------------

    def runs_page(self, query: RunsQuery) -> list[RunRow]:
        before = NO_CURSOR if query.before is None else query.before
        rows = self._read(self.Q["runs_page"], {"before": before, "job": query.job,
                                                "limit": query.limit})
        return [self._run(r) for r in rows]

    def runs_open(self) -> list[RunRow]:
        return [self._run(r) for r in self._read(self.Q["runs_open"], {})]

    def runs_finished_summary(self) -> list[FinishedRuns]:
        rows = self._read_tuples(self.Q["runs_finished_summary"], {})
        return [FinishedRuns(str(job), bool(cancelled), int(failed), int(total),
                             None if tolerate is None else float(tolerate), int(n))
                for job, cancelled, failed, total, tolerate, n in rows]

    def counts_open(self) -> list[tuple[str, str, str, int]]:
        rows = self._read_tuples(self.Q["counts_open"], {})
        return [(str(job), str(stage), str(state), int(n)) for job, stage, state, n in rows]

    def pending_heads(self, run_id: int, window: int) -> dict[str, float]:
        rows = self._read_tuples(self.Q["pending_heads"], {"run_id": run_id, "window": window})
        return {str(stage): max(0.0, float(age)) for stage, age in rows}

    def attention_totals(self) -> Attention:
        expired, unknown, failed = self._first(self._read_tuples(self.Q["attention_totals"], {}))
        return Attention(int(expired), int(unknown), int(failed))

    def run_attention(self, query: ItemsQuery) -> list[ItemRow]:
        rows = self._read(self.Q["run_attention"], {
            "run_id": query.run_id, "state": query.state, "stage": query.stage,
            "after_id": query.after_id, "limit": query.limit})
        return [self._item(r) for r in rows]

    def run_reasons(self, run_id: int, state: str, window: int, groups: int
                    ) -> list[ReasonGroup]:
        args = {"run_id": run_id, "state": state, "window": window, "groups": groups}
        if state == ItemState.SKIPPED:
            rows = self._read_tuples(self.Q["run_skip_reasons"], args)
        else:
            rows = self._read_tuples(self.Q["run_attention_reasons"], args)
        return [ReasonGroup(str(stage), error, int(n), int(first)) for stage, error, n, first
                in rows]

    def items_by_key(self, query: ItemsQuery, key: str) -> list[ItemRow]:
        rows = self._read(self.Q["items_by_key"], {
            "run_id": query.run_id, "key": key, "stage": query.stage, "state": query.state,
            "after_id": query.after_id, "limit": query.limit})
        return [self._item(r) for r in rows]

    def events_page(self, run_id: int, after_id: int, limit: int) -> list[EventRow]:
        rows = self._read(self.Q["events_page"], {"run_id": run_id, "after_id": after_id,
                                                  "limit": limit})
        return [self._event(r) for r in rows]

    # -- retention: a run's row first, then its items and events in batches, its counts last -

    def runs_prunable(self, cutoff_seconds: float, job: str | None, after_id: int,
                      limit: int) -> list[RunRow]:
        rows = self._read(self.Q["runs_prunable"], {
            "cutoff": self._ago(cutoff_seconds), "job": job, "after_id": after_id,
            "limit": limit})
        return [self._run(r) for r in rows]

    def run_prune(self, run_id: int, cutoff_seconds: float, with_events: bool) -> bool:
        """Delete the run's row if it is still finished before the cutoff; with ``with_events``
        (a run without items, whose few events no counter row marks) its events too."""
        with self._tx() as conn:
            gone = conn.execute(self.Q["run_prune"], {
                "run_id": run_id, "cutoff": self._ago(cutoff_seconds)}).fetchone()
            if gone is not None and with_events:
                while self._tuples(conn, self.Q["events_prune"], {"run_id": run_id,
                                                                  "limit": 10_000}):
                    pass
        return gone is not None

    def items_prune(self, run_id: int, limit: int) -> int:
        with self._tx() as conn:
            rows = self._tuples(conn, self.Q["items_prune"], {"run_id": run_id, "limit": limit})
            tally = common.Tally()
            for stage, state in map(itemgetter(0, 1), rows):
                tally.add(stage, state, -1)
            self._count(conn, run_id, tally)
        return len(rows)

    def events_prune(self, run_id: int, limit: int) -> int:
        with self._tx() as conn:
            return len(self._tuples(conn, self.Q["events_prune"], {"run_id": run_id,
                                                                   "limit": limit}))

    def counts_prune(self, run_id: int) -> None:
        with self._tx() as conn:
            conn.execute(self.Q["counts_prune"], {"run_id": run_id})

    def runs_orphaned(self) -> list[int]:
        return [int(r[0]) for r in self._read_tuples(self.Q["runs_orphaned"], {})]

    def runs_unclosed(self, run_ids: Sequence[int]) -> list[int]:
        """Of ``run_ids``, those submitted with a closing hook that has not run yet: whoever
        prunes, with the app or without it, keeps them (``run_prune`` refuses them too)."""
        if not run_ids:
            return []
        rows = self._read_tuples(self.Q["runs_unclosed"], {"run_ids": self._list(run_ids)})
        return [int(r[0]) for r in rows]
