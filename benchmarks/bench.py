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
  ``ledger.status(run)`` every 100 ms; and, only when asked, ``plain``: the same N items through
  one no-op stage that is *not* idempotent, whose starts and outcomes are written as they
  happen (one write each per item) rather than once per chunk.
* ``--scale``: per backend a 1,000,000-item run (``--items`` when given) next to one of a
  tenth of it: decomposition, drain (1 process; also 2 on PostgreSQL), worker peak RSS,
  ``workledger status`` peak RSS as a subprocess, ``reconcile`` time, claim latency at start
  and end, and a monitored drain: ``status`` every 100 ms and a 10-item run submitted while
  the big one drains (fairness).

workledger is imported from a copy of ``src/workledger`` taken at start (or of ``--rev``), in
the parent and in every spawned worker, so a run measures one version of the code.

The modules next to this entry point (it parses the options and dispatches):

* ``grid.py``: the cells and their repetitions; ``scale.py``: the ``--scale`` run;
* ``systems.py``: workledger through its public API, and the registry of the kinds of cell;
  ``backends.py``: a fresh SQLite file or PostgreSQL database per cell, and the raw-SQL loop;
  ``peers.py``: procrastinate and pgqueuer;
* ``workers.py``: the spawned worker processes; ``probes.py``: status and fairness probes;
* ``report.py``: the table, the ratios and floors, the lines under it, ``--json``;
* ``source.py``: the snapshot (or ``--rev`` export) of the measured code, the header;
  ``profiling.py``: ``--profile``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# next to this script; none of them imports workledger (nor a peer) until it is used
import grid  # noqa: E402
import peers  # noqa: E402
import report  # noqa: E402
import scale  # noqa: E402
import source  # noqa: E402
from backends import DEFAULT_PG_ADMIN, PostgresBackend, SqliteBackend  # noqa: E402
from profiling import profile_drain  # noqa: E402

# =============================================================================================
# Options
# =============================================================================================


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _grid_options(p)
    _peer_options(p)
    _run_options(p)
    args = p.parse_args(argv)
    if args.items is None:
        args.items = scale.SCALE_ITEMS if args.scale else 100_000
    peers.use_driver(args.pgqueuer_driver)
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


def _grid_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--items", type=int, default=None,
                   help=f"items per run (default 100000; {scale.SCALE_ITEMS} with --scale)")
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


def _peer_options(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--extras", nargs="*", choices=["2stage", "status", "plain"],
                   default=["2stage", "status"],
                   help="workledger extras with --systems workledger (default both; give "
                        "the option alone for none): a two-stage drain per cell, and one "
                        "drain per backend and repetition (first P, last C) with status polled; "
                        "'plain' (not by default): a drain of a stage that is not idempotent")
    p.add_argument("--scale", action="store_true",
                   help=f"instead: the scale run ({scale.SCALE_ITEMS:,} items unless --items) "
                        "per backend, next to a run of a tenth of it; once, largest --chunk")


def _run_options(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--src", default=os.path.join(source.ROOT, "src"),
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


# =============================================================================================
# Dispatch
# =============================================================================================


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exported = source.export_rev(args.rev) if args.rev else None
    snapshot = (None if args.no_snapshot and not exported
                else source.snapshot_source(exported or args.src))
    try:
        return _main(args)
    finally:
        for folder in (snapshot, exported and os.path.dirname(exported)):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)


def _main(args: argparse.Namespace) -> int:
    notes = peers.drop_missing(args.systems)
    backends: list[Any] = []
    try:
        _open_backends(args, backends)
        if args.profile:
            return _profile(args, backends)
        return _measure(args, backends, notes)
    finally:
        for b in backends:
            b.close()


def _open_backends(args: argparse.Namespace, backends: list[Any]) -> None:
    """Into ``backends``: the ones asked for; an unreachable PostgreSQL is reported and left
    out."""
    names = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    for name in [args.profile] if args.profile else names:
        if name == "sqlite":
            backends.append(SqliteBackend(args.tmpdir))
            continue
        try:
            backends.append(PostgresBackend(args.pg_url))
        except Exception as exc:  # noqa: BLE001 - report and go on with the others
            print(f"postgres: unreachable at {args.pg_url}: {exc}", file=sys.stderr)


def _profile(args: argparse.Namespace, backends: list[Any]) -> int:
    if not backends:
        return 1
    for line in source.machine_lines(backends):
        print(line)
    profile_drain(backends[0], args.items, args.chunk[0], args.profiler, args.profile_html)
    return 0


def _measure(args: argparse.Namespace, backends: list[Any], notes: list[str]) -> int:
    """The grid (or the scale run): the header and progress on stderr, the report on stdout."""
    header = source.machine_lines(backends) + peers.header_lines(args, backends)
    for line in header:
        print(line, file=sys.stderr)
    if args.scale:
        samples, failures = grid.run_cells(scale.scale_cells(args, backends), 1, args)
    else:
        samples, failures = grid.run_cells(grid.grid_cells(args, backends, notes),
                                           args.repeat, args)
    lines = [*report.status_lines(samples, backends), *scale.scale_lines(samples, backends),
             *report.peer_lines(samples, args.items), *notes, *failures]
    if args.scale:
        lines.append(scale.parent_rss_line())
    report.print_report(args, header, samples, lines)
    if args.json:
        report.write_json(args.json, header, notes, samples, failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
