"""HTTP load: concurrent API clients against ``workledger serve`` over a ledger holding a run of
1,000,000 items. Reports requests, p50, p99 and errors per route; asserts nothing.

Per backend it builds the ledger (SQLite file, or a fresh PostgreSQL database), submits one
run of ``--items`` items (one in 5,000 skipped at decomposition, one in 1,000 failing), lets a
worker process ``--processed`` of them, starts ``workledger serve`` on a free loopback port,
and runs ``--clients`` concurrent clients for ``--seconds``. Each client loops over the routes
(``--pace 0``, the default: no think time, a closed loop, the harshest reading of "50
concurrent clients"; ``--pace 2`` sends one request per client every 2 seconds, like a
dashboard polling). Clients and server share this machine's cores.

    .venv/bin/python benchmarks/http_load.py                     # 1,000,000 items, both backends
    .venv/bin/python benchmarks/http_load.py --items 20000 --seconds 5 --backend sqlite   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from workledger import Item, Ledger, Permanent, Skip

ROUTES = {  # name: (path with {run}, headers)
    "api run status": ("/api/runs/{run}", {}),
    "run page": ("/runs/{run}", {}),
    "run page, live part": ("/runs/{run}", {"HX-Request": "true"}),
    "metrics": ("/metrics", {}),
    "api runs list": ("/api/runs?limit=20", {}),
    "api failed items": ("/api/runs/{run}/items?state=failed&limit=50", {}),
    "skips by reason": ("/runs/{run}/skips", {}),
}


def build_ledger(url: str, items: int, processed: int) -> int:
    """The run, with ``processed`` of its items worked (``items`` in total)."""
    ledger = Ledger(url)
    job = ledger.job("load", batch_size=20_000)

    @job.decompose
    def split(payload: dict[str, Any]) -> Iterator[Item | Skip]:
        for i in range(payload["n"]):
            if i % 5000 == 4999:
                yield Skip(key=f"k{i}", reason="no address")
            else:
                yield Item(key=f"k{i}")

    @job.stage("work", idempotent=True)
    def work(item: Any, ctx: Any) -> None:
        if item.seq % 1000 == 999:
            raise Permanent("refused by the remote side")

    started = time.monotonic()
    run_id = ledger.submit("load", {"n": items}, key=f"load-{items}").run_id
    print(f"  decomposed {items:,} items in {time.monotonic() - started:.1f} s", flush=True)
    started = time.monotonic()
    worker = ledger.worker(concurrency=4, chunk=500,
                           on_progress=lambda r: worker.stop() if r.claimed >= processed
                           else None)
    worker.run()
    st = ledger.status(run_id)
    print(f"  worked {st.processed + st.failed:,} items in {time.monotonic() - started:.1f} s:"
          f" {st.state}, {st.counts}", flush=True)
    ledger.close()
    return run_id


@contextmanager
def database(backend: str, args: argparse.Namespace) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(dir=args.tmpdir) as folder:
            yield f"sqlite:///{folder}/load.db"
        return
    import psycopg

    name = f"wl_http_load_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield args.pg_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(args.pg_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def settle(url: str) -> None:
    """VACUUM ANALYZE, as autovacuum does within a minute or so of a bulk load. Without it the
    planner still believes the tables empty and walks the run for some reads (see
    benchmarks/README.md, "HTTP load (http_load.py)")."""
    import psycopg

    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    print(f"  VACUUM ANALYZE in {time.monotonic() - started:.1f} s", flush=True)


@contextmanager
def server(url: str) -> Iterator[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKLEDGER_")}
    proc = subprocess.Popen([sys.executable, "-m", "workledger.cli", "--db", url, "serve",
                             "--port", "0", "--no-token"], env=env, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().split()[2]
        yield address.rstrip("/")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


class Connection:
    """A keep-alive HTTP/1.1 connection that sends GETs and reads Content-Length bodies: a
    load generator in Python must cost the server's cores as little as it can (httpx's async
    client spends several times what the server does per request)."""

    def __init__(self, base: str) -> None:
        hostport = base.split("://", 1)[1]
        self.host, _, port = hostport.partition(":")
        self.port = int(port)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str, headers: dict[str, str]) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                          f"{extra}\r\n".encode())
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        status = int(head.split(" ", 2)[1])
        length = next(int(line.split(":", 1)[1]) for line in head.split("\r\n")
                      if line.lower().startswith("content-length:"))
        await self.reader.readexactly(length)
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def client(base: str, run_id: int, until: list[float], offset: int, pace: float,
                 ready: asyncio.Barrier, seen: dict[str, list[float]],
                 errors: dict[str, int]) -> None:
    names = list(ROUTES)
    conn = Connection(base)
    try:
        await conn.get("/healthz", {})  # its connection, made before the clock starts
        if await ready.wait() == 0:
            until[0] = time.monotonic() + until[0]
        await ready.wait()
        if pace:  # dashboards are not in step: spread the clients' first requests
            await asyncio.sleep(pace * offset / CLIENTS_SPREAD[0])
        i = offset
        while time.monotonic() < until[0]:
            name = names[i % len(names)]
            path, headers = ROUTES[name]
            started = time.perf_counter()
            try:
                ok = await conn.get(path.format(run=run_id), headers) == 200
            except (OSError, asyncio.IncompleteReadError, ValueError, StopIteration):
                ok = False
                await conn.close()
                conn = Connection(base)
            seen[name].append(time.perf_counter() - started)
            if not ok:
                errors[name] += 1
            i += 1
            if pace:  # one request per `pace` seconds per client, like a polling dashboard
                await asyncio.sleep(max(0.0, pace - (time.perf_counter() - started)))
    finally:
        await conn.close()


CLIENTS_SPREAD = [1]  # how many clients the paced ones are spread over


def warm(base: str, run_id: int) -> None:
    """One request per route before measuring: connections, plans and the skips' first walk
    (kept by the facade afterwards) are not part of the steady state."""
    with httpx.Client(base_url=base, timeout=120) as http:
        for path, headers in ROUTES.values():
            http.get(path.format(run=run_id), headers=headers).raise_for_status()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def load(base: str, run_id: int, clients: int, seconds: float,
         pace: float) -> dict[str, dict[str, Any]]:
    CLIENTS_SPREAD[0] = clients
    warm(base, run_id)
    seen: dict[str, list[float]] = {name: [] for name in ROUTES}
    errors = dict.fromkeys(ROUTES, 0)
    until = [seconds]  # the first client past the barrier turns it into a deadline

    async def everyone() -> None:
        ready = asyncio.Barrier(clients)
        await asyncio.gather(*(client(base, run_id, until, n, pace, ready, seen, errors)
                               for n in range(clients)))

    asyncio.run(everyone())
    return {name: {"requests": len(v), "p50_ms": 1000 * percentile(v, 50),
                   "p99_ms": 1000 * percentile(v, 99), "max_ms": 1000 * max(v),
                   "errors": errors[name]} for name, v in seen.items() if v}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--processed", type=int, default=None,
                        help="items a worker processes first (default: a third)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--pace", type=float, nargs="+", default=[0.0],
                        help="seconds between one client's requests; 0: a closed loop (each "
                             "client sends its next request as soon as it has an answer); "
                             "several values run one after the other")
    parser.add_argument("--pg-url", default=os.environ.get(
        "WORKLEDGER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--tmpdir", default=None, help="where the SQLite file goes")
    parser.add_argument("--no-analyze", action="store_true",
                        help="PostgreSQL: serve right after the bulk load, before any VACUUM "
                             "ANALYZE (statistics still say the tables are empty)")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    processed = args.processed if args.processed is not None else args.items // 3
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    results: dict[str, Any] = {}
    for backend in backends:
        print(f"{backend}: building a run of {args.items:,} items", flush=True)
        with database(backend, args) as url:
            run_id = build_ledger(url, args.items, processed)
            if backend == "postgres" and not args.no_analyze:
                settle(url)
            with server(url) as base:
                for pace in args.pace:
                    mode = "closed loop" if not pace else f"one request per {pace:g} s each"
                    print(f"  {args.clients} clients, {mode}, for {args.seconds:g} s "
                          f"against {base}", flush=True)
                    results[f"{backend} {mode}"] = load(base, run_id, args.clients,
                                                        args.seconds, pace)
    print(f"\nworkledger serve under load: {args.clients} clients, {args.seconds:g} s, "
          f"a run of {args.items:,} items\n")
    for mode, routes in results.items():
        total = sum(r["requests"] for r in routes.values())
        print(f"{mode}: {total / args.seconds:,.0f} requests/s")
        print(f"  {'route':<22} {'requests':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
              f"{'errors':>7}")
        for name, r in routes.items():
            print(f"  {name:<22} {r['requests']:>9,} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
                  f"{r['max_ms']:>8.1f} {r['errors']:>7}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"args": vars(args), "results": results},
                                                   indent=2))


if __name__ == "__main__":
    main()
