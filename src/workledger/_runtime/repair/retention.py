"""Retention: delete runs finished before a cutoff, with their items, events and counts.

A run is pruned only when it is complete (every item terminal, which a cancelled run's are once
its pending items were skipped) and finished before the cutoff; a run with an ``unknown`` item
is not complete, so it is never pruned. Nor is a complete run whose closing hook has not run
yet: the run records at submit whether its job declared one (migration 0012), so ``prune``
keeps it whether or not the app is loaded (and the statement that deletes the row checks it
again); for runs older than that record, the loaded app's declarations decide. With an
export, the run's row (with its payload), every item and every event are written to a JSON
Lines file and flushed to disk before anything is deleted.

The deletion runs in short transactions so that workers are never held up for long: first the
run's row (checked again in the same statement), after which nothing can claim, redrive or
resolve anything of the run; then its items and events in batches of ``batch`` rows, each
batch moving ``wl_stage_counts`` down with it (invariant 11); its counter rows last. A prune
that stopped part-way leaves counter rows without a run, and the next prune finishes them first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TextIO

from workledger.core.states import TERMINAL, ItemState
from workledger.core.status import CLOSE_STAGE
from workledger.jobs import Job
from workledger.storage.port import ItemsQuery, RunRow, Store

BATCH = 5000
OPEN = tuple(s.value for s in ItemState if s not in TERMINAL)  # pending, claimed, unknown
PAGE = 100


@dataclass
class PruneReport:
    dry_run: bool
    runs: list[int] = field(default_factory=list)  # pruned (or, dry run, that would be)
    items: int = 0  # deleted (dry run: that would be)
    events: int = 0  # deleted (not counted by a dry run)
    resumed: list[int] = field(default_factory=list)  # left part-way by an earlier prune
    kept: list[int] = field(default_factory=list)  # changed since listed: not pruned
    closing: list[int] = field(default_factory=list)  # kept: their closing hook has not run

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _line(out: TextIO, kind: str, row: Any) -> None:
    out.write(json.dumps({"type": kind, **asdict(row)}, default=str, sort_keys=False) + "\n")


def export_run(store: Store, run: RunRow, out: TextIO) -> None:
    """One line for the run (with its payload), then one per item and per event."""
    full = store.run_get(run.id) or run  # listings leave the payload out: read it here
    _line(out, "run", replace(full, payload=store.run_payload(run.id)))
    after = 0
    while items := store.items_list(ItemsQuery(run.id, None, None, BATCH, after)):
        for item in items:
            _line(out, "item", item)
        after = items[-1].id
    after = 0
    while events := store.events_page(run.id, after, BATCH):
        for event in events:
            _line(out, "event", event)
        after = events[-1].id
    out.flush()
    os.fsync(out.fileno())


def _drain(store: Store, run_id: int, batch: int, report: PruneReport) -> None:
    while n := store.items_prune(run_id, batch):
        report.items += n
    while n := store.events_prune(run_id, batch):
        report.events += n
    store.counts_prune(run_id)


def _hooks_pending(store: Store, jobs: Mapping[str, Job]) -> set[int]:
    """Complete runs whose closing hook, as the loaded app declares it, has not run yet."""
    waiting: set[int] = set()
    for job in jobs.values():
        if job.closing is not None:
            waiting.update(store.runs_to_close([job.name], CLOSE_STAGE))
    return waiting


def _unclosed(store: Store, page: list[RunRow], declared: set[int]) -> set[int]:
    """Runs of ``page`` not finished for retention: their closing hook has not run yet, as
    the ledger records it (app or no app) or as the loaded app declares it."""
    return declared.intersection(r.id for r in page) | set(
        store.runs_unclosed([r.id for r in page]))


def _kept(store: Store, run_id: int, report: PruneReport) -> None:
    """The delete refused a run: its closing hook came due meanwhile, or it changed."""
    (report.closing if store.runs_unclosed([run_id]) else report.kept).append(run_id)


def prune(store: Store, jobs: Mapping[str, Job], older_than: float, *, job: str | None = None,
          dry_run: bool = False, export: TextIO | None = None,
          batch: int = BATCH) -> PruneReport:
    """Prune runs finished more than ``older_than`` seconds ago (by the database clock)."""
    report = PruneReport(dry_run=dry_run)
    if not dry_run:
        for run_id in store.runs_orphaned():
            _drain(store, run_id, batch, report)
            report.resumed.append(run_id)
    hooks = _hooks_pending(store, jobs)
    after = 0
    while page := store.runs_prunable(older_than, job, after, PAGE):
        after = page[-1].id
        unclosed = _unclosed(store, page, hooks)
        for run in page:
            if run.id in unclosed:
                report.closing.append(run.id)
                continue
            counts = store.run_counts(run.id)
            if any(n for states in counts.values() for state, n in states.items()
                   if state in OPEN):  # its stored completion is wrong: reconcile will say
                report.kept.append(run.id)
                continue
            if dry_run:
                report.runs.append(run.id)
                report.items += sum(n for states in counts.values() for n in states.values())
                continue
            if export is not None:
                export_run(store, run, export)
            if not store.run_prune(run.id, older_than, with_events=not counts):
                _kept(store, run.id, report)
                continue
            report.runs.append(run.id)
            _drain(store, run.id, batch, report)
    return report
