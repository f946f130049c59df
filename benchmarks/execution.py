"""Execution benchmarks (issue 14), side by side in one run, median of ``--repeat``:

1. CPU-bound items (``exec_app.burn``, about 2 ms of one core each): ``worker --processes 1``
   (threads under the GIL), 2 and 4, against ``multiprocessing.Pool(2)`` mapping the same
   function; every figure includes starting its processes.
2. Submit to first start with idle workers: a worker waits idle, a run of one item is
   submitted from another process's connection, and the handler notes when it started.
3. A stage that is not idempotent, one item per handler call against batches of 25.
4. The payroll demo end to end (``demo payroll --json``): its wall time against its render
   limit (the same payslips rendered in one process, no I/O).

    python benchmarks/execution.py --backend both --repeat 3

Floors (not asserted): processes 2 >= 1.6x processes 1 and >= 0.8x the pool; first start under
100 ms on PostgreSQL; payroll wall time within 1.5x of its render limit.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "src")]

import exec_app  # noqa: E402 - after the path

PG_URL = os.environ.get("WORKLEDGER_BENCH_POSTGRES_URL",
                        "postgresql://postgres@127.0.0.1:5432/test")


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "src")]),
            **extra}


def cli(url: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workledger.cli", "--db", url, "--app",
                           "exec_app:ledger", *args], capture_output=True, text=True,
                          env=env(**extra), timeout=1800, check=True)


@contextmanager
def ledger_url(backend: str, tmp: Path) -> Iterator[str]:
    """A new, empty ledger: a SQLite file, or a PostgreSQL database dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp / uuid.uuid4().hex}.db"
        return
    import psycopg

    name = f"wl_exec_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def median(sample: Callable[[], float], repeat: int) -> tuple[float, list[float]]:
    values = [sample() for _ in range(repeat)]
    return statistics.median(values), values


def drain_rate(backend: str, tmp: Path, job: str, n: int, *worker: str) -> float:
    with ledger_url(backend, tmp) as url:
        cli(url, "submit", job, "--payload", json.dumps({"n": n}))
        began = time.perf_counter()
        cli(url, "worker", "--until-idle", *worker)
        return n / (time.perf_counter() - began)


def pool_rate(n: int, processes: int) -> float:
    began = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(exec_app.burn, range(n), chunksize=50)
    return n / (time.perf_counter() - began)


def first_start(backend: str, tmp: Path, repeat: int) -> list[float]:
    """Seconds from a submit (on its own connection) to its handler starting."""
    starts = tmp / f"starts-{uuid.uuid4().hex}"
    starts.touch()
    with ledger_url(backend, tmp) as url:
        cli(url, "init")
        worker = subprocess.Popen([sys.executable, "-m", "workledger.cli", "--db", url, "--app",
                                   "exec_app:ledger", "worker"], env=env(
                                       EXEC_BENCH_STARTS=str(starts)),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        book = exec_app.ledger
        book.use(url)
        latencies = []
        try:
            time.sleep(3.0)  # the worker is up and idle
            for i in range(repeat):
                seen = len(starts.read_text().splitlines())
                began = time.time()
                book.submit("first", {"n": 1}, key=f"first-{i}")
                while len(lines := starts.read_text().splitlines()) == seen:
                    time.sleep(0.001)
                latencies.append(float(lines[-1]) - began)
                time.sleep(1.0)  # idle again
        finally:
            book.close()
            worker.terminate()
            worker.wait(60)
    return latencies


def payroll(tmp: Path) -> dict[str, Any]:
    out = tmp / f"payroll-{uuid.uuid4().hex}"
    run = subprocess.run([sys.executable, "-m", "workledger.cli", "--db",
                          f"sqlite:///{out}.db", "demo", "payroll", "--out", str(out),
                          "--json"], capture_output=True, text=True, env=env(), timeout=1800,
                         check=True)
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def line(name: str, value: float, values: list[float], unit: str, note: str = "") -> None:
    shown = " ".join(f"{v:,.3g}" for v in values)
    print(f"{name:<46} {value:>10,.3g} {unit:<8} [{shown}]  {note}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--repeat", type=int, default=3)
    # enough items that starting the processes (the worker's, and its children importing the
    # app: about 0.6 s) weighs on neither side more than it does in a real run
    p.add_argument("--cpu-items", type=int, default=10000)
    p.add_argument("--send-items", type=int, default=2000)
    p.add_argument("--skip", nargs="*", default=[], choices=["cpu", "first", "batch", "payroll"])
    a = p.parse_args(argv)
    backends = ["sqlite", "postgres"] if a.backend == "both" else [a.backend]
    print(f"execution benchmarks: {os.cpu_count()} CPUs, median of {a.repeat} [samples]")
    with tempfile.TemporaryDirectory(prefix="wl_exec_") as folder:
        tmp = Path(folder)
        if "cpu" not in a.skip:
            n = a.cpu_items
            # one sample of each in turn, repeated: a machine that speeds up or slows down
            # meanwhile weighs on every figure alike
            samples: dict[int, list[float]] = {1: [], 2: [], 4: [], 0: []}
            for _ in range(a.repeat):
                for procs in (1, 2, 4):
                    samples[procs].append(drain_rate("sqlite", tmp, "cpu", n, "--processes",
                                                     str(procs), "--concurrency", "2"))
                samples[0].append(pool_rate(n, 2))
            rates = {k: (statistics.median(v), v) for k, v in samples.items()}
            for procs in (1, 2, 4):
                line(f"cpu-bound, sqlite, --processes {procs}", *rates[procs], "items/s")
            pool = rates[0]
            line("cpu-bound, multiprocessing.Pool(2)", *pool, "items/s")
            print(f"  processes 2 / processes 1 = {rates[2][0] / rates[1][0]:.2f} (floor 1.6); "
                  f"processes 2 / Pool(2) = {rates[2][0] / pool[0]:.2f} (floor 0.8)")
        for backend in backends:
            if "first" not in a.skip:
                values = first_start(backend, tmp, max(5, a.repeat))
                line(f"submit to first start, idle worker, {backend}",
                     statistics.median(values) * 1000, [v * 1000 for v in values], "ms",
                     "(floor: under 100 ms on PostgreSQL)" if backend == "postgres" else "")
            if "batch" not in a.skip:
                n = a.send_items
                for job in ("single", "batched"):
                    rate = median(lambda job=job, backend=backend, n=n: drain_rate(  # type: ignore[misc]
                        backend, tmp, job, n, "--concurrency", "4"), a.repeat)
                    line(f"not idempotent, {job}, {backend}", *rate, "items/s")
        if "payroll" not in a.skip:
            runs = [payroll(tmp) for _ in range(a.repeat)]
            ratios = [r["wall_s"] / r["render_limit_s"] for r in runs]
            walls = [r["wall_s"] for r in runs]
            line("payroll demo (2,000), wall time", statistics.median(walls), walls, "s")
            limits = [r["render_limit_s"] for r in runs]
            line("payroll demo, render limit (1 process, no I/O)", statistics.median(limits),
                 limits, "s")
            line("payroll demo, wall / render limit", statistics.median(ratios), ratios, "x",
                 "(floor 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
