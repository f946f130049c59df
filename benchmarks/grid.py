"""The grid: cells (backend x system x processes x chunk) and their repetitions.

Every cell starts from a fresh database (``backends.py``), loads N items (timed), then drains
them with P worker processes of chunk C (``workers.py``), optionally with probes running in
the parent (``probes.py``) and an ``after`` step (scale mode), and checks that all N are done.
It returns ``report.Sample`` rows. Repetitions are interleaved (every cell of a repetition
runs before the next repetition starts), and before each cell the script waits until the
other processes on the machine are quiet.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import peers
from probes import FAIR_ITEMS, FairnessProbe, Probe, StatusProbe
from report import Sample
from systems import KINDS, LOADERS, wl_after
from workers import WorkerResult, drain_profile, run_workers


@dataclass
class Cell:
    backend: Any
    kind: str  # a key of KINDS
    items: int
    processes: int
    chunk: int  # for a peer: its setting (pgqueuer batch size, procrastinate concurrency)
    status: bool = False  # poll ledger.status(run) from the parent during the drain
    fair: bool = False  # submit a small run during the drain (implies status)
    after: bool = False  # reconcile and `workledger status` after the drain (scale mode)
    tag: str = ""  # scale mode: which run this is

    @property
    def label(self) -> str:
        extra = "+status" if self.status and not self.fair else "+fair" if self.fair else ""
        return (f"{self.backend.name:8} {self.kind + extra:18} N={self.items:,} "
                f"P={self.processes} C={self.chunk}")

    @property
    def phases(self) -> tuple[str, str, str]:
        """(Sample.system, load phase, drain phase)."""
        system, load_phase, drain_phase = KINDS[self.kind]
        if self.fair:
            return system, "decompose+probe", "drain+fair"
        if self.status:
            return system, "decompose+probe", "drain+status"
        return system, load_phase, drain_phase


# =============================================================================================
# The cells of one repetition
# =============================================================================================


def grid_cells(args: argparse.Namespace, backends: list[Any], notes: list[str]) -> list[Cell]:
    """The cells of one repetition of the grid, in the order they run."""
    cells: list[Cell] = []
    own = [s for s in args.systems if s in ("workledger", "raw")]
    wanted_peers = [s for s in args.systems if s in peers.PEERS]
    for b in backends:
        for procs in args.processes:
            for chunk in args.chunk:
                for system in own:
                    cells.append(Cell(b, system, args.items, procs, chunk))
                if "workledger" in own and "2stage" in args.extras:
                    cells.append(Cell(b, "workledger-2stage", args.items, procs, chunk))
                if "workledger" in own and "plain" in args.extras:
                    cells.append(Cell(b, "workledger-plain", args.items, procs, chunk))
        if "workledger" in own and "status" in args.extras:
            cells.append(Cell(b, "workledger", args.items, args.processes[0], args.chunk[-1],
                              status=True))
        if b.name != "postgres":
            continue
        settings = peers.settings(args)
        for peer in wanted_peers:
            for procs in args.processes:
                cells.append(Cell(b, peer, peers.items(args, peer), procs, settings[peer]))
    if wanted_peers and not any(b.name == "postgres" for b in backends):
        notes.append(f"{', '.join(wanted_peers)}: peers run on PostgreSQL only; none here")
    return cells


# =============================================================================================
# Running the cells
# =============================================================================================


def run_cells(cells: list[Cell], repeat: int, args: argparse.Namespace
              ) -> tuple[list[Sample], list[str]]:
    """Every cell ``repeat`` times, repetitions interleaved (drift spreads evenly); a failing
    cell is a finding: its message goes to the failures and the run goes on."""
    samples: list[Sample] = []
    failures: list[str] = []
    for rep in range(1, repeat + 1):
        for cell in cells:
            _run_one(cell, rep, repeat, args, samples, failures)
    return samples, failures


def _run_one(cell: Cell, rep: int, repeat: int, args: argparse.Namespace,
             samples: list[Sample], failures: list[str]) -> None:
    """One cell after waiting for quiet; its samples or its failure, and a line on stderr."""
    label = f"[rep {rep}/{repeat}] {cell.label}"
    before = wait_quiet(args.quiet_below, args.quiet_wait) if args.quiet_wait else 0
    try:
        got = run_cell(cell, rep, args.timeout)
    except Exception as exc:  # noqa: BLE001 - a failing adapter is a finding
        msg = f"{label}: FAILED: {str(exc).strip().splitlines()[-1]}"
        failures.append(msg)
        print(msg, file=sys.stderr)
        return
    after = cpu_busy() if args.quiet_wait else 0
    for g in got:
        g.extra["foreign_cpu_before"] = round(before, 3)
        g.extra["foreign_cpu_after"] = round(after, 3)
    samples += got
    print(f"{label}  {describe_cell(got)} (other load {before:.0%} before / "
          f"{after:.0%} after)", file=sys.stderr, flush=True)


def run_cell(cell: Cell, rep: int, timeout: float) -> list[Sample]:
    """A fresh database, load N items, drain with P processes of chunk C: the load's sample
    and the drain's."""
    load, verify = LOADERS[cell.kind]
    system, load_phase, drain_phase = cell.phases
    backend = cell.backend
    with backend.fresh() as url:
        seconds, run_id, extra = load(url, cell.items)
        if cell.tag:
            extra["scale_run"] = cell.tag
        out = [Sample(backend.name, system, load_phase, None, None, rep, cell.items, seconds,
                      extra=extra)]
        status, fair = _probes(cell, url, run_id)
        probes: list[Probe] = [p for p in (status, fair) if p]
        drain_s, exit_s, t0, results = run_workers(cell.kind, url, cell.processes, cell.chunk,
                                                   timeout, probes)
        _check_done(cell, results, fair)
        verify(url, run_id, cell.items)
        info = _drain_info(system, t0, exit_s, results)
        if status:
            info.update(status.summary(t0 + drain_s))
        if fair:
            info.update(fair.summary(t0, drain_s))
        if cell.after:
            info.update(wl_after(url, run_id))
        if cell.tag:
            info["scale_run"] = cell.tag
        rss = max(r.rss_kib for r in results) / 1024
        out.append(Sample(backend.name, system, drain_phase, cell.processes, cell.chunk, rep,
                          cell.items, drain_s, rss_mib=rss, extra=info))
    return out


def _probes(cell: Cell, url: str, run_id: int
            ) -> tuple[StatusProbe | None, FairnessProbe | None]:
    status = fair = None
    if cell.status or cell.fair:
        status = StatusProbe(url, run_id, two_stage=cell.kind == "workledger-2stage")
    if cell.fair:
        fair = FairnessProbe(url, run_id)
    return status, fair


def _check_done(cell: Cell, results: list[WorkerResult], fair: FairnessProbe | None) -> None:
    """The workers completed every row: N per stage, plus the small run of the fairness
    probe if it was submitted (a worker counts rows, one per stage)."""
    rows = 2 if cell.kind == "workledger-2stage" else 1
    done = sum(r.items for r in results)
    small = FAIR_ITEMS if fair and fair.result.get("fair_run") else 0
    if done not in (rows * cell.items, rows * cell.items + small):
        raise RuntimeError(f"{cell.kind} workers completed {done} rows, expected "
                           f"{rows * cell.items}{f' (+{small})' if small else ''}")


def _drain_info(system: str, t0: float, exit_s: float, results: list[WorkerResult]
                ) -> dict[str, Any]:
    """The drain's details: exit time, per-worker counts, and the claim and rate profile
    (workledger) or the workers' own details (raw loop, peers)."""
    info: dict[str, Any] = {"exit_s": round(exit_s, 3),
                            "per_worker": [r.items for r in results]}
    if system == "workledger":
        info.update(drain_profile(t0, results))
        return info
    info.update({k: v for r in results for k, v in r.detail.items() if k != "returned"})
    if system in peers.PEERS:
        info["returned_s"] = round(max(r.detail["returned"] for r in results) - t0, 3)
    return info


def describe_cell(got: list[Sample]) -> str:
    """One cell's figures, for its progress line on stderr."""
    d, w = got[0], got[-1]
    x = w.extra
    bits = [f"{d.phase} {d.rate:>9,.0f}/s", f"drain {w.rate:>9,.0f}/s",
            f"exit {x['exit_s']:.2f}s", f"rss {w.rss_mib:.0f} MiB"]
    if x.get("claim_ms_first") is not None:
        bits.append(f"claim {x['claim_ms_first']:.1f}>{x['claim_ms_last']:.1f} ms")
    if x.get("end_start") is not None:
        bits.append(f"end/start {x['end_start']:.2f}")
    if x.get("status_calls"):
        bits.append(f"status {x['status_ms_median']:.0f} ms (max {x['status_ms_max']:.0f}, "
                    f"{x['status_calls']} calls)")
    if x.get("fair_complete_s") is not None:
        bits.append(f"10-item run done in {x['fair_complete_s']:.2f}s")
    if x.get("cli_status_rss_mib") is not None:
        bits.append(f"cli status {x['cli_status_rss_mib']:.0f} MiB, reconcile "
                    f"{x['reconcile_s']:.2f}s")
    return ", ".join(bits)


# =============================================================================================
# Noise: the other processes' CPU load, measured while this benchmark sits idle
# =============================================================================================


def cpu_busy(interval: float = 1.0) -> float:
    """Fraction of all CPUs busy over ``interval`` seconds (from /proc/stat). Measured while this
    benchmark sits idle between cells, it is the load of everything else on the machine."""
    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle
    try:
        t1, i1 = read()
        time.sleep(interval)
        t2, i2 = read()
    except (OSError, ValueError, IndexError):
        return 0.0
    return 1.0 - (i2 - i1) / max(1, t2 - t1)


def wait_quiet(threshold: float, patience: float) -> float:
    """Wait (up to ``patience`` s) until other processes use less than ``threshold`` of the CPUs;
    return the last measured foreign load."""
    deadline = time.monotonic() + patience
    busy = cpu_busy()
    while busy > threshold and time.monotonic() < deadline:
        busy = cpu_busy()
    return busy
