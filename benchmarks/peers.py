"""Peers for bench.py: procrastinate and pgqueuer draining N no-op jobs on the same PostgreSQL.

Both are OPTIONAL benchmark dependencies (``benchmarks/requirements.txt``), never runtime
dependencies of workledger. Each is used through its documented API only:

* procrastinate: ``App(connector=PsycopgConnector(...))``, schema by
  ``app.schema_manager.apply_schema_async()`` (what ``procrastinate schema --apply`` runs),
  jobs by ``task.batch_defer_async(*kwargs)`` (the batch-defer API), drained by
  ``app.run_worker_async(concurrency=K, wait=False)`` (``wait=False``: stop once caught up).
  The task is ``async`` so that ``concurrency`` applies; the pool holds K + 2 connections.
* pgqueuer: ``Queries(driver).install()`` (what ``pgq install`` runs), jobs by
  ``Queries.enqueue([...], [...], [...])`` with lists (its batch insert), drained by
  ``QueueManager.run(batch_size=B, mode=QueueExecutionMode.drain)``. The driver is
  ``AsyncpgDriver`` on one asyncpg connection when asyncpg is installed (pgqueuer's
  documented fastest driver, about 1.7x psycopg in its own benchmark, and the single
  connection its tuning guide recommends for a QueueManager), else ``PsycopgDriver``.

The functions below follow bench.py's shapes: ``*_load(url, n) -> (seconds, 0, extra)``
(schema untimed, enqueue timed), ``*_prepare(url, setting)`` in a spawned worker before the
start event (connects), ``*_drain(url, setting, state) -> (jobs, last, detail)`` after it,
``*_verify(url, run_id, n)``. ``last`` is the time of this process's last no-op handler call:
timing a peer's drain to it favours the peer (its last status write, and its worker's
shutdown, come later; ``detail["returned"]`` is when its worker returned). ``setting`` is
the batch size (pgqueuer) or the concurrency (procrastinate). Every import of a peer is lazy,
so bench.py runs without them.

How bench.py's options apply to the peers (which are installed, each one's setting and N,
the driver, the header lines) is here too, before the peers themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import sys
import time
from typing import Any

PEERS = ("procrastinate", "pgqueuer")
ENQUEUE_BATCH = 5000  # jobs per enqueue call, the same batch as workledger's decomposition
INSTALL_HINT = ".venv/bin/pip install -r benchmarks/requirements.txt"
PROC_TASK = "wl_bench_noop"  # explicit: the default name is module-based (__mp_main__ in children)
PROC_QUEUE = "wl_bench"
PGQ_ENTRYPOINT = "wl_bench_noop"

_handled = [0, 0.0]  # jobs run by the no-op handler in this process, time of the last one


def missing(name: str) -> str | None:
    """None when peer ``name`` can be imported, else one line saying how to install it."""
    try:
        importlib.import_module(name)
    except ImportError as exc:
        return f"{name}: not installed ({exc}); skipped. Install it with: {INSTALL_HINT}"
    return None


def version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(name)
    except PackageNotFoundError:
        return "?"


def pgq_driver_name() -> str:
    """``$WL_BENCH_PGQ_DRIVER`` (set by bench.py's --pgqueuer-driver; spawned workers inherit
    it), else asyncpg when installed, else psycopg."""
    chosen = os.environ.get("WL_BENCH_PGQ_DRIVER")
    if chosen in ("asyncpg", "psycopg"):
        return chosen
    try:
        importlib.import_module("asyncpg")
    except ImportError:
        return "psycopg"
    return "asyncpg"


def describe(name: str, setting: int) -> str:
    if name == "procrastinate":
        return (f"procrastinate {version(name)} (PsycopgConnector pool of {setting + 2}, "
                f"run_worker concurrency={setting}, wait=False, async no-op task, "
                f"batch_defer_async in batches of {ENQUEUE_BATCH:,})")
    driver = pgq_driver_name()
    return (f"pgqueuer {version(name)} ({driver} driver"
            f"{' ' + version('asyncpg') if driver == 'asyncpg' else ''}, QueueManager.run "
            f"batch_size={setting}, mode=drain, durability default; Queries.enqueue with lists "
            f"of {ENQUEUE_BATCH:,})")


def short(name: str, setting: int) -> str:
    if name == "procrastinate":
        return f"procrastinate c={setting}"
    return f"pgqueuer b={setting} {pgq_driver_name()}"


# =============================================================================================
# bench.py's options for the peers
# =============================================================================================


def drop_missing(systems: list[str]) -> list[str]:
    """Remove from ``systems`` every peer that cannot be imported; one line for each, also
    printed on stderr."""
    notes = []
    for peer in [s for s in systems if s in PEERS]:
        why = missing(peer)
        if why:
            print(why, file=sys.stderr)
            notes.append(why)
            systems.remove(peer)
    return notes


def use_driver(name: str | None) -> None:
    """--pgqueuer-driver: through the environment, which spawned workers inherit."""
    if name:
        os.environ["WL_BENCH_PGQ_DRIVER"] = name


def settings(args: argparse.Namespace) -> dict[str, int]:
    """Each peer's setting: procrastinate's concurrency, pgqueuer's batch size."""
    return {"procrastinate": args.procrastinate_concurrency, "pgqueuer": args.pgqueuer_batch}


def items(args: argparse.Namespace, name: str) -> int:
    """Jobs per cell of peer ``name``: --peer-items (procrastinate) or --pgqueuer-items,
    else --items."""
    n = args.peer_items if name == "procrastinate" else args.pgqueuer_items
    return n or args.items


def header_lines(args: argparse.Namespace, backends: list[Any]) -> list[str]:
    """One ``peer:`` line per peer measured (peers run on PostgreSQL only)."""
    if not any(b.name == "postgres" for b in backends):
        return []
    chosen = settings(args)
    return [f"peer: {describe(p, chosen[p])}" for p in PEERS if p in args.systems]


def _noop_seen() -> None:
    _handled[0] += 1
    _handled[1] = time.monotonic()


# =============================================================================================
# procrastinate
# =============================================================================================


def _proc_app(url: str, pool: int) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=url, min_size=pool, max_size=pool))

    @app.task(name=PROC_TASK, queue=PROC_QUEUE)
    async def noop() -> None:
        _noop_seen()

    return app


def procrastinate_load(url: str, n: int) -> tuple[float, int, dict[str, Any]]:
    async def go() -> float:
        app = _proc_app(url, 2)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            task = app.tasks[PROC_TASK]
            t = time.perf_counter()
            for start in range(0, n, ENQUEUE_BATCH):
                await task.batch_defer_async(*({} for _ in range(min(ENQUEUE_BATCH, n - start))))
            return time.perf_counter() - t

    return asyncio.run(go()), 0, {}


def procrastinate_prepare(url: str, concurrency: int) -> Any:
    _handled[:] = [0, 0.0]
    loop = asyncio.new_event_loop()
    app = _proc_app(url, concurrency + 2)
    loop.run_until_complete(app.open_async())
    return loop, app


def procrastinate_drain(url: str, concurrency: int, state: Any
                        ) -> tuple[int, float, dict[str, Any]]:
    loop, app = state
    try:
        loop.run_until_complete(app.run_worker_async(
            queues=[PROC_QUEUE], concurrency=concurrency, wait=False,
            install_signal_handlers=False))
        returned = time.monotonic()
        loop.run_until_complete(app.close_async())
    finally:
        loop.close()
    # The drain is timed to the last handler call, which favours the peer: its last status
    # write and the worker's shutdown come after it (the return time is kept as well).
    return _handled[0], _handled[1], {"returned": returned}


def procrastinate_verify(url: str, run_id: int, n: int) -> None:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = dict(conn.execute(
            "SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY 1").fetchall())
    if rows.get("succeeded", 0) != n or sum(rows.values()) != n:
        raise RuntimeError(f"procrastinate jobs after the drain: {rows}, expected {n} succeeded")


# =============================================================================================
# pgqueuer
# =============================================================================================


async def _pgq_connect(url: str) -> tuple[Any, Any]:
    """(connection, pgqueuer driver)."""
    if pgq_driver_name() == "asyncpg":
        import asyncpg
        from pgqueuer import AsyncpgDriver

        conn = await asyncpg.connect(url)
        return conn, AsyncpgDriver(conn)
    import psycopg
    from pgqueuer import PsycopgDriver

    aconn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return aconn, PsycopgDriver(aconn)


def pgqueuer_load(url: str, n: int) -> tuple[float, int, dict[str, Any]]:
    from pgqueuer import Queries

    async def go() -> float:
        conn, driver = await _pgq_connect(url)
        try:
            queries = Queries(driver)
            await queries.install()
            t = time.perf_counter()
            for start in range(0, n, ENQUEUE_BATCH):
                k = min(ENQUEUE_BATCH, n - start)
                await queries.enqueue([PGQ_ENTRYPOINT] * k, [None] * k, [0] * k)
            return time.perf_counter() - t
        finally:
            await conn.close()

    return asyncio.run(go()), 0, {"driver": pgq_driver_name()}


def pgqueuer_prepare(url: str, batch: int) -> Any:
    _handled[:] = [0, 0.0]
    from pgqueuer import Queries, QueueManager

    loop = asyncio.new_event_loop()
    conn, driver = loop.run_until_complete(_pgq_connect(url))
    qm = QueueManager(Queries(driver))

    @qm.entrypoint(PGQ_ENTRYPOINT)
    async def noop(job: Any) -> None:
        _noop_seen()

    return loop, conn, qm


def pgqueuer_drain(url: str, batch: int, state: Any) -> tuple[int, float, dict[str, Any]]:
    from pgqueuer.types import QueueExecutionMode

    loop, conn, qm = state
    try:
        loop.run_until_complete(qm.run(batch_size=batch, mode=QueueExecutionMode.drain))
        # run() returns after its status-log buffer is flushed: every job is recorded then.
        returned = time.monotonic()
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(conn.close())
        loop.close()
    # timed to the last handler call, as for procrastinate
    return _handled[0], _handled[1], {"returned": returned}


def pgqueuer_verify(url: str, run_id: int, n: int) -> None:
    import psycopg

    with psycopg.connect(url) as conn:
        left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
        done = conn.execute(
            "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'").fetchone()
    if (left and left[0]) or not done or done[0] != n:
        raise RuntimeError(f"pgqueuer after the drain: {left and left[0]} jobs left, "
                           f"{done and done[0]} logged successful, expected {n}")


DRAINS = {
    "procrastinate": (procrastinate_prepare, procrastinate_drain),
    "pgqueuer": (pgqueuer_prepare, pgqueuer_drain),
}
LOADERS = {
    "procrastinate": (procrastinate_load, procrastinate_verify),
    "pgqueuer": (pgqueuer_load, pgqueuer_verify),
}
