"""Many small runs against one big one (issue 25): the no-op drain of R runs of M items, side by
side with one run of R x M items, on the same backend, chunk and worker processes; and the
rate of recording many runs, one ``submit`` at a time and in one ``submit_many``.

    python benchmarks/many_runs.py --backend both --processes 1 4 --repeat 3

Each cell is a fresh ledger (a temporary SQLite file, or a throwaway PostgreSQL database); the
drain time runs from the start event to the last chunk's commit in any worker process
(workers.py). Prints one table; ``ratio`` is the cell's items/s over the one big run's in the
same group.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from backends import PostgresBackend, SqliteBackend
from systems import JOB, define
from workers import run_workers

SHAPES = ((1, 10_000), (2_000, 5), (10_000, 1))


def load(url: str, runs: int, items: int, many: bool) -> float:
    """Record ``runs`` runs of ``items`` items each; return the seconds it took."""
    ledger = define(url)
    try:
        ledger.store  # noqa: B018 - open and migrate outside the timed section
        job = ledger.job(JOB)
        t = time.perf_counter()
        if many and hasattr(job, "submit_many"):
            job.submit_many([({"n": items}, f"r{i}") for i in range(runs)])
        else:
            for i in range(runs):
                job.submit({"n": items}, key=f"r{i}")
        return time.perf_counter() - t
    finally:
        ledger.close()


def verify(url: str, runs: int, items: int) -> None:
    ledger = define(url)
    try:
        done = ledger.store.runs_list(limit=runs + 1)
        left = [r.id for r in done if r.completed_at is None or r.processed != items]
        if len(done) != runs or left:
            raise RuntimeError(f"{len(left)} of {len(done)} runs not drained: {left[:5]}")
    finally:
        ledger.close()


def cell(backend: Any, runs: int, items: int, processes: int, chunk: int, many: bool
         ) -> dict[str, float]:
    with backend.fresh() as url:
        load_s = load(url, runs, items, many)
        drain_s, _, _, results = run_workers("workledger", url, processes, chunk, timeout=600)
        verify(url, runs, items)
        done = sum(r.items for r in results)
        assert done == runs * items, (done, runs * items)
        return {"drain": runs * items / drain_s, "submit": runs / load_s}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 4])
    p.add_argument("--chunk", type=int, default=500)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--tmpdir", default=None)
    p.add_argument("--one-by-one", action="store_true",
                   help="record the runs with one submit each, not submit_many")
    args = p.parse_args(argv)
    names = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    print(f"{'backend':9} {'proc':>4} {'runs x items':>13} {'items/s':>9} {'ratio':>6} "
          f"{'runs/s recorded':>16}")
    for name in names:
        backend = SqliteBackend(args.tmpdir) if name == "sqlite" else PostgresBackend(args.pg_url)
        try:
            for processes in args.processes:
                base = 0.0
                for runs, items in SHAPES:
                    got = [cell(backend, runs, items, processes, args.chunk,
                                not args.one_by_one) for _ in range(args.repeat)]
                    rate = statistics.median(g["drain"] for g in got)
                    submit = statistics.median(g["submit"] for g in got)
                    base = base or rate
                    print(f"{name:9} {processes:>4} {f'{runs:,} x {items:,}':>13} "
                          f"{rate:>9,.0f} {rate / base:>6.2f} {submit:>16,.0f}", flush=True)
        finally:
            backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
