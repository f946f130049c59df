"""The ``--scale`` run: per backend, once, with the largest ``--chunk``,

1. a run of N/10 items, one worker process, then ``reconcile`` and ``workledger status``;
2. a run of N items (1,000,000 unless ``--items``), the same;
3. on PostgreSQL, N items with two worker processes;
4. a monitored run of N items: ``status`` every 100 ms from the parent and a 10-item run
   submitted 0.5 s after the start (fairness).

The lines under the table compare worker peak RSS at N/10 and N, give the CLI's peak RSS,
``reconcile`` time, claim latency and items/s at the start and the end of each drain, and
fairness.
"""

from __future__ import annotations

import argparse
import resource
from typing import Any

from grid import Cell
from probes import FAIR_ITEMS
from report import RSS_GROWTH_FLOOR, Sample

SCALE_ITEMS = 1_000_000


def scale_cells(args: argparse.Namespace, backends: list[Any]) -> list[Cell]:
    """The cells of the scale run, in the order they run."""
    cells: list[Cell] = []
    big, chunk = args.items, max(args.chunk)
    for b in backends:
        cells.append(Cell(b, "workledger", max(1, big // 10), 1, chunk, after=True,
                          tag="tenth"))
        cells.append(Cell(b, "workledger", big, 1, chunk, after=True, tag="big"))
        if b.name == "postgres":
            cells.append(Cell(b, "workledger", big, 2, chunk, tag="big-2p"))
        cells.append(Cell(b, "workledger", big, 1, chunk, fair=True, tag="monitored"))
    return cells


def scale_lines(samples: list[Sample], backends: list[Any]) -> list[str]:
    """The lines under the table about the scale run (none without one)."""
    lines = []
    for b in backends:
        mine = [s for s in samples if s.backend == b.name and s.extra.get("scale_run")]
        if not mine:
            continue
        small, big = _one(mine, "tenth", "drain"), _one(mine, "big", "drain")
        lines += _rss_line(b.name, small, big)
        lines += [_after_line(b.name, s) for s in (small, big)
                  if s and s.extra.get("cli_status_rss_mib") is not None]
        lines += [_claim_line(b.name, s) for s in mine
                  if s.phase.startswith("drain") and s.extra.get("rate_first10")]
        fair = _one(mine, "monitored", "drain+fair")
        if fair:
            lines.append(_fair_line(b.name, fair))
    return lines


def parent_rss_line() -> str:
    """This process's own peak RSS (it keeps one tuple per chunk, never per item)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return f"parent process peak RSS: {rss:.0f} MiB"


def _one(mine: list[Sample], tag: str, phase: str) -> Sample | None:
    return next((s for s in mine if s.extra["scale_run"] == tag and s.phase == phase), None)


def _rss_line(backend: str, small: Sample | None, big: Sample | None) -> list[str]:
    if not (small and big and small.rss_mib and big.rss_mib):
        return []
    ratio = big.rss_mib / small.rss_mib
    return [f"{backend}: worker peak RSS {small.rss_mib:.0f} MiB at {small.items:,} items, "
            f"{big.rss_mib:.0f} MiB at {big.items:,}: x{ratio:.2f}; i5 <={RSS_GROWTH_FLOOR}x "
            f"{'ok' if ratio <= RSS_GROWTH_FLOOR else 'BELOW'}"]


def _after_line(backend: str, s: Sample) -> str:
    x = s.extra
    return (f"{backend}: `workledger status RUN` as a subprocess on the completed "
            f"{s.items:,}-item run: peak RSS {x['cli_status_rss_mib']:.0f} MiB, wall "
            f"{x['cli_status_s']:.2f} s; ledger.reconcile(run) {x['reconcile_s']:.2f} s "
            f"(repaired: {x['reconcile_repaired']})")


def _claim_line(backend: str, s: Sample) -> str:
    x = s.extra
    return (f"{backend}: {s.items:,} items, P={s.processes}"
            f"{' (monitored)' if s.phase != 'drain' else ''}: claim "
            f"{x['claim_ms_first']:.1f} ms over the first 10% of chunks, "
            f"{x['claim_ms_last']:.1f} ms over the last 10% (max {x['claim_ms_max']:.0f}); "
            f"items/s first 10% {x['rate_first10']:,.0f}, last 10% "
            f"{x['rate_last10'] or 0:,.0f}")


def _fair_line(backend: str, fair: Sample) -> str:
    x = fair.extra
    if x.get("fair_complete_s") is None:
        return (f"{backend}: fairness: the {FAIR_ITEMS}-item run did not complete during the "
                f"drain ({x.get('fair_error') or 'drain too short'})")
    still = x.get("big_still_draining")
    return (f"{backend}: fairness: a {FAIR_ITEMS}-item run submitted "
            f"{x['fair_submitted_s']:.1f} s into the {fair.items:,}-item drain completed in "
            f"{x['fair_complete_s']:.2f} s (submit {x['fair_submit_s']:.2f} s); the big run "
            f"then had {x['big_processed']:,}/{x['big_total']:,} processed "
            f"({x['big_processed'] / max(1, x['big_total']):.0%}) and "
            + (f"drained on for {x['big_done_after_s']:.1f} s: ok" if still else
               "had already finished: BELOW (not measured while it drained)"))
