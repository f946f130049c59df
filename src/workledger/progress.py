"""Live progress of a run in a terminal: one bar per stage, redrawn from ``status``.

>>> watch_run(ledger, run_id, Console())   # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from workledger.api import Ledger, RunStatus, visible

ITEM_STATES = ("pending", "claimed", "unknown", "processed", "failed", "skipped")


def counts_line(counts: dict[str, int]) -> str:
    order = [s for s in ITEM_STATES if s in counts] + sorted(set(counts) - set(ITEM_STATES))
    return " · ".join(f"{state} {counts[state]}" for state in order)


def stage_order(ledger: Ledger, st: RunStatus) -> list[str]:
    job = ledger.jobs.get(st.job)
    known = [s.name for s in job.stages] if job else []
    return known + [s for s in st.counts if s not in known]


def stage_done(st: RunStatus, stages: list[str], i: int) -> int:
    """Units past stage ``i``: its terminal items plus units that ended in an earlier stage."""
    counts = st.counts.get(stages[i], {})
    here = sum(counts.get(s, 0) for s in ("processed", "failed", "skipped"))
    before = sum(st.counts.get(s, {}).get(x, 0) for s in stages[:i] for x in ("failed", "skipped"))
    return here + before


def watch_run(ledger: Ledger, run_id: int, console: Console,
              stop: Callable[[], bool] | None = None, interval: float = 0.25) -> RunStatus:
    """Live progress bars, one per stage, until the run is complete (or ``stop()`` says so)."""
    # stage names come from the ledger: shown with visible escapes, never read as markup
    columns = (TextColumn("{task.description:<12}", markup=False), BarColumn(),
               MofNCompleteColumn(), TextColumn("{task.fields[detail]}", markup=False))
    tasks: dict[str, TaskID] = {}
    with Progress(*columns, console=console) as progress:
        while True:
            st = ledger.status(run_id)
            stages = stage_order(ledger, st)
            for i, stage in enumerate(stages):
                if stage not in tasks:
                    tasks[stage] = progress.add_task(visible(stage), total=st.total, detail="")
                progress.update(tasks[stage], total=st.total, completed=stage_done(st, stages, i),
                                detail=f"{st.state} · {counts_line(st.counts.get(stage, {}))}")
            if st.complete or (stop is not None and stop()):
                return st
            time.sleep(interval)
