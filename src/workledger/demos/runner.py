"""``workledger demo events``: fan out N events, kill the worker part-way, finish with another.

Nothing the user has is deleted: the run is submitted with the key ``events-demo-N`` (a second
invocation finds it and finishes whatever is left), and effects go to a sink file of the demo's
own. Workers are real subprocesses (``python -m workledger.cli ... worker``); the first one is
``SIGKILL``ed once K effects exist, so the ledger is left with the stranded middle: items
processed, items claimed by a dead worker, items never started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from workledger.api import Ledger, RunStatus
from workledger.demos import events as app
from workledger.errors import AppError
from workledger.progress import watch_run

APP = "workledger.demos.events:ledger"
STARTUP_DEADLINE = 120.0  # seconds a worker may take to reach the kill point


@dataclass(frozen=True)
class DemoOptions:
    url: str
    events: int
    kill_after: int
    lease: float = 2.0
    concurrency: int = 4
    chunk: int = 64  # not a divisor of the default kill point, so the kill lands mid-chunk


def run_events_demo(opts: DemoOptions, console: Console) -> bool:
    """Run the demo; return True when the final checks hold (nothing lost, nothing twice)."""
    ledger = app.ledger
    ledger.use(opts.url)
    sink = app.sink_for(opts.url)
    console.print(f"ledger  {ledger.where}\nsink    {sink.path} (the downstream system)",
                  markup=False)
    payload = {"events": app.make_events(opts.events)}
    sub = ledger.submit(app.JOB, payload, key=f"events-demo-{opts.events}")
    run_id = sub.run_id
    if sub.created:
        if sink.counts(run_id).executions:
            raise AppError(f"the demo sink {sink.path} already holds effects for a run {run_id} "
                           "of another ledger; move it away or set WORKLEDGER_DEMO_SINK")
        _say_submitted(console, sub.status)
        _kill_part_way(opts, ledger, run_id, console)
    else:
        console.print(f"run {run_id} exists already (created=False): {_summary(sub.status)}",
                      markup=False)
        if not sub.status.complete:
            _say_where(ledger, run_id, console)
    if not ledger.status(run_id).complete:
        _finish(opts, ledger, run_id, console)
    return _report(opts, ledger, run_id, console)


def _summary(st: RunStatus) -> str:
    return (f"{st.state}, {st.processed} processed, {st.failed} failed, {st.skipped} skipped "
            f"of {st.total}")


def _say_submitted(console: Console, st: RunStatus) -> None:
    console.print(f"run {st.run_id}: {st.total} events written as ledger rows before any work\n"
                  f"       ({st.skipped} skipped at decomposition: invalid timestamp)",
                  markup=False)


# -- workers as subprocesses -------------------------------------------------------------------


def _start_worker(opts: DemoOptions, err: IO[bytes]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "workledger.cli", "--db", opts.url, "--app", APP, "worker",
           "--until-idle", "--json", "--lease", str(opts.lease),
           "--concurrency", str(opts.concurrency), "--chunk", str(opts.chunk)]
    env = {**os.environ, "WORKLEDGER_DEMO_SINK": str(app.sink_for(opts.url).path)}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _last_line(err: IO[bytes]) -> str:
    err.seek(0)
    lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _kill_part_way(opts: DemoOptions, ledger: Ledger, run_id: int, console: Console) -> None:
    sink = app.sink_for(opts.url)
    target = min(opts.kill_after, max(1, ledger.status(run_id).total))
    with tempfile.TemporaryFile() as err:
        proc = _start_worker(opts, err)
        console.print(f"worker 1 (pid {proc.pid}) started; SIGKILL once {target} effects exist",
                      markup=False)
        try:
            deadline = time.monotonic() + STARTUP_DEADLINE
            while sink.effects(run_id) < target and proc.poll() is None:
                if time.monotonic() > deadline:
                    raise AppError(f"worker 1 made no progress in {STARTUP_DEADLINE:g}s")
                time.sleep(0.005)
            if proc.poll() is not None:
                if proc.returncode != 0:
                    raise AppError(f"worker 1 failed (exit {proc.returncode}): {_last_line(err)}")
                console.print("worker 1 finished before the kill point: nothing to resume")
                return
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        finally:
            _stop(proc)
    _say_stranded(ledger, run_id, sink.counts(run_id).effects, console)


def _say_stranded(ledger: Ledger, run_id: int, effects: int, console: Console) -> None:
    console.print(f"\nworker 1 killed after {effects} effects.", markup=False)
    processed = _say_where(ledger, run_id, console)
    console.print(f"  {max(0, effects - processed)} effects applied but not yet recorded: worker 2"
                  " re-runs\n  those items, and their idempotency key keeps each effect single",
                  markup=False)


def _say_where(ledger: Ledger, run_id: int, console: Console) -> int:
    st = ledger.status(run_id)
    c = st.counts.get("apply", {})
    console.print(f"The ledger now says (run {run_id}, {st.state}):\n"
                  f"  processed {c.get('processed', 0)} · claimed {c.get('claimed', 0)} · pending "
                  f"{c.get('pending', 0)} · skipped {c.get('skipped', 0)} · failed "
                  f"{c.get('failed', 0)}", markup=False)
    return st.processed


def _finish(opts: DemoOptions, ledger: Ledger, run_id: int, console: Console) -> None:
    console.print(f"\nworker 2 starts: it waits for leases of dead workers ({opts.lease:g}s) to"
                  "\nexpire, reclaims those items and finishes the rest", markup=False)
    with tempfile.TemporaryFile() as err:
        proc = _start_worker(opts, err)
        try:
            watch_run(ledger, run_id, console, stop=lambda: proc.poll() is not None)
            out, _ = proc.communicate()
        finally:
            _stop(proc)
        if proc.returncode != 0:
            raise AppError(f"worker 2 failed (exit {proc.returncode}): {_last_line(err)}")
    report = json.loads(out)
    console.print(f"worker 2 (pid {proc.pid}): reclaimed {report['reclaimed']} expired leases,"
                  f" processed {report['processed']}, failed {report['failed']}", markup=False)


# -- the final count ---------------------------------------------------------------------------


def _reasons(ledger: Ledger, run_id: int, state: str) -> Counter[str]:
    reasons: Counter[str] = Counter()
    after = 0
    while rows := ledger.items(run_id, state=state, limit=1000, after_id=after):
        reasons.update(r.error or "no reason" for r in rows)
        after = rows[-1].id
    return reasons


def _with_reasons(n: int, reasons: Counter[str]) -> str:
    if not reasons:
        return str(n)
    return f"{n} (" + ", ".join(f"{why}: {k}" for why, k in reasons.most_common()) + ")"


def _report(opts: DemoOptions, ledger: Ledger, run_id: int, console: Console) -> bool:
    st = ledger.status(run_id)
    sink = app.sink_for(opts.url).counts(run_id)
    rows: list[tuple[str, Any]] = [
        ("events", opts.events),
        ("processed", st.processed),
        ("skipped", _with_reasons(st.skipped, _reasons(ledger, run_id, "skipped"))),
        ("failed", _with_reasons(st.failed, _reasons(ledger, run_id, "failed"))),
        ("handler executions", sink.executions),
        ("re-executions deduplicated", sink.repeats),
        ("distinct effects", sink.effects),
        ("effects applied twice", sink.applied_twice),
    ]
    table = Table("run " + str(run_id), st.state, title="\nwhat the ledger and the sink say")
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
    accounted = st.processed + st.skipped + st.failed == opts.events == st.total
    ok = st.complete and accounted and sink.effects == st.processed and sink.applied_twice == 0
    if ok:
        console.print(f"nothing done twice: {sink.effects} effects for {st.processed} processed "
                      "items", markup=False)
    else:
        console.print(f"CHECK FAILED: complete={st.complete}, every event accounted={accounted}, "
                      f"{sink.effects} effects for {st.processed} processed items, "
                      f"{sink.applied_twice} applied twice", markup=False)
    console.print(f"look closer: workledger status {run_id} · workledger items {run_id} "
                  "--state skipped", markup=False)
    return ok
