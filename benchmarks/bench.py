#!/usr/bin/env python
"""workledger benchmark: decomposition and claim+complete of no-op items, side by side with
"the limit" (a minimal hand-written raw-SQL loop doing the same durable work) and with peer
job queues (procrastinate, pgqueuer) on the same PostgreSQL. Prints one plain-text table;
see benchmarks/README.md.

    python benchmarks/bench.py [--items N] [--backend sqlite|postgres|both]
                               [--processes 1 2 4] [--chunk 100 500] [--repeat 3]
                               [--systems workledger raw procrastinate pgqueuer | --peers]
                               [--peer-items N] [--scale]

Every cell (backend x system x processes x chunk x repetition) starts from a fresh database:
a new SQLite file in a temporary folder on disk, or a new PostgreSQL database
``wl_bench_<tag>_<n>`` created from the admin URL and dropped right after the cell.

Measured per cell:

* ``decompose`` (workledger): wall time of ``job.submit(payload)`` whose decomposer yields
  ``Item(key=i)`` for ``i < N``; the raw twin inserts N rows with executemany (SQLite) or COPY
  (PostgreSQL) in transactions of 5,000 rows (workledger's decomposition batch); a peer
  enqueues N jobs with its batch API in calls of 5,000.
* ``claim+complete``: P worker processes (multiprocessing, spawn) each open their own
  connection, wait at a start event, then drain. workledger workers run
  ``ledger.work(concurrency=1, chunk=C, until_idle=True)``; raw workers loop
  claim-chunk / no-op / one guarded UPDATE; peers run their documented worker (see peers.py).
  The drain time runs from the start event to the last chunk's commit in any process (for
  peers: until their worker returns after the queue is empty). Idle-polling after the run is
  done is not counted; the time until every worker exited is kept in ``--json`` as ``exit_s``.
* In every workledger drain the worker's store is instrumented (its ``items_claim`` and
  ``items_finish_if_leased`` methods are wrapped on the instance, in the child): claim
  latency over the first vs the last 10% of chunks, items/s over the first vs the last 10%
  of the items.
* Extras (``--extras``, default both): ``2stage``, the same N items through a job of two
  no-op idempotent stages ``a`` then ``b`` (rate in units: one unit = both stages);
  ``status``, one more workledger drain per backend and repetition while the parent calls
  ``ledger.status(run)`` every 100 ms.
* ``--scale``: per backend a 1,000,000-item run (``--items`` when given) next to one of a
  tenth of it: decomposition, drain (1 process; also 2 on PostgreSQL), worker peak RSS,
  ``workledger status`` peak RSS as a subprocess, ``reconcile`` time, claim latency at start
  and end, and a monitored drain: ``status`` every 100 ms and a 10-item run submitted while
  the big one drains (fairness).

workledger is imported from a copy of ``src/workledger`` taken at start (or of ``--rev``), in
the parent and in every spawned worker, so a run measures one version of the code.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402 - next to this script; imports no peer until one is used

DEFAULT_PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
INSERT_BATCH = 5000  # workledger.runtime.decompose.BATCH: the raw twin uses the same batches
LEASE_SECONDS = 30.0
JOB = "bench-noop"
JOB2 = "bench-2stage"  # stages "a" then "b", both no-op and idempotent
SCALE_ITEMS = 1_000_000
STATUS_EVERY = 0.1  # seconds between two status calls of the probe
FAIR_ITEMS = 10  # the small run submitted while a big one drains
FAIR_AFTER = 0.5  # seconds after the start event

# Issue 2 floors (reported, never asserted).
FLOORS_ISSUE2 = {
    ("sqlite", "decompose", None): 50_000,
    ("postgres", "decompose", None): 50_000,
    ("sqlite", "drain", 1): 10_000,
    ("postgres", "drain", 1): 5_000,
}
# Issue 5 floors, reported only: workledger / raw, workledger / peer, end of drain / start.
RATIO_FLOORS_ISSUE5 = {"decompose": 0.70, "drain": 0.60}
PEER_FLOORS_ISSUE5 = {"procrastinate": 10.0, "pgqueuer": 3.0}
END_START_FLOOR = 0.8  # items/s over the last 10% within 20% of the first 10%
STATUS_FLOOR_MS = 50.0  # status while workers run, median (issue 5, 1M items)
RSS_GROWTH_FLOOR = 1.2  # worker peak RSS at 1M within 1.2x of 100k

# The kinds of cell: DRAINS/LOADERS key -> (Sample.system, load phase, drain phase)
KINDS = {
    "workledger": ("workledger", "decompose", "drain"),
    "workledger-2stage": ("workledger", "decompose2", "drain2"),
    "raw": ("raw", "decompose", "drain"),
    "procrastinate": ("procrastinate", "enqueue", "drain"),
    "pgqueuer": ("pgqueuer", "enqueue", "drain"),
}


# =============================================================================================
# Samples and the table
# =============================================================================================


@dataclass
class Sample:
    backend: str  # sqlite | postgres
    system: str  # workledger | raw | procrastinate | pgqueuer
    phase: str  # decompose | enqueue | drain | drain2 | drain+status | drain+fair | ...
    processes: int | None
    chunk: int | None  # a peer's setting: pgqueuer batch size, procrastinate concurrency
    rep: int
    items: int
    seconds: float
    rss_mib: float | None = None  # peak RSS of the largest worker process
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else float("inf")


PHASE_LABELS = {
    "decompose": "decompose",
    "drain": "claim+complete",
    "drain2": "2-stage claim+complete (units/s)",
    "drain+status": "claim+complete, status polled",
    "drain+fair": "claim+complete, status polled + 10-item run",
    "enqueue": "decompose vs enqueue",
}
PHASE_ORDER = ["decompose", "drain", "drain2", "drain+status", "drain+fair"]
# in --json only: the 2-stage decomposition (the same rows as decompose) and the loads of the
# cells that poll status (their decomposition is measured by the plain cells)
HIDDEN_PHASES = {"decompose2", "decompose+probe"}


def _fmt_rate(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:>9,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _floor_note(backend: str, phase: str, procs: int | None, chunk: int | None,
                wl: float | None, ratio: float | None, end_start: float | None) -> str:
    notes = []
    floor = FLOORS_ISSUE2.get((backend, phase, procs))
    if floor is not None and wl is not None:
        notes.append(f"i2 >={floor // 1000}k {'ok' if wl >= floor else 'BELOW'}")
    rfloor = RATIO_FLOORS_ISSUE5.get(phase)
    applies = phase == "decompose" or (chunk == 500 and (
        procs == 1 or (backend == "postgres" and procs == 2)))
    if rfloor is not None and ratio is not None and applies:
        notes.append(f"i5 >={rfloor:.0%} {'ok' if ratio >= rfloor else 'BELOW'}")
    if end_start is not None:
        notes.append(f"i5 end>={END_START_FLOOR:.0%} start "
                     f"{'ok' if end_start >= END_START_FLOOR else 'BELOW'}")
    return "; ".join(notes)


def _profile_cols(wl: list[Sample]) -> tuple[str, str, float | None]:
    """Claim ms over the first vs last 10% of chunks, and last/first 10% items/s (medians)."""
    first = [s.extra["claim_ms_first"] for s in wl if s.extra.get("claim_ms_first") is not None]
    last = [s.extra["claim_ms_last"] for s in wl if s.extra.get("claim_ms_last") is not None]
    ratios = [s.extra["end_start"] for s in wl if s.extra.get("end_start") is not None]
    claim = f"{statistics.median(first):.1f}>{statistics.median(last):.1f}" if first else "-"
    end_start = _med(ratios)
    return claim, "-" if end_start is None else f"{end_start:.2f}", end_start


def render_table(samples: list[Sample], main_n: int) -> str:
    """One row per (backend, phase, N, processes, chunk): workledger next to the raw loop,
    then one row per peer and process count (and workledger chunk) against workledger."""
    def pick(system: str, backend: str, phase: str, procs: int | None, chunk: int | None,
             items: int | None = None) -> list[Sample]:
        return [s for s in samples if (s.system, s.backend, s.phase, s.processes) ==
                (system, backend, phase, procs) and (chunk is None or s.chunk == chunk)
                and (items is None or s.items == items)]

    own = [s for s in samples if s.system in ("workledger", "raw")
           and s.phase not in HIDDEN_PHASES]
    keys: list[tuple[str, str, int, int | None, int | None]] = []
    for s in own:
        k = (s.backend, s.phase, s.items, s.processes, s.chunk)
        if k not in keys:
            keys.append(k)
    backends = list(dict.fromkeys(s.backend for s in samples))  # in the order measured
    order = {p: i for i, p in enumerate(PHASE_ORDER)}
    keys.sort(key=lambda k: (backends.index(k[0]), k[2], order.get(k[1], 9), k[3] or 0,
                             k[4] or 0))
    show_n = len({k[2] for k in keys}) > 1
    head = ["backend", "phase", "N", "procs", "chunk", "workledger items/s [min-max]", "vs",
            "other items/s [min-max]", "wl/other", "claim ms start>end", "end/start 10%",
            "wl RSS MiB", "floors (not asserted)"]
    rows = [head]
    for backend in backends:
        for k in [k for k in keys if k[0] == backend]:
            _, phase, items, procs, chunk = k
            wl = [s for s in pick("workledger", backend, phase, procs, None, items)
                  if s.chunk == chunk]
            raw = [s for s in pick("raw", backend, phase, procs, None, items)
                   if s.chunk == chunk]
            wl_med = _med([s.rate for s in wl])
            raw_med = _med([s.rate for s in raw])
            ratio = wl_med / raw_med if wl_med and raw_med else None
            rss = [s.rss_mib for s in wl if s.rss_mib is not None]
            claim, end_start_txt, end_start = _profile_cols(wl)
            rows.append([
                backend, PHASE_LABELS.get(phase, phase), f"{items:,}",
                "-" if procs is None else str(procs), "-" if chunk is None else str(chunk),
                _fmt_rate([s.rate for s in wl]), "raw SQL" if raw else "-",
                _fmt_rate([s.rate for s in raw]), "-" if ratio is None else f"{ratio:.2f}",
                claim, end_start_txt, f"{max(rss):.0f}" if rss else "-",
                _floor_note(backend, phase if phase in ("decompose", "drain") else "",
                            procs, chunk, wl_med, ratio, end_start),
            ])
        for peer in peers.PEERS:
            mine = [s for s in samples if (s.backend, s.system) == (backend, peer)]
            if not mine:
                continue
            enq = [s for s in mine if s.phase == "enqueue"]
            wl = [s for s in samples if (s.backend, s.system, s.phase, s.items)
                  == (backend, "workledger", "decompose", main_n)]
            label = _peer_label(peer, mine, main_n)
            if enq:
                wl_med, p_med = _med([s.rate for s in wl]), _med([s.rate for s in enq])
                rows.append([backend, PHASE_LABELS["enqueue"], f"{main_n:,}", "-", "-",
                             _fmt_rate([s.rate for s in wl]), label,
                             _fmt_rate([s.rate for s in enq]),
                             f"{wl_med / p_med:.2f}" if wl_med and p_med else "-",
                             "", "", "", ""])
            for procs in sorted({s.processes or 0 for s in mine if s.phase == "drain"}):
                p_rates = [s.rate for s in mine if s.phase == "drain" and s.processes == procs]
                chunks = sorted({s.chunk or 0 for s in samples if (
                    s.backend, s.system, s.phase, s.processes, s.items)
                    == (backend, "workledger", "drain", procs, main_n)}) or [None]
                for chunk in chunks:
                    wl = pick("workledger", backend, "drain", procs, chunk, main_n)
                    wl_med, p_med = _med([s.rate for s in wl]), _med(p_rates)
                    ratio = wl_med / p_med if wl_med and p_med else None
                    floor = PEER_FLOORS_ISSUE5[peer]
                    note = "" if ratio is None else (
                        f"i5 >={floor:.0f}x {peer} {'ok' if ratio >= floor else 'BELOW'}")
                    rows.append([backend, PHASE_LABELS["drain"], f"{main_n:,}", str(procs),
                                 "-" if chunk is None else str(chunk),
                                 _fmt_rate([s.rate for s in wl]), label, _fmt_rate(p_rates),
                                 "-" if ratio is None else f"{ratio:.2f}", "", "", "", note])
    if not show_n:
        head_i = head.index("N")
        rows = [r[:head_i] + r[head_i + 1:] for r in rows]
    ncol = len(rows[0])
    widths = [max(len(r[i]) for r in rows) for i in range(ncol)]
    left = {rows[0].index(c) for c in ("backend", "phase", "vs", "floors (not asserted)")}
    lines = []
    for n, r in enumerate(rows):
        cells = [c.ljust(w) if i in left or not n else c.rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _peer_label(peer: str, mine: list[Sample], main_n: int) -> str:
    setting = next((s.chunk for s in mine if s.chunk), 0) or 0
    label = peers.short(peer, setting)
    ns = sorted({s.items for s in mine})
    if ns and ns != [main_n]:
        label += f", N={'/'.join(f'{n:,}' for n in ns)}"
    return label


# =============================================================================================
# Backends: a fresh database per cell
# =============================================================================================


class SqliteBackend:
    name = "sqlite"

    def __init__(self, tmpdir: str | None) -> None:
        self.root = tempfile.mkdtemp(prefix="wl_bench_", dir=tmpdir)
        self.n = 0

    @contextlib.contextmanager
    def fresh(self) -> Iterator[str]:
        self.n += 1
        folder = os.path.join(self.root, f"cell{self.n}")
        os.makedirs(folder)
        try:
            yield "sqlite:///" + os.path.join(folder, "bench.db")  # absolute: sqlite:////...
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def describe(self) -> str:
        fs = _fstype(self.root)
        return f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=FULL) in {self.root} [{fs}]"


class PostgresBackend:
    name = "postgres"

    def __init__(self, admin_url: str) -> None:
        import psycopg

        self.admin_url = admin_url
        self.tag = f"wl_bench_{uuid.uuid4().hex[:8]}"
        self.n = 0
        self.admin = psycopg.connect(admin_url, autocommit=True, connect_timeout=5)
        self.created: list[str] = []

    @contextlib.contextmanager
    def fresh(self) -> Iterator[str]:
        self.n += 1
        name = f"{self.tag}_{self.n}"
        self.admin.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        try:
            yield urlunsplit(urlsplit(self.admin_url)._replace(path="/" + name))
        finally:
            self._drop(name)

    def _drop(self, name: str) -> None:
        self.admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.created:
            self.created.remove(name)

    def close(self) -> None:
        for name in list(self.created):
            with contextlib.suppress(Exception):
                self._drop(name)
        self.admin.close()

    def describe(self) -> str:
        row = self.admin.execute("SHOW server_version").fetchone()
        settings: dict[str, str] = dict(self.admin.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('fsync', 'synchronous_commit', 'autovacuum', 'shared_buffers')").fetchall())
        where = urlsplit(self.admin_url)
        return (f"PostgreSQL {row[0] if row else '?'} at {where.hostname}:{where.port or 5432} "
                f"(fsync={settings.get('fsync')}, synchronous_commit="
                f"{settings.get('synchronous_commit')}, autovacuum={settings.get('autovacuum')},"
                f" shared_buffers={settings.get('shared_buffers')}x8kB), databases {self.tag}_*")


def _fstype(path: str) -> str:
    best, fstype = "", "?"
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        real = os.path.realpath(path)
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            mount = parts[1]
            inside = real == mount or real.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best):
                best, fstype = mount, f"{parts[2]} on {parts[0]}"
    return fstype


# =============================================================================================
# Worker processes: a start event, then a timed drain; results come back on a queue
# =============================================================================================


@dataclass
class WorkerResult:
    pid: int
    items: int
    last_commit: float  # time.monotonic() of this process's last chunk commit (0: none)
    ended: float  # time.monotonic() when the drain function returned
    rss_kib: int
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


DrainFn = Callable[[str, int, Any], tuple[int, float, dict[str, Any]]]


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


class Probe:
    """Something the parent runs in a thread while the workers drain: ``begin`` starts
    ``_run`` at the start event, ``stop`` asks it to end and waits for it."""

    name = "probe"

    def __init__(self) -> None:
        self.t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, t0: float) -> None:
        self.t0 = t0
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=120)


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
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"a worker process failed:\n{errors[0]}")
    last = max((r.last_commit for r in results if r.last_commit), default=t0)
    return last - t0, max(r.ended for r in results) - t0, t0, results


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
    total = sum(n for _, n in finishes)

    def reached(share: float) -> tuple[float, int]:
        cum = 0
        for t, n in finishes:
            cum += n
            if cum >= share * total:
                return t, cum
        return finishes[-1][0], cum

    t10, c10 = reached(0.1)
    t90, c90 = reached(0.9)
    t_end = finishes[-1][0]
    first = c10 / (t10 - t0) if t10 > t0 else None
    last = (total - c90) / (t_end - t90) if t_end > t90 and total > c90 else None
    out["rows_finished"] = total
    out["rate_first10"] = None if first is None else round(first, 1)
    out["rate_last10"] = None if last is None else round(last, 1)
    out["end_start"] = round(last / first, 3) if first and last else None
    return out


# =============================================================================================
# Probes the parent runs during a drain: status latency, a small run next to a big one
# =============================================================================================


class StatusProbe(Probe):
    """Calls ``ledger.status(run)`` from the parent every ``every`` seconds while the workers
    drain (its own Ledger, opened in the probe thread before the first timed call)."""

    name = "status-probe"

    def __init__(self, url: str, run_id: int, two_stage: bool = False,
                 every: float = STATUS_EVERY) -> None:
        super().__init__()
        self.url, self.run_id, self.two_stage, self.every = url, run_id, two_stage, every
        self.samples: list[tuple[float, float]] = []  # (monotonic at the call, ms)
        self.error: str | None = None

    def _run(self) -> None:
        ledger = define(self.url, self.two_stage)
        try:
            ledger.store  # noqa: B018 - connect outside the timed calls
            while not self._stop.is_set():
                t = time.monotonic()
                s = time.perf_counter()
                ledger.status(self.run_id)
                self.samples.append((t, (time.perf_counter() - s) * 1000))
                self._stop.wait(self.every)
        except Exception:  # noqa: BLE001 - reported with the cell
            self.error = traceback.format_exc().strip().splitlines()[-1]
        finally:
            ledger.close()

    def summary(self, until: float) -> dict[str, Any]:
        """The calls that started before ``until`` (the end of the drain)."""
        ms = [m for t, m in self.samples if t < until]
        if not ms:
            return {"status_calls": 0, "status_error": self.error}
        return {"status_calls": len(ms), "status_ms_median": round(statistics.median(ms), 2),
                "status_ms_max": round(max(ms), 2), "status_ms": [round(m, 2) for m in ms],
                "status_error": self.error}


class FairnessProbe(Probe):
    """Submits a ``FAIR_ITEMS``-item run of the same job ``FAIR_AFTER`` s after the start
    event, polls it until complete, and then reads the big run's progress."""

    name = "fairness"

    def __init__(self, url: str, big_run: int) -> None:
        super().__init__()
        self.url, self.big_run = url, big_run
        self.result: dict[str, Any] = {}

    def _run(self) -> None:
        ledger = define(self.url)
        try:
            ledger.store  # noqa: B018
            if self._stop.wait(max(0.0, self.t0 + FAIR_AFTER - time.monotonic())):
                return
            submitted = time.monotonic()
            sub = ledger.job(JOB).submit({"n": FAIR_ITEMS}, key="fairness-small-run")
            self.result.update(fair_run=sub.run_id, fair_submitted_s=round(
                submitted - self.t0, 3), fair_submit_s=round(time.monotonic() - submitted, 3))
            while not self._stop.is_set():
                if ledger.status(sub.run_id).complete:
                    done = time.monotonic()
                    big = ledger.status(self.big_run)
                    self.result.update(fair_done_at=done, fair_complete_s=round(
                        done - submitted, 3), big_processed=big.processed, big_total=big.total)
                    return
                self._stop.wait(0.02)
        except Exception:  # noqa: BLE001 - reported with the cell
            self.result["fair_error"] = traceback.format_exc().strip().splitlines()[-1]
        finally:
            ledger.close()


# =============================================================================================
# workledger through its public API
# =============================================================================================


def split(payload: dict[str, Any]) -> Iterator[Any]:
    from workledger import Item

    for i in range(payload["n"]):
        yield Item(key=i)


def noop(item: Any, ctx: Any) -> None:
    return None


def define(url: str, two_stage: bool = False) -> Any:
    """A Ledger with the benchmark's job: one no-op stage, or stages "a" then "b"."""
    from workledger import Ledger

    ledger = Ledger(url)
    if two_stage:
        job = ledger.job(JOB2)
        job.decompose(split)
        job.stage("a", idempotent=True)(noop)
        job.stage("b", after="a", idempotent=True)(noop)
    else:
        job = ledger.job(JOB)
        job.decompose(split)
        job.stage("noop", idempotent=True)(noop)
    return ledger


def wl_decompose(url: str, items: int, two_stage: bool = False
                 ) -> tuple[float, int, dict[str, Any]]:
    ledger = define(url, two_stage)
    try:
        ledger.store  # noqa: B018 - open and migrate outside the timed section
        t = time.perf_counter()
        sub = ledger.job(JOB2 if two_stage else JOB).submit({"n": items}, key="bench")
        seconds = time.perf_counter() - t
        assert sub.created and sub.status.total == items, sub
        t = time.perf_counter()
        ledger.status(sub.run_id)
        status_ms = (time.perf_counter() - t) * 1000
        return seconds, sub.run_id, {"status_ms_pending": round(status_ms, 2)}
    finally:
        ledger.close()


def _instrument(store: Any) -> tuple[list[tuple[float, float, int]], list[tuple[float, int]]]:
    """Wrap the store's claim and finish methods on the instance (not the class): record
    (monotonic start, ms, rows) per non-empty claim and (monotonic end, rows applied) per
    finish. The worker calls them as ``self.store.items_claim(...)``, so it sees the
    wrappers; nothing in workledger changes."""
    claims: list[tuple[float, float, int]] = []
    finishes: list[tuple[float, int]] = []
    claim, finish = store.items_claim, store.items_finish_if_leased

    def items_claim(params: Any) -> Any:
        t = time.monotonic()
        rows = claim(params)
        if rows:
            claims.append((t, (time.monotonic() - t) * 1000, len(rows)))
        return rows

    def items_finish_if_leased(params: Any) -> Any:
        result = finish(params)
        finishes.append((time.monotonic(), len(result.applied)))
        return result

    store.items_claim = items_claim
    store.items_finish_if_leased = items_finish_if_leased
    return claims, finishes


def wl_prepare(url: str, chunk: int, two_stage: bool = False) -> Any:
    ledger = define(url, two_stage)
    # connect (and see the migrated schema) before the start event
    claims, finishes = _instrument(ledger.store)
    return ledger, claims, finishes


def wl_drain(url: str, chunk: int, state: Any) -> tuple[int, float, dict[str, Any]]:
    ledger, claims, finishes = state
    last = [0.0]

    def progress(report: Any) -> None:
        last[0] = time.monotonic()

    try:
        report = ledger.work(concurrency=1, chunk=chunk, until_idle=True, on_progress=progress)
    finally:
        ledger.close()
    return report.processed, last[0], {"chunks": report.chunks, "stale": report.stale,
                                       "claimed": report.claimed, "claims": claims,
                                       "finishes": finishes}


def wl_verify(url: str, run_id: int, items: int, two_stage: bool = False) -> None:
    ledger = define(url, two_stage)
    try:
        st = ledger.status(run_id)
        if not (st.complete and st.processed == items):
            raise RuntimeError(f"workledger run not complete after the drain: {st}")
    finally:
        ledger.close()


def wl_after(url: str, run_id: int) -> dict[str, Any]:
    """After a drain (scale mode): ``reconcile(run)`` time and ``workledger status`` run as a
    subprocess (its peak RSS from wait4, and its wall time)."""
    ledger = define(url)
    try:
        ledger.store  # noqa: B018
        t = time.perf_counter()
        rec = ledger.reconcile(run_id)
        out: dict[str, Any] = {"reconcile_s": round(time.perf_counter() - t, 3),
                               "reconcile_repaired": rec.repaired}
    finally:
        ledger.close()
    out.update(cli_status(url, run_id))
    return out


CLI_PEAK = """\
import atexit, sys
peak_file = sys.argv[1]
sys.argv = ["workledger", *sys.argv[2:]]
def _peak():
    with open("/proc/self/status") as f:
        hwm = next((line.split()[1] for line in f if line.startswith("VmHWM:")), "0")
    with open(peak_file, "w") as out:
        out.write(hwm)
atexit.register(_peak)
from workledger.cli import main
sys.exit(main())
"""


def cli_status(url: str, run_id: int) -> dict[str, Any]:
    """``workledger --db URL status RUN`` in a subprocess: ``workledger.cli:main`` (what the
    console script runs), importing the measured copy through PYTHONPATH. Its peak RSS is its
    own VmHWM, written at exit by a 10-line wrapper (``ru_maxrss`` from wait4 would include
    this parent's size, see peak_rss_kib)."""
    with tempfile.TemporaryDirectory() as tmp:
        peak_file, log_file = os.path.join(tmp, "peak"), os.path.join(tmp, "log")
        cmd = [sys.executable, "-c", CLI_PEAK, peak_file, "--db", url, "status", str(run_id)]
        with open(log_file, "wb") as log:
            t = time.perf_counter()
            code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
            seconds = time.perf_counter() - t
        with open(log_file, "rb") as log:
            text = log.read().decode(errors="replace")
        if code != 0:
            raise RuntimeError(f"workledger status exited {code}: {text.strip()[-300:]}")
        with open(peak_file) as f:
            peak = int(f.read() or 0)
    return {"cli_status_rss_mib": round(peak / 1024, 1), "cli_status_s": round(seconds, 3)}


wl2_decompose = functools.partial(wl_decompose, two_stage=True)
wl2_prepare = functools.partial(wl_prepare, two_stage=True)
wl2_verify = functools.partial(wl_verify, two_stage=True)


# =============================================================================================
# The limit: a minimal hand-written raw-SQL loop
# =============================================================================================

RAW_SQLITE_SCHEMA = """
CREATE TABLE q (
    id          INTEGER PRIMARY KEY,
    seq         INTEGER NOT NULL,
    key         TEXT,
    state       TEXT NOT NULL DEFAULT 'pending',
    lease_token INTEGER,
    lease_until TEXT,
    result      TEXT
);
CREATE INDEX q_pending ON q (id) WHERE state = 'pending';
CREATE TABLE q_token (v INTEGER NOT NULL);
INSERT INTO q_token VALUES (0);
"""

RAW_SQLITE_CLAIM = """
UPDATE q SET state = 'claimed', lease_token = :token,
    lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', '+30 seconds')
WHERE id IN (SELECT id FROM q WHERE state = 'pending' AND id > :after ORDER BY id LIMIT :limit)
RETURNING id, key
"""

RAW_SQLITE_FINISH = """
UPDATE q SET state = 'processed', result = 'null', lease_until = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND lease_token = :token AND state = 'claimed'
"""

RAW_PG_SCHEMA = """
CREATE TABLE q (
    id          bigserial PRIMARY KEY,
    seq         integer NOT NULL,
    key         text,
    state       text NOT NULL DEFAULT 'pending',
    lease_token bigint,
    lease_until timestamptz,
    result      jsonb
);
CREATE INDEX q_pending ON q (id) WHERE state = 'pending';
CREATE SEQUENCE q_token;
"""

RAW_PG_CLAIM = """
WITH c AS (
    SELECT id FROM q WHERE state = 'pending' AND id > %(after)s ORDER BY id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), t AS (SELECT nextval('q_token') AS v)
UPDATE q SET state = 'claimed', lease_token = t.v, lease_until = now() + interval '30 seconds'
FROM c, t WHERE q.id = c.id
RETURNING q.id, q.key, q.lease_token
"""

RAW_PG_FINISH = """
UPDATE q SET state = 'processed', result = 'null'::jsonb, lease_until = NULL
WHERE id = ANY(%(ids)s) AND lease_token = %(token)s AND state = 'claimed'
"""


def _raw_noop(item_id: int, key: str | None) -> None:
    return None


def _sqlite_path(url: str) -> str:
    return url[len("sqlite:///"):]


def _sqlite_connect(url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(_sqlite_path(url), timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


def raw_insert(url: str, items: int) -> tuple[float, int, dict[str, Any]]:
    rows = ((i, str(i)) for i in range(items))
    if url.startswith("sqlite"):
        conn = _sqlite_connect(url)
        conn.executescript(RAW_SQLITE_SCHEMA)
        t = time.perf_counter()
        while batch := [r for _, r in zip(range(INSERT_BATCH), rows, strict=False)]:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO q (seq, key) VALUES (?, ?)", batch)
            conn.execute("COMMIT")
        seconds = time.perf_counter() - t
        conn.close()
        return seconds, 0, {}
    import psycopg

    with psycopg.connect(url) as pg:
        pg.execute(RAW_PG_SCHEMA)
        pg.commit()
        t = time.perf_counter()
        while batch := [r for _, r in zip(range(INSERT_BATCH), rows, strict=False)]:
            with pg.cursor() as cur, cur.copy("COPY q (seq, key) FROM STDIN") as copy:
                for r in batch:
                    copy.write_row(r)
            pg.commit()
        seconds = time.perf_counter() - t
    return seconds, 0, {}


def raw_prepare(url: str, chunk: int) -> Any:
    if url.startswith("sqlite"):
        return _sqlite_connect(url)
    import psycopg

    return psycopg.connect(url)


def raw_drain_sqlite(url: str, chunk: int, conn: sqlite3.Connection
                     ) -> tuple[int, float, dict[str, Any]]:
    done, last, after, chunks = 0, 0.0, 0, 0
    while True:
        conn.execute("BEGIN IMMEDIATE")
        token = conn.execute("UPDATE q_token SET v = v + 1 RETURNING v").fetchone()[0]
        rows = conn.execute(RAW_SQLITE_CLAIM,
                            {"token": token, "after": after, "limit": chunk}).fetchall()
        conn.execute("COMMIT")
        if not rows:
            if after == 0:
                break
            after = 0  # one sweep from the start, as workledger's cursor does
            continue
        for item_id, key in rows:
            _raw_noop(item_id, key)
        ids = [r[0] for r in rows]
        after = max(ids)
        conn.execute("BEGIN IMMEDIATE")
        cur = conn.execute(RAW_SQLITE_FINISH, {"ids": json.dumps(ids), "token": token})
        conn.execute("COMMIT")
        done += cur.rowcount
        chunks += 1
        last = time.monotonic()
    conn.close()
    return done, last, {"chunks": chunks}


def raw_drain_pg(url: str, chunk: int, conn: Any) -> tuple[int, float, dict[str, Any]]:
    done, last, after, chunks = 0, 0.0, 0, 0
    while True:
        rows = conn.execute(RAW_PG_CLAIM, {"after": after, "limit": chunk}).fetchall()
        conn.commit()
        if not rows:
            if after == 0:
                break
            after = 0
            continue
        for item_id, key, _token in rows:
            _raw_noop(item_id, key)
        ids = [r[0] for r in rows]
        after = max(ids)
        cur = conn.execute(RAW_PG_FINISH, {"ids": ids, "token": rows[0][2]})
        conn.commit()
        done += cur.rowcount
        chunks += 1
        last = time.monotonic()
    conn.close()
    return done, last, {"chunks": chunks}


def raw_drain(url: str, chunk: int, conn: Any) -> tuple[int, float, dict[str, Any]]:
    if url.startswith("sqlite"):
        return raw_drain_sqlite(url, chunk, conn)
    return raw_drain_pg(url, chunk, conn)


def raw_verify(url: str, run_id: int, items: int) -> None:
    if url.startswith("sqlite"):
        conn = _sqlite_connect(url)
        n = conn.execute("SELECT count(*) FROM q WHERE state = 'processed'").fetchone()[0]
        conn.close()
    else:
        import psycopg

        with psycopg.connect(url) as pg:
            row = pg.execute("SELECT count(*) FROM q WHERE state = 'processed'").fetchone()
            n = row[0] if row else 0
    if n != items:
        raise RuntimeError(f"raw loop processed {n} rows, expected {items}")



# name -> (prepare in the child before the start event, drain after it)
DRAINS: dict[str, tuple[Callable[[str, int], Any], DrainFn]] = {
    "workledger": (wl_prepare, wl_drain),
    "workledger-2stage": (wl2_prepare, wl_drain),
    "raw": (raw_prepare, raw_drain),
    **peers.DRAINS,
}

# name -> (decompose/insert/enqueue: (url, N) -> (seconds, run_id, extra), verify after drain)
LOADERS: dict[str, tuple[Callable[[str, int], tuple[float, int, dict[str, Any]]],
                         Callable[[str, int, int], None]]] = {
    "workledger": (wl_decompose, wl_verify),
    "workledger-2stage": (wl2_decompose, wl2_verify),
    "raw": (raw_insert, raw_verify),
    **peers.LOADERS,
}


# =============================================================================================
# One cell: a fresh database, load N items, drain with P processes of chunk C
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


def run_cell(cell: Cell, rep: int, timeout: float) -> list[Sample]:
    load, verify = LOADERS[cell.kind]
    system, load_phase, drain_phase = KINDS[cell.kind]
    if cell.fair:
        load_phase, drain_phase = "decompose+probe", "drain+fair"
    elif cell.status:
        load_phase, drain_phase = "decompose+probe", "drain+status"
    rows = 2 if cell.kind == "workledger-2stage" else 1  # a worker counts rows, one per stage
    backend = cell.backend
    with backend.fresh() as url:
        seconds, run_id, extra = load(url, cell.items)
        if cell.tag:
            extra["scale_run"] = cell.tag
        out = [Sample(backend.name, system, load_phase, None, None, rep, cell.items, seconds,
                      extra=extra)]
        probes: list[Probe] = []
        status = fair = None
        if cell.status or cell.fair:
            status = StatusProbe(url, run_id, two_stage=cell.kind == "workledger-2stage")
            probes.append(status)
        if cell.fair:
            fair = FairnessProbe(url, run_id)
            probes.append(fair)
        drain_s, exit_s, t0, results = run_workers(cell.kind, url, cell.processes, cell.chunk,
                                                   timeout, probes)
        done = sum(r.items for r in results)
        small = FAIR_ITEMS if fair and fair.result.get("fair_run") else 0
        if done not in (rows * cell.items, rows * cell.items + small):
            raise RuntimeError(f"{cell.kind} workers completed {done} rows, expected "
                               f"{rows * cell.items}{f' (+{small})' if small else ''}")
        verify(url, run_id, cell.items)
        info: dict[str, Any] = {"exit_s": round(exit_s, 3),
                                "per_worker": [r.items for r in results]}
        if system == "workledger":
            info.update(drain_profile(t0, results))
        else:
            info.update({k: v for r in results for k, v in r.detail.items()
                         if k != "returned"})
            if system in peers.PEERS:
                info["returned_s"] = round(max(r.detail["returned"] for r in results) - t0, 3)
        if status:
            info.update(status.summary(t0 + drain_s))
        if fair:
            res = dict(fair.result)
            done_at = res.pop("fair_done_at", None)
            if done_at is not None:
                res["big_still_draining"] = done_at < t0 + drain_s
                res["big_done_after_s"] = round(t0 + drain_s - done_at, 3)
            info.update(res)
        if cell.after:
            info.update(wl_after(url, run_id))
        if cell.tag:
            info["scale_run"] = cell.tag
        rss = max(r.rss_kib for r in results) / 1024
        out.append(Sample(backend.name, system, drain_phase, cell.processes, cell.chunk, rep,
                          cell.items, drain_s, rss_mib=rss, extra=info))
    return out


def describe_cell(got: list[Sample]) -> str:
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
# Lines under the table
# =============================================================================================


def status_lines(samples: list[Sample], backends: list[Any]) -> list[str]:
    lines = []
    for b in backends:
        for n in sorted({s.items for s in samples if s.backend == b.name}):
            ms = [s.extra["status_ms_pending"] for s in samples
                  if (s.backend, s.system, s.phase, s.items)
                  == (b.name, "workledger", "decompose", n)]
            if ms:
                lines.append(f"{b.name}: ledger.status(run) right after decomposition ({n:,} "
                             f"pending): median {statistics.median(ms):.0f} ms "
                             f"[{min(ms):.0f}-{max(ms):.0f}]")
            polled = [s for s in samples if s.backend == b.name and s.items == n
                      and s.phase in ("drain+status", "drain+fair")]
            calls = [m for s in polled for m in s.extra.get("status_ms", ())]
            if calls:
                s = polled[0]
                clean = [x.rate for x in samples if (x.backend, x.system, x.phase, x.processes,
                         x.chunk, x.items) == (b.name, "workledger", "drain", s.processes,
                                               s.chunk, n)]
                med = statistics.median(calls)
                lines.append(
                    f"{b.name}: ledger.status(run) from the parent every "
                    f"{STATUS_EVERY * 1000:.0f} ms while {s.processes} worker process(es) "
                    f"drain {n:,} items (C={s.chunk}): median {med:.0f} ms, max "
                    f"{max(calls):.0f} ms over {len(calls)} calls; drain meanwhile "
                    f"{statistics.median(x.rate for x in polled):,.0f}/s"
                    + (f" (without polling {statistics.median(clean):,.0f}/s)" if clean else "")
                    + f"; i5 <{STATUS_FLOOR_MS:.0f} ms "
                    f"{'ok' if med < STATUS_FLOOR_MS else 'BELOW'}")
            for s in polled:
                if s.extra.get("status_error"):
                    lines.append(f"{b.name}: status probe failed: {s.extra['status_error']}")
    return lines


def scale_lines(samples: list[Sample], backends: list[Any]) -> list[str]:
    lines = []
    for b in backends:
        mine = [s for s in samples if s.backend == b.name and s.extra.get("scale_run")]
        if not mine:
            continue

        def one(tag: str, phase: str, mine: list[Sample] = mine) -> Sample | None:
            return next((s for s in mine if s.extra["scale_run"] == tag and s.phase == phase),
                        None)
        small, big = one("tenth", "drain"), one("big", "drain")
        if small and big and small.rss_mib and big.rss_mib:
            ratio = big.rss_mib / small.rss_mib
            lines.append(f"{b.name}: worker peak RSS {small.rss_mib:.0f} MiB at "
                         f"{small.items:,} items, {big.rss_mib:.0f} MiB at {big.items:,}: "
                         f"x{ratio:.2f}; i5 <={RSS_GROWTH_FLOOR}x "
                         f"{'ok' if ratio <= RSS_GROWTH_FLOOR else 'BELOW'}")
        for s in (small, big):
            if s and s.extra.get("cli_status_rss_mib") is not None:
                lines.append(f"{b.name}: `workledger status RUN` as a subprocess on the "
                             f"completed {s.items:,}-item run: peak RSS "
                             f"{s.extra['cli_status_rss_mib']:.0f} MiB, wall "
                             f"{s.extra['cli_status_s']:.2f} s; ledger.reconcile(run) "
                             f"{s.extra['reconcile_s']:.2f} s (repaired: "
                             f"{s.extra['reconcile_repaired']})")
        for s in mine:
            if s.phase.startswith("drain") and s.extra.get("rate_first10"):
                lines.append(f"{b.name}: {s.items:,} items, P={s.processes}"
                             f"{' (monitored)' if s.phase != 'drain' else ''}: claim "
                             f"{s.extra['claim_ms_first']:.1f} ms over the first 10% of "
                             f"chunks, {s.extra['claim_ms_last']:.1f} ms over the last 10% "
                             f"(max {s.extra['claim_ms_max']:.0f}); items/s first 10% "
                             f"{s.extra['rate_first10']:,.0f}, last 10% "
                             f"{s.extra['rate_last10'] or 0:,.0f}")
        fair = one("monitored", "drain+fair")
        if fair:
            x = fair.extra
            if x.get("fair_complete_s") is not None:
                still = x.get("big_still_draining")
                lines.append(
                    f"{b.name}: fairness: a {FAIR_ITEMS}-item run submitted "
                    f"{x['fair_submitted_s']:.1f} s into the {fair.items:,}-item drain "
                    f"completed in {x['fair_complete_s']:.2f} s (submit {x['fair_submit_s']:.2f}"
                    f" s); the big run then had {x['big_processed']:,}/{x['big_total']:,} "
                    f"processed ({x['big_processed'] / max(1, x['big_total']):.0%}) and "
                    + (f"drained on for {x['big_done_after_s']:.1f} s: ok" if still else
                       "had already finished: BELOW (not measured while it drained)"))
            else:
                lines.append(f"{b.name}: fairness: the {FAIR_ITEMS}-item run did not complete "
                             f"during the drain ({x.get('fair_error') or 'drain too short'})")
    return lines


def peer_lines(samples: list[Sample], main_n: int) -> list[str]:
    lines = []
    for peer in peers.PEERS:
        mine = [s for s in samples if s.system == peer and s.phase == "drain"]
        if not mine:
            continue
        ns = sorted({s.items for s in mine})
        tail = statistics.median(s.extra["returned_s"] - s.seconds for s in mine)
        slow = statistics.median(s.items / s.extra["returned_s"] for s in mine)
        note = (f"{peer}: drained {'/'.join(f'{n:,}' for n in ns)} jobs per cell"
                + (f" (--peer-items; workledger {main_n:,}: rates are compared)"
                   if ns != [main_n] else "")
                + f"; timed to its last handler call (in its favour); its workers returned "
                  f"a median {tail * 1000:,.0f} ms later ({slow:,.0f} jobs/s to that point)")
        lines.append(note)
    return lines


def snapshot_source(src: str) -> str:
    """Copy ``src/workledger`` to a temporary folder and import workledger from there, in this
    process and in every spawned worker, so one benchmark run measures one version of the code
    even while the working tree changes under it. Returns the snapshot folder."""
    pkg = os.path.join(src, "workledger")
    if not os.path.isfile(os.path.join(pkg, "__init__.py")):
        sys.exit(f"--src {src}: no workledger package there")
    if "workledger" in sys.modules:
        raise RuntimeError("workledger was imported before the snapshot was taken")
    root = tempfile.mkdtemp(prefix="wl_bench_src_")
    shutil.copytree(pkg, os.path.join(root, "workledger"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return root


def export_rev(rev: str) -> str:
    """``git archive`` the workledger package of commit ``rev`` into a temporary ``src`` folder
    (read-only for the repository). Returns that folder."""
    import io
    import tarfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        data = subprocess.run(["git", "-C", root, "archive", "--format=tar", rev,
                               "src/workledger"], capture_output=True, check=True).stdout
        full = subprocess.run(["git", "-C", root, "rev-parse", "--short", rev],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"--rev {rev}: cannot export it from git: {exc}")
    dest = tempfile.mkdtemp(prefix="wl_bench_rev_")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    os.environ["WL_BENCH_REV"] = full
    return os.path.join(dest, "src")


def source_hash(pkg_dir: str) -> str:
    h = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(pkg_dir)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".sql")):
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, pkg_dir).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:12]


def machine_lines(backends: list[Any]) -> list[str]:
    import psycopg

    lines = [
        f"machine: {platform.node()} | nproc {os.cpu_count()} | {_cpu_model()} | "
        f"{platform.system()} {platform.release()}",
        f"python {platform.python_version()} | sqlite3 {sqlite3.sqlite_version} | "
        f"psycopg {psycopg.__version__} | workledger {_wl_version()}",
    ]
    lines += [f"backend: {b.describe()}" for b in backends]
    return lines


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _wl_version() -> str:
    """The measured code: its source hash, and how it relates to this repository's tree."""
    import workledger

    pkg = os.path.dirname(os.path.abspath(workledger.__file__))
    measured = source_hash(pkg)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    repo = ""
    with contextlib.suppress(Exception):
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "src"],
                               capture_output=True, text=True, check=True).stdout.strip()
        tree = source_hash(os.path.join(root, "src", "workledger"))
        same = "the same" if tree == measured else f"DIFFERENT ({tree})"
        repo = (f"; repo HEAD {head}{' with uncommitted src changes' if dirty else ''}, "
                f"its src/workledger is {same}")
    rev = os.environ.get("WL_BENCH_REV")
    origin = f"git {rev}, " if rev else ""
    return f"{workledger.__version__} source sha256 {measured} ({origin}{pkg}{repo})"


# =============================================================================================
# Profiling one in-process drain (pyinstrument)
# =============================================================================================


def profile_drain(backend: Any, items: int, chunk: int, tool: str, html: str | None) -> None:
    """One decomposition and one in-process drain (the main thread claims and completes, one
    handler thread). ``tool=none`` runs it bare, for an outside sampler such as
    ``py-spy record --idle --threads --format raw`` (keep the stacks containing ``wl_drain``)."""
    profiler: Any = None
    if tool == "pyinstrument":
        try:
            from pyinstrument import Profiler
        except ImportError:
            sys.exit("--profiler pyinstrument: .venv/bin/pip install pyinstrument")
        profiler = Profiler(interval=0.001)
    with backend.fresh() as url:
        seconds, run_id, _ = wl_decompose(url, items)
        print(f"decomposed {items:,} items in {seconds:.2f} s ({items / seconds:,.0f}/s)")
        state = wl_prepare(url, chunk)
        t = time.perf_counter()
        if profiler:
            profiler.start()
        processed, _, _ = wl_drain(url, chunk, state)
        if profiler:
            profiler.stop()
        seconds = time.perf_counter() - t
        wl_verify(url, run_id, items)
    print(f"drained {processed:,} items with chunk {chunk} in {seconds:.2f} s "
          f"({processed / seconds:,.0f}/s{', under the profiler' if profiler else ''})")
    if not profiler:
        return
    print(profiler.output_text(unicode=False, color=False, show_all=False))
    if html:
        with open(html, "w") as f:
            f.write(profiler.output_html())
        print(f"html profile: {html}")



# =============================================================================================
# Main
# =============================================================================================


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=None,
                   help=f"items per run (default 100000; {SCALE_ITEMS} with --scale)")
    p.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4],
                   help="worker process counts (default 1 2 4)")
    p.add_argument("--chunk", type=int, nargs="+", default=[100, 500],
                   help="chunk sizes (default 100 500)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions per cell (default 3)")
    p.add_argument("--systems", nargs="+", choices=["workledger", "raw", *peers.PEERS],
                   default=["workledger", "raw"],
                   help="what to measure (default: workledger and the raw-SQL limit); peers "
                        "(procrastinate, pgqueuer) run on PostgreSQL only")
    p.add_argument("--peers", action="store_true",
                   help="also measure every peer (procrastinate and pgqueuer)")
    p.add_argument("--peer-items", type=int, metavar="N",
                   help="jobs per procrastinate cell (the slow peer; default --items); the "
                        "table compares rates and shows the N used")
    p.add_argument("--pgqueuer-items", type=int, metavar="N",
                   help="jobs per pgqueuer cell (default --items)")
    p.add_argument("--pgqueuer-batch", type=int, default=100,
                   help="pgqueuer QueueManager.run batch_size (default 100)")
    p.add_argument("--pgqueuer-driver", choices=["asyncpg", "psycopg"],
                   help="pgqueuer driver (default asyncpg when installed, else psycopg)")
    p.add_argument("--procrastinate-concurrency", type=int, default=10,
                   help="procrastinate run_worker concurrency per process (default 10)")
    p.add_argument("--extras", nargs="*", choices=["2stage", "status"],
                   default=["2stage", "status"],
                   help="workledger extras with --systems workledger (default both; give "
                        "the option alone for none): a two-stage drain per cell, and one "
                        "drain per backend and repetition (first P, last C) with status polled")
    p.add_argument("--scale", action="store_true",
                   help=f"instead: the scale run ({SCALE_ITEMS:,} items unless --items) per "
                        "backend, next to a run of a tenth of it; once, largest --chunk")
    p.add_argument("--pg-url", default=os.environ.get("WORKLEDGER_BENCH_POSTGRES_URL")
                   or os.environ.get("WORKLEDGER_TEST_POSTGRES_URL") or DEFAULT_PG_ADMIN,
                   help="admin URL; a throwaway database per cell is created next to it")
    p.add_argument("--tmpdir", default=None,
                   help="folder for SQLite files (default: the system temp dir; keep it on disk)")
    p.add_argument("--quiet-below", type=float, default=0.15,
                   help="before each cell wait until other processes use less than this share "
                        "of all CPUs (default 0.15)")
    p.add_argument("--quiet-wait", type=float, default=120,
                   help="wait at most this many seconds for quiet per cell; 0 turns the probe "
                        "off (default 120)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds allowed per drain")
    p.add_argument("--src", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"),
                   help="folder holding the workledger package to snapshot (default: ../src)")
    p.add_argument("--rev", help="measure the workledger package of this git commit instead "
                   "(exported with git archive; e.g. HEAD)")
    p.add_argument("--no-snapshot", action="store_true",
                   help="import the installed workledger instead of a snapshot of --src")
    p.add_argument("--json", metavar="PATH", help="also write every sample as JSON")
    p.add_argument("--profile", choices=["sqlite", "postgres"],
                   help="instead: profile one in-process workledger drain (first --chunk)")
    p.add_argument("--profiler", choices=["pyinstrument", "none"], default="pyinstrument",
                   help="with --profile: pyinstrument, or none (for py-spy from outside)")
    p.add_argument("--profile-html", metavar="PATH", help="with --profile: also write HTML")
    args = p.parse_args(argv)
    if args.items is None:
        args.items = SCALE_ITEMS if args.scale else 100_000
    if args.pgqueuer_driver:
        os.environ["WL_BENCH_PGQ_DRIVER"] = args.pgqueuer_driver  # spawned workers inherit it
    if args.peers:
        args.systems = list(dict.fromkeys([*args.systems, *peers.PEERS]))
    if args.scale and args.items < 10:
        p.error("--scale needs --items of at least 10")
    positive = [args.items, args.repeat, min(args.processes), min(args.chunk),
                args.pgqueuer_batch, args.procrastinate_concurrency,
                args.peer_items or 1, args.pgqueuer_items or 1]
    if min(positive) < 1:
        p.error("--items, --repeat, --processes, --chunk and the peer settings must be "
                "positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exported = export_rev(args.rev) if args.rev else None
    snapshot = None if args.no_snapshot and not exported else snapshot_source(exported or args.src)
    try:
        return _main(args)
    finally:
        for folder in (snapshot, exported and os.path.dirname(exported)):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)


def plan_cells(args: argparse.Namespace, backends: list[Any], notes: list[str]
               ) -> list[Cell]:
    """The cells of one repetition, in the order they run."""
    cells: list[Cell] = []
    if args.scale:
        big, chunk = args.items, max(args.chunk)
        for b in backends:
            cells.append(Cell(b, "workledger", max(1, big // 10), 1, chunk, after=True,
                              tag="tenth"))
            cells.append(Cell(b, "workledger", big, 1, chunk, after=True, tag="big"))
            if b.name == "postgres":
                cells.append(Cell(b, "workledger", big, 2, chunk, tag="big-2p"))
            cells.append(Cell(b, "workledger", big, 1, chunk, fair=True, tag="monitored"))
        return cells
    own = [s for s in args.systems if s in ("workledger", "raw")]
    wanted_peers = [s for s in args.systems if s in peers.PEERS]
    for b in backends:
        for procs in args.processes:
            for chunk in args.chunk:
                for system in own:
                    cells.append(Cell(b, system, args.items, procs, chunk))
                if "workledger" in own and "2stage" in args.extras:
                    cells.append(Cell(b, "workledger-2stage", args.items, procs, chunk))
        if "workledger" in own and "status" in args.extras:
            cells.append(Cell(b, "workledger", args.items, args.processes[0], args.chunk[-1],
                              status=True))
        if b.name != "postgres":
            continue
        for peer in wanted_peers:
            if peer == "procrastinate":
                n, setting = args.peer_items or args.items, args.procrastinate_concurrency
            else:
                n, setting = args.pgqueuer_items or args.items, args.pgqueuer_batch
            for procs in args.processes:
                cells.append(Cell(b, peer, n, procs, setting))
    if wanted_peers and not any(b.name == "postgres" for b in backends):
        notes.append(f"{', '.join(wanted_peers)}: peers run on PostgreSQL only; none here")
    return cells


def _main(args: argparse.Namespace) -> int:
    names = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    if args.profile:
        names = [args.profile]
    backends: list[Any] = []
    notes: list[str] = []
    for peer in [s for s in args.systems if s in peers.PEERS]:
        why = peers.missing(peer)
        if why:
            print(why, file=sys.stderr)
            notes.append(why)
            args.systems.remove(peer)
    try:
        for name in names:
            if name == "sqlite":
                backends.append(SqliteBackend(args.tmpdir))
            else:
                try:
                    backends.append(PostgresBackend(args.pg_url))
                except Exception as exc:  # noqa: BLE001 - report and go on with the others
                    print(f"postgres: unreachable at {args.pg_url}: {exc}", file=sys.stderr)
        if args.profile:
            if not backends:
                return 1
            for line in machine_lines(backends):
                print(line)
            profile_drain(backends[0], args.items, args.chunk[0], args.profiler,
                          args.profile_html)
            return 0

        header = machine_lines(backends)
        if any(b.name == "postgres" for b in backends):
            settings = {"procrastinate": args.procrastinate_concurrency,
                        "pgqueuer": args.pgqueuer_batch}
            header += [f"peer: {peers.describe(p, settings[p])}" for p in peers.PEERS
                       if p in args.systems]
        for line in header:
            print(line, file=sys.stderr)
        samples: list[Sample] = []
        failures: list[str] = []
        cells = plan_cells(args, backends, notes)
        repeat = 1 if args.scale else args.repeat
        for rep in range(1, repeat + 1):  # repetitions interleaved: drift spreads evenly
            for cell in cells:
                label = f"[rep {rep}/{repeat}] {cell.label}"
                before = wait_quiet(args.quiet_below, args.quiet_wait) if args.quiet_wait else 0
                try:
                    got = run_cell(cell, rep, args.timeout)
                except Exception as exc:  # noqa: BLE001 - a failing adapter is a finding
                    msg = f"{label}: FAILED: {str(exc).strip().splitlines()[-1]}"
                    failures.append(msg)
                    print(msg, file=sys.stderr)
                    continue
                after = cpu_busy() if args.quiet_wait else 0
                for g in got:
                    g.extra["foreign_cpu_before"] = round(before, 3)
                    g.extra["foreign_cpu_after"] = round(after, 3)
                samples += got
                print(f"{label}  {describe_cell(got)} (other load {before:.0%} before / "
                      f"{after:.0%} after)", file=sys.stderr, flush=True)

        mode = (f"scale run: N={args.items:,} next to N={max(1, args.items // 10):,}, once"
                if args.scale else f"N={args.items:,} no-op items, median of {args.repeat}")
        print(f"workledger benchmark: {mode} [min-max], items/s; drain = claim+complete by P "
              f"worker processes, concurrency=1 each")
        for line in header:
            print(line)
        if args.quiet_wait:
            loads = [v for s in samples if s.phase.startswith("drain")
                     for v in (s.extra["foreign_cpu_before"], s.extra["foreign_cpu_after"])]
            if loads:
                print(f"other processes' CPU load next to each cell (idle-time probe, share of "
                      f"all CPUs): median {statistics.median(loads):.0%}, max {max(loads):.0%}")
        print()
        print(render_table(samples, args.items))
        for line in [*status_lines(samples, backends), *scale_lines(samples, backends),
                     *peer_lines(samples, args.items), *notes, *failures]:
            print(line)
        if args.scale:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"parent process peak RSS: {rss:.0f} MiB")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"argv": sys.argv, "header": header, "notes": notes,
                           "samples": [asdict(s) | {"rate": s.rate} for s in samples],
                           "failures": failures}, f, indent=1)
        return 1 if failures else 0
    finally:
        for b in backends:
            b.close()


if __name__ == "__main__":
    sys.exit(main())
