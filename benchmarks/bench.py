#!/usr/bin/env python
"""workledger benchmark: decomposition and claim+complete of no-op items, side by side with
"the limit" (a minimal hand-written raw-SQL loop doing the same durable work), on SQLite and
PostgreSQL. Prints one plain-text table; see benchmarks/README.md.

    python benchmarks/bench.py [--items N] [--backend sqlite|postgres|both]
                               [--processes 1 2 4] [--chunk 100 500] [--repeat 3]

Every cell (backend x system x processes x chunk x repetition) starts from a fresh database:
a new SQLite file in a temporary folder on disk, or a new PostgreSQL database
``wl_bench_<tag>_<n>`` created from the admin URL and dropped right after the cell.

Measured per cell:

* ``decompose`` (workledger): wall time of ``job.submit(payload)`` whose decomposer yields
  ``Item(key=i)`` for ``i < N``; the raw twin inserts N rows with executemany (SQLite) or COPY
  (PostgreSQL) in transactions of 5,000 rows (workledger's decomposition batch).
* ``claim+complete``: P worker processes (multiprocessing, spawn) each open their own
  connection, wait at a start event, then drain. workledger workers run
  ``ledger.work(concurrency=1, chunk=C, until_idle=True)``; raw workers loop
  claim-chunk / no-op / one guarded UPDATE. The drain time runs from the start event to the
  last chunk's commit in any process (idle-polling after the run is done is not counted; the
  time until every worker exited is kept in ``--json`` output as ``exit_s``).

workledger is imported from a copy of ``src/workledger`` taken at start (or of ``--rev``), in
the parent and in every spawned worker, so a run measures one version of the code.

The code is organised so that issue 5 can add scenarios (peers, 2-stage runs, 1M runs,
status latency) as more ``Scenario`` functions returning ``Sample`` rows.
"""

from __future__ import annotations

import argparse
import contextlib
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
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

DEFAULT_PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
INSERT_BATCH = 5000  # workledger.runtime.decompose.BATCH: the raw twin uses the same batches
LEASE_SECONDS = 30.0
JOB = "bench-noop"

# Issue 2 floors (reported, never asserted).
FLOORS_ISSUE2 = {
    ("sqlite", "decompose", None): 50_000,
    ("postgres", "decompose", None): 50_000,
    ("sqlite", "drain", 1): 10_000,
    ("postgres", "drain", 1): 5_000,
}
# Issue 5 ratio floors (workledger / raw), reported only.
RATIO_FLOORS_ISSUE5 = {"decompose": 0.70, "drain": 0.60}


# =============================================================================================
# Samples and the table
# =============================================================================================


@dataclass
class Sample:
    backend: str  # sqlite | postgres
    system: str  # workledger | raw
    phase: str  # decompose | drain
    processes: int | None
    chunk: int | None
    rep: int
    items: int
    seconds: float
    rss_mib: float | None = None  # peak RSS of the largest worker process
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else float("inf")


def _fmt_rate(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:>9,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def _floor_note(backend: str, phase: str, procs: int | None, chunk: int | None,
                wl: float | None, ratio: float | None) -> str:
    notes = []
    floor = FLOORS_ISSUE2.get((backend, phase, procs))
    if floor is not None and wl is not None:
        notes.append(f"i2 >={floor // 1000}k {'ok' if wl >= floor else 'BELOW'}")
    rfloor = RATIO_FLOORS_ISSUE5.get(phase)
    applies = phase == "decompose" or (chunk == 500 and (
        procs == 1 or (backend == "postgres" and procs == 2)))
    if rfloor is not None and ratio is not None and applies:
        notes.append(f"i5 >={rfloor:.0%} {'ok' if ratio >= rfloor else 'BELOW'}")
    return "; ".join(notes)


def render_table(samples: list[Sample]) -> str:
    """One row per (backend, phase, processes, chunk): workledger vs raw, median [min-max]."""
    keys: list[tuple[str, str, int | None, int | None]] = []
    for s in samples:
        k = (s.backend, s.phase, s.processes, s.chunk)
        if k not in keys:
            keys.append(k)
    order = {"decompose": 0, "drain": 1}
    backends = list(dict.fromkeys(k[0] for k in keys))  # in the order they were measured
    keys.sort(key=lambda k: (backends.index(k[0]), order.get(k[1], 9), k[2] or 0, k[3] or 0))
    head = ["backend", "phase", "procs", "chunk", "workledger items/s [min-max]",
            "raw SQL items/s [min-max]", "wl/raw", "wl RSS MiB", "floors (not asserted)"]
    rows = [head]
    for backend, phase, procs, chunk in keys:
        def pick(system: str, backend: str = backend, phase: str = phase,
                 procs: int | None = procs, chunk: int | None = chunk) -> list[Sample]:
            return [s for s in samples if (s.backend, s.system, s.phase, s.processes, s.chunk)
                    == (backend, system, phase, procs, chunk)]
        wl, raw = pick("workledger"), pick("raw")
        wl_med = statistics.median([s.rate for s in wl]) if wl else None
        raw_med = statistics.median([s.rate for s in raw]) if raw else None
        ratio = wl_med / raw_med if wl_med and raw_med else None
        rss = [s.rss_mib for s in wl if s.rss_mib is not None]
        rows.append([
            backend,
            "decompose" if phase == "decompose" else "claim+complete",
            "-" if procs is None else str(procs),
            "-" if chunk is None else str(chunk),
            _fmt_rate([s.rate for s in wl]),
            _fmt_rate([s.rate for s in raw]),
            "-" if ratio is None else f"{ratio:.2f}",
            f"{max(rss):.0f}" if rss else "-",
            _floor_note(backend, phase, procs, chunk, wl_med, ratio),
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    right = {2, 3, 4, 5, 6, 7}
    lines = []
    for n, r in enumerate(rows):
        cells = [c.rjust(w) if i in right and n else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


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
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out.put(asdict(WorkerResult(os.getpid(), items, last, ended, rss, detail)))
    except BaseException:  # report every failure to the parent, which fails the cell
        if not said_ready:
            ready.put(os.getpid())
        out.put(asdict(WorkerResult(os.getpid(), 0, 0.0, time.monotonic(), 0,
                                    error=traceback.format_exc())))


def run_workers(fn_name: str, url: str, processes: int, chunk: int,
                timeout: float) -> tuple[float, float, list[WorkerResult]]:
    """Start ``processes`` workers together; return (drain seconds, exit seconds, results)."""
    ctx = mp.get_context("spawn")
    ready, out, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_child, args=(fn_name, url, chunk, ready, start, out))
             for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        t0 = time.monotonic()
        start.set()
        results = [WorkerResult(**out.get(timeout=timeout)) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"a worker process failed:\n{errors[0]}")
    last = max((r.last_commit for r in results if r.last_commit), default=t0)
    return last - t0, max(r.ended for r in results) - t0, results


# =============================================================================================
# workledger through its public API
# =============================================================================================


def split(payload: dict[str, Any]) -> Iterator[Any]:
    from workledger import Item

    for i in range(payload["n"]):
        yield Item(key=i)


def noop(item: Any, ctx: Any) -> None:
    return None


def define(url: str) -> Any:
    from workledger import Ledger

    ledger = Ledger(url)
    job = ledger.job(JOB)
    job.decompose(split)
    job.stage("noop", idempotent=True)(noop)
    return ledger


def wl_decompose(url: str, items: int) -> tuple[float, int, dict[str, Any]]:
    ledger = define(url)
    try:
        ledger.store  # noqa: B018 - open and migrate outside the timed section
        t = time.perf_counter()
        sub = ledger.job(JOB).submit({"n": items}, key="bench")
        seconds = time.perf_counter() - t
        assert sub.created and sub.status.total == items, sub
        t = time.perf_counter()
        ledger.status(sub.run_id)
        status_ms = (time.perf_counter() - t) * 1000
        return seconds, sub.run_id, {"status_ms_pending": round(status_ms, 2)}
    finally:
        ledger.close()


def wl_prepare(url: str, chunk: int) -> Any:
    ledger = define(url)
    ledger.store  # noqa: B018 - connect (and see the migrated schema) before the start event
    return ledger


def wl_drain(url: str, chunk: int, ledger: Any) -> tuple[int, float, dict[str, Any]]:
    last = [0.0]

    def progress(report: Any) -> None:
        last[0] = time.monotonic()

    try:
        report = ledger.work(concurrency=1, chunk=chunk, until_idle=True, on_progress=progress)
    finally:
        ledger.close()
    return report.processed, last[0], {"chunks": report.chunks, "stale": report.stale,
                                       "claimed": report.claimed}


def wl_verify(url: str, run_id: int, items: int) -> None:
    ledger = define(url)
    try:
        st = ledger.status(run_id)
        if not (st.complete and st.processed == items):
            raise RuntimeError(f"workledger run not complete after the drain: {st}")
    finally:
        ledger.close()


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
    "raw": (raw_prepare, raw_drain),
}

# name -> (decompose/insert: (url, N) -> (seconds, run_id, extra), verify after the drain)
LOADERS: dict[str, tuple[Callable[[str, int], tuple[float, int, dict[str, Any]]],
                         Callable[[str, int, int], None]]] = {
    "workledger": (wl_decompose, wl_verify),
    "raw": (raw_insert, raw_verify),
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


def run_cell(backend: Any, system: str, items: int, processes: int, chunk: int, rep: int,
             timeout: float) -> list[Sample]:
    load, verify = LOADERS[system]
    with backend.fresh() as url:
        seconds, run_id, extra = load(url, items)
        out = [Sample(backend.name, system, "decompose", None, None, rep, items, seconds,
                      extra=extra)]
        drain_s, exit_s, results = run_workers(system, url, processes, chunk, timeout)
        done = sum(r.items for r in results)
        if done != items:
            raise RuntimeError(f"{system} workers completed {done} items, expected {items}")
        verify(url, run_id, items)
        rss = max(r.rss_kib for r in results) / 1024
        out.append(Sample(backend.name, system, "drain", processes, chunk, rep, items, drain_s,
                          rss_mib=rss, extra={"exit_s": round(exit_s, 3),
                                              "per_worker": [r.items for r in results]}))
    return out


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
        ledger = wl_prepare(url, chunk)
        t = time.perf_counter()
        if profiler:
            profiler.start()
        processed, _, _ = wl_drain(url, chunk, ledger)
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
    p.add_argument("--items", type=int, default=100_000, help="items per run (default 100000)")
    p.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4],
                   help="worker process counts (default 1 2 4)")
    p.add_argument("--chunk", type=int, nargs="+", default=[100, 500],
                   help="chunk sizes (default 100 500)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions per cell (default 3)")
    p.add_argument("--systems", nargs="+", choices=sorted(DRAINS), default=["workledger", "raw"],
                   help="what to measure (default both: workledger and the raw-SQL limit)")
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
    if args.items < 1 or args.repeat < 1 or min(args.processes) < 1 or min(args.chunk) < 1:
        p.error("--items, --repeat, --processes and --chunk must be positive")
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


def _main(args: argparse.Namespace) -> int:
    names = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    if args.profile:
        names = [args.profile]
    backends: list[Any] = []
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
        for line in header:
            print(line, file=sys.stderr)
        samples: list[Sample] = []
        failures: list[str] = []
        cells = [(b, system, p, c) for b in backends for p in args.processes
                 for c in args.chunk for system in args.systems]
        for rep in range(1, args.repeat + 1):  # repetitions interleaved: drift spreads evenly
            for b, system, procs, chunk in cells:
                label = f"[rep {rep}/{args.repeat}] {b.name:8} {system:10} P={procs} C={chunk}"
                before = wait_quiet(args.quiet_below, args.quiet_wait) if args.quiet_wait else 0
                try:
                    got = run_cell(b, system, args.items, procs, chunk, rep, args.timeout)
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
                d, w = got
                print(f"{label}  decompose {d.rate:>9,.0f}/s  drain {w.rate:>9,.0f}/s "
                      f"(exit {w.extra['exit_s']:.2f}s, rss {w.rss_mib:.0f} MiB, other load "
                      f"{before:.0%} before / {after:.0%} after)", file=sys.stderr, flush=True)

        print(f"workledger benchmark: N={args.items:,} no-op items, median of {args.repeat} "
              f"[min-max], items/s; drain = claim+complete by P worker processes, "
              f"concurrency=1 each")
        for line in header:
            print(line)
        if args.quiet_wait:
            loads = [v for s in samples if s.phase == "drain"
                     for v in (s.extra["foreign_cpu_before"], s.extra["foreign_cpu_after"])]
            if loads:
                print(f"other processes' CPU load next to each cell (idle-time probe, share of "
                      f"all CPUs): median {statistics.median(loads):.0%}, max {max(loads):.0%}")
        print()
        print(render_table(samples))
        for b in backends:
            ms = [s.extra["status_ms_pending"] for s in samples
                  if (s.backend, s.system, s.phase) == (b.name, "workledger", "decompose")]
            if ms:
                print(f"{b.name}: ledger.status(run) right after decomposition ({args.items:,} "
                      f"pending): median {statistics.median(ms):.0f} ms "
                      f"[{min(ms):.0f}-{max(ms):.0f}]")
        for msg in failures:
            print(msg)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"argv": sys.argv, "header": header,
                           "samples": [asdict(s) | {"rate": s.rate} for s in samples],
                           "failures": failures}, f, indent=1)
        return 1 if failures else 0
    finally:
        for b in backends:
            b.close()


if __name__ == "__main__":
    sys.exit(main())
