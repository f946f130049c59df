"""The systems a cell measures, and the registry of the kinds of cell.

workledger runs through its public API (``Ledger``, ``Item``, ``job.submit``, ``ledger.work``,
``status``, ``reconcile``, the ``workledger`` CLI), with one exception: in every drain the
worker's store is instrumented (``_instrument`` wraps its ``items_claim`` and
``items_finish_if_leased`` methods on the instance, in the child) to time each claim and
finish. The raw-SQL loop lives in ``backends.py``, the peers in ``peers.py``.

A kind of cell is a ``(load, verify)`` pair in ``LOADERS`` and a ``(prepare, drain)`` pair in
``DRAINS``, keyed as in ``KINDS``:

* ``load(url, N) -> (seconds, run_id, extra)``: decompose, insert or enqueue N items, timed;
* ``prepare(url, chunk)`` in a spawned worker process before the start event (connect), then
  ``drain(url, chunk, state) -> (items, last commit, detail)`` after it;
* ``verify(url, run_id, N)`` after the drain: raise unless all N items are done.

workledger is imported lazily, inside the functions: bench.py takes its snapshot of the source
before the first import.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import backends
import peers

JOB = "bench-noop"
JOB2 = "bench-2stage"  # stages "a" then "b", both no-op and idempotent
JOB_PLAIN = "bench-plain"  # one no-op stage that is not idempotent: each start and outcome
# is written as soon as it happens (what a stage with real effects costs in ledger writes)


# =============================================================================================
# workledger through its public API
# =============================================================================================


def split(payload: dict[str, Any]) -> Iterator[Any]:
    from workledger import Item

    for i in range(payload["n"]):
        yield Item(key=i)


def noop(item: Any, ctx: Any) -> None:
    return None


def define(url: str, two_stage: bool = False, plain: bool = False) -> Any:
    """A Ledger with the benchmark's job: one no-op stage, or stages "a" then "b", or (plain)
    one no-op stage that is not idempotent."""
    from workledger import Ledger

    ledger = Ledger(url)
    if plain:
        job = ledger.job(JOB_PLAIN)
        job.decompose(split)
        job.stage("plain")(noop)
    elif two_stage:
        job = ledger.job(JOB2)
        job.decompose(split)
        job.stage("a", idempotent=True)(noop)
        job.stage("b", after="a", idempotent=True)(noop)
    else:
        job = ledger.job(JOB)
        job.decompose(split)
        job.stage("noop", idempotent=True)(noop)
    return ledger


def wl_decompose(url: str, items: int, two_stage: bool = False, plain: bool = False
                 ) -> tuple[float, int, dict[str, Any]]:
    ledger = define(url, two_stage, plain)
    try:
        ledger.store  # noqa: B018 - open and migrate outside the timed section
        t = time.perf_counter()
        job = JOB_PLAIN if plain else JOB2 if two_stage else JOB
        sub = ledger.job(job).submit({"n": items}, key="bench")
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


def wl_prepare(url: str, chunk: int, two_stage: bool = False, plain: bool = False) -> Any:
    ledger = define(url, two_stage, plain)
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


def wl_verify(url: str, run_id: int, items: int, two_stage: bool = False,
              plain: bool = False) -> None:
    ledger = define(url, two_stage, plain)
    try:
        st = ledger.status(run_id)
        if not (st.complete and st.processed == items):
            raise RuntimeError(f"workledger run not complete after the drain: {st}")
    finally:
        ledger.close()


wl2_decompose = functools.partial(wl_decompose, two_stage=True)
wl2_prepare = functools.partial(wl_prepare, two_stage=True)
wl2_verify = functools.partial(wl_verify, two_stage=True)
wlp_decompose = functools.partial(wl_decompose, plain=True)
wlp_prepare = functools.partial(wl_prepare, plain=True)
wlp_verify = functools.partial(wl_verify, plain=True)


# =============================================================================================
# After a drain (scale mode): reconcile, and the CLI's status as a subprocess
# =============================================================================================


def wl_after(url: str, run_id: int) -> dict[str, Any]:
    """After a drain (scale mode): ``reconcile(run)`` time and ``workledger status`` run as a
    subprocess (its peak RSS, its own VmHWM, and its wall time; see ``cli_status``)."""
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
    this parent's size, see workers.peak_rss_kib)."""
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


# =============================================================================================
# The registry
# =============================================================================================

# The kinds of cell: DRAINS/LOADERS key -> (Sample.system, load phase, drain phase)
KINDS = {
    "workledger": ("workledger", "decompose", "drain"),
    "workledger-2stage": ("workledger", "decompose2", "drain2"),
    "workledger-plain": ("workledger", "decompose-plain", "drain-plain"),
    "raw": ("raw", "decompose", "drain"),
    "procrastinate": ("procrastinate", "enqueue", "drain"),
    "pgqueuer": ("pgqueuer", "enqueue", "drain"),
}

DrainFn = Callable[[str, int, Any], tuple[int, float, dict[str, Any]]]

# name -> (prepare in the child before the start event, drain after it)
DRAINS: dict[str, tuple[Callable[[str, int], Any], DrainFn]] = {
    "workledger": (wl_prepare, wl_drain),
    "workledger-2stage": (wl2_prepare, wl_drain),
    "workledger-plain": (wlp_prepare, wl_drain),
    "raw": (backends.raw_prepare, backends.raw_drain),
    **peers.DRAINS,
}

# name -> (decompose/insert/enqueue: (url, N) -> (seconds, run_id, extra), verify after drain)
LOADERS: dict[str, tuple[Callable[[str, int], tuple[float, int, dict[str, Any]]],
                         Callable[[str, int, int], None]]] = {
    "workledger": (wl_decompose, wl_verify),
    "workledger-2stage": (wl2_decompose, wl2_verify),
    "workledger-plain": (wlp_decompose, wlp_verify),
    "raw": (backends.raw_insert, backends.raw_verify),
    **peers.LOADERS,
}
