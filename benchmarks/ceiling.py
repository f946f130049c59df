"""How fast can workledger's own SQL go? The statements of a drain, without the worker.

bench.py compares workledger's drain with a raw-SQL loop ("the limit"). This script splits the
difference in two: it drains N items with **workledger's own statements** (the named queries
in ``src/workledger/storage/sql/<dialect>/queries.sql``, in the transactions the adapters use:
claim + stage counts, then the grouped finish + the run's counters + stage counts), sent from a
plain driver loop with no worker, thread pool, handler call or per-item Python object; and it
drains the same N with bench.py's raw loop (backends.py), on the same machine, alternately.

What the first loop cannot beat is the cost of the ledger's schema (a wider row, the unique
(run_id, stage, seq) key and the lease index kept on every update, timestamps, counters); what
workledger adds on top of it is Python. Reported, never asserted:

    .venv/bin/python benchmarks/ceiling.py    # N=100,000, both backends, C=500, 3 rounds
    .venv/bin/python benchmarks/ceiling.py --items 20000 --rounds 1 --backend sqlite
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import backends  # noqa: E402  (bench.py's fresh databases and its raw loop)

from workledger import Item, Ledger  # noqa: E402
from workledger.storage.queries import queries  # noqa: E402

ADMIN = os.environ.get("WORKLEDGER_BENCH_POSTGRES_URL",
                       "postgresql://postgres@127.0.0.1:5432/test")


def _decompose(url: str, n: int) -> int:
    ledger = Ledger(url)
    job = ledger.job("ceiling")
    job.decompose(lambda p: (Item(key=i) for i in range(p["n"])))
    job.stage("a", idempotent=True)(lambda item, ctx: None)
    run_id = job.submit({"n": n}).run_id
    ledger.close()
    return run_id


def wl_sqlite(path: str, run_id: int, chunk: int) -> int:
    q = queries("sqlite")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    done, after = 0, 0
    while True:
        conn.execute("BEGIN IMMEDIATE")
        token = conn.execute(q["lease_token_next"]).fetchone()[0]
        rows = conn.execute(q["items_claim"], {
            "token": token, "lease": "+30.000 seconds", "run_id": run_id, "after_id": after,
            "limit": chunk}).fetchall()
        if rows:
            conn.executemany(q["counts_add"], [(run_id, "a", "claimed", len(rows)),
                                               (run_id, "a", "pending", -len(rows))])
        conn.execute("COMMIT")
        if not rows:
            break
        after = rows[-1][0]
        conn.execute("BEGIN IMMEDIATE")
        found = conn.execute(q["items_finish_group"], {
            "state": "processed", "result": None, "error": None, "charge": 1, "delay": None,
            "token": token, "ids": json.dumps([r[0] for r in rows])}).fetchall()
        conn.execute(q["run_add_units"], {"run_id": run_id, "processed": len(found),
                                          "failed": 0, "skipped": 0}).fetchone()
        conn.executemany(q["counts_add"], [(run_id, "a", "claimed", -len(found)),
                                           (run_id, "a", "processed", len(found))])
        conn.execute("COMMIT")
        done += len(found)
    conn.close()
    return done


def wl_postgres(url: str, run_id: int, chunk: int) -> int:
    import psycopg

    q = queries("postgres")
    done, after = 0, 0
    with psycopg.connect(url) as conn:
        conn.execute("SET jit = off")
        conn.commit()
        while True:
            rows = conn.execute(q["items_claim"], {
                "lease": 30.0, "run_id": run_id, "after_id": after, "limit": chunk}).fetchall()
            if rows:
                conn.execute(q["counts_add"], {"run_id": run_id, "stages": ["a", "a"],
                                               "states": ["claimed", "pending"],
                                               "ns": [len(rows), -len(rows)]})
            conn.commit()
            if not rows:
                break
            ids = sorted(r[0] for r in rows)
            after = ids[-1]
            found = conn.execute(q["items_finish_group"], {
                "state": "processed", "result": None, "error": None, "charge": 1,
                "delay": None, "token": rows[0][7], "ids": ids}).fetchall()
            conn.execute(q["run_add_units"], {"run_id": run_id, "processed": len(found),
                                              "failed": 0, "skipped": 0}).fetchone()
            conn.execute(q["counts_add"], {"run_id": run_id, "stages": ["a", "a"],
                                           "states": ["claimed", "processed"],
                                           "ns": [-len(found), len(found)]})
            conn.commit()
            done += len(found)
    return done


def one_round(backend: str, items: int, chunk: int) -> dict[str, float]:
    """One drain per system, each on a fresh database (backends.py makes them)."""
    place = (backends.SqliteBackend(None) if backend == "sqlite"
             else backends.PostgresBackend(ADMIN))
    rates: dict[str, float] = {}
    try:
        for system in ("workledger SQL", "raw SQL"):
            with place.fresh() as url:
                if system == "raw SQL":
                    backends.raw_insert(url, items)
                    state = backends.raw_prepare(url, chunk)
                    t = time.perf_counter()
                    n, _last, _ = backends.raw_drain(url, chunk, state)
                    rates[system] = n / (time.perf_counter() - t)
                    state.close()
                    continue
                run_id = _decompose(url, items)
                t = time.perf_counter()
                if backend == "sqlite":
                    n = wl_sqlite(url.removeprefix("sqlite:///"), run_id, chunk)
                else:
                    n = wl_postgres(url, run_id, chunk)
                rates[system] = n / (time.perf_counter() - t)
    finally:
        place.close()
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = ap.parse_args(argv)
    names = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    report: Callable[[str], None] = print
    report(f"drain of N={args.items:,} items, chunk {args.chunk}, one process, "
           f"median of {args.rounds} [min-max] items/s")
    for backend in names:
        samples: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for system, rate in one_round(backend, args.items, args.chunk).items():
                samples.setdefault(system, []).append(rate)
        med = {s: statistics.median(v) for s, v in samples.items()}
        for system, values in samples.items():
            report(f"{backend:8}  {system:15} {med[system]:>9,.0f} "
                   f"[{min(values):,.0f}-{max(values):,.0f}]")
        report(f"{backend:8}  workledger's statements alone reach "
               f"{med['workledger SQL'] / med['raw SQL']:.2f} of the raw loop")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
