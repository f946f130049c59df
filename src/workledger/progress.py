"""Live progress of a run in a terminal: one bar per stage, redrawn from ``status``.

>>> watch_run(ledger, run_id, Console())   # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from workledger.api import (
    CLOSE_STAGE,
    ITEM_STATES,
    TERMINAL,
    ItemState,
    Ledger,
    RunStatus,
    visible,
)

# a unit that ends before the last stage ends failed or skipped (it is processed only there)
_ENDED_EARLY = tuple(s.value for s in TERMINAL - {ItemState.PROCESSED})


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
    here = sum(counts.get(s, 0) for s in TERMINAL)
    before = sum(st.counts.get(s, {}).get(x, 0) for s in stages[:i] for x in _ENDED_EARLY)
    return here + before


def watch_run(ledger: Ledger, run_id: int, console: Console,
              stop: Callable[[], bool] | None = None, interval: float = 0.25) -> RunStatus:
    """Live progress, redrawn from ``status`` until the run is complete (or ``stop()`` says so):
    the run's state and units, then one bar per stage of the job. The closing entry is not a
    stage of units and has no bar; no number is ever cut, a long line wraps."""
    st = ledger.status(run_id)
    with Live(_view(ledger, st), console=console, auto_refresh=False) as live:
        while not (st.complete or (stop is not None and stop())):
            time.sleep(interval)
            st = ledger.status(run_id)
            live.update(_view(ledger, st), refresh=True)
    return st


def _view(ledger: Ledger, st: RunStatus) -> Table:
    """One frame: a line for the run, then a row per stage (bar, units past it, its counts)."""
    left = st.total - st.processed - st.failed - st.skipped
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True, justify="right")
    grid.add_column(overflow="fold")
    grid.add_row(f"run {st.run_id}", "", "",
                 Text(f"{st.state} (next: {visible(st.next)}) · {st.total} units: {st.processed} "
                      f"processed, {st.failed} failed, {st.skipped} skipped, {left} to go"))
    stages = [s for s in stage_order(ledger, st) if s != CLOSE_STAGE]
    for i, stage in enumerate(stages):
        done = stage_done(st, stages, i)
        grid.add_row(Text(visible(stage)), ProgressBar(total=max(st.total, 1), completed=done,
                                                       width=24),
                     f"{done}/{st.total}", Text(counts_line(st.counts.get(stage, {}))))
    return grid
