"""Worker processes: P spawned processes each prepare (connect), say ready, wait at a start
event, then drain; their results come back on a queue. The drain time runs from the start
event to the last chunk's commit in any process; ``drain_profile`` turns the instrumented
claims and finishes of workledger workers into start-vs-end figures."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import resource
import statistics
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

from probes import Probe
from systems import DRAINS


@dataclass
class WorkerResult:
    pid: int
    items: int
    last_commit: float  # time.monotonic() of this process's last chunk commit (0: none)
    ended: float  # time.monotonic() when the drain function returned
    rss_kib: int
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _child(fn_name: str, url: str, chunk: int, ready: Any, start: Any, out: Any) -> None:
    """Entry point of a spawned worker process: prepare, say ready, wait, drain, report."""
    said_ready = False
    try:
        prepare, drain = DRAINS[fn_name]
        state = prepare(url, chunk)
        ready.put(os.getpid())
        said_ready = True
        start.wait()
        items, last, detail = drain(url, chunk, state)
        ended = time.monotonic()
        rss = peak_rss_kib()
        out.put(asdict(WorkerResult(os.getpid(), items, last, ended, rss, detail)))
    except BaseException:  # report every failure to the parent, which fails the cell
        if not said_ready:
            ready.put(os.getpid())
        out.put(asdict(WorkerResult(os.getpid(), 0, 0.0, time.monotonic(), 0,
                                    error=traceback.format_exc())))


def peak_rss_kib() -> int:
    """This process's peak RSS in KiB: VmHWM of its memory map. Not ``ru_maxrss``: Linux
    carries ``ru_maxrss`` over exec from the forked parent's memory, so a spawned worker (or a
    subprocess started by vfork) would report at least the parent's size."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_workers(fn_name: str, url: str, processes: int, chunk: int, timeout: float,
                probes: list[Probe] | None = None
                ) -> tuple[float, float, float, list[WorkerResult]]:
    """Start ``processes`` workers together; return (drain seconds, exit seconds, start time,
    results). ``probes`` begin right after the start event and stop once every worker
    reported."""
    ctx = mp.get_context("spawn")
    ready, out, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_child, args=(fn_name, url, chunk, ready, start, out))
             for _ in range(processes)]
    for p in procs:
        p.start()
    begun: list[Probe] = []
    try:
        for _ in procs:
            ready.get(timeout=120)
        t0 = time.monotonic()
        start.set()
        for probe in probes or []:
            probe.begin(t0)
            begun.append(probe)
        results = [WorkerResult(**out.get(timeout=timeout)) for _ in procs]
    finally:
        for probe in begun:
            probe.stop()
        _reap(procs)
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"a worker process failed:\n{errors[0]}")
    last = max((r.last_commit for r in results if r.last_commit), default=t0)
    return last - t0, max(r.ended for r in results) - t0, t0, results


def _reap(procs: list[Any]) -> None:
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            p.join()


def drain_profile(t0: float, results: list[WorkerResult]) -> dict[str, Any]:
    """Claim latency over the first vs the last 10% of chunks (all workers, by claim time) and
    items/s over the first vs the last 10% of the finished rows (start event to the moment
    10% were finished; the moment 90% were finished to the last finish)."""
    claims = sorted(c for r in results for c in r.detail.get("claims", ()))
    finishes = sorted(f for r in results for f in r.detail.get("finishes", ()))
    if not claims or not finishes:
        return {}
    k = max(1, len(claims) // 10)
    out: dict[str, Any] = {
        "chunks": len(claims),
        "claim_ms_first": round(statistics.median(ms for _, ms, _ in claims[:k]), 3),
        "claim_ms_last": round(statistics.median(ms for _, ms, _ in claims[-k:]), 3),
        "claim_ms_max": round(max(ms for _, ms, _ in claims), 3),
    }
    out.update(_finish_rates(t0, finishes))
    return out


def _finish_rates(t0: float, finishes: list[tuple[float, int]]) -> dict[str, Any]:
    """Items/s over the first and the last 10% of the finished rows, and last / first."""
    total = sum(n for _, n in finishes)
    t10, c10 = _reached(finishes, 0.1 * total)
    t90, c90 = _reached(finishes, 0.9 * total)
    t_end = finishes[-1][0]
    first = c10 / (t10 - t0) if t10 > t0 else None
    last = (total - c90) / (t_end - t90) if t_end > t90 and total > c90 else None
    return {"rows_finished": total,
            "rate_first10": None if first is None else round(first, 1),
            "rate_last10": None if last is None else round(last, 1),
            "end_start": round(last / first, 3) if first and last else None}


def _reached(finishes: list[tuple[float, int]], rows: float) -> tuple[float, int]:
    """(time, rows finished by then) of the first finish that brought the count to ``rows``."""
    cum = 0
    for t, n in finishes:
        cum += n
        if cum >= rows:
            return t, cum
    return finishes[-1][0], cum
