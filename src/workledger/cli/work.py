"""Commands that record and move work: init, submit, worker."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import click

from workledger.api import (
    RunStatus,
    Worker,
    WorkReport,
    limits,
    parse_deadline,
    parse_priority,
    url_secrets,
)
from workledger.cli import logs
from workledger.cli.output import Seconds, echo_json, one_line, show
from workledger.cli.settings import Settings
from workledger.errors import (
    BadInput,
    DecompositionFailed,
    UnknownJob,
    UsageError,
    WorkerStuck,
)
from workledger.shapes import submission_dict


@click.command()
@click.pass_obj
def init(settings: Settings) -> None:
    """Create or upgrade the ledger schema (safe to repeat). Runs no code of --app."""
    ledger = settings.ledger(create=True)
    applied = ledger.init()
    where = show(ledger.where)
    if applied:
        click.echo(f"{where}: applied migration{'s' if len(applied) > 1 else ''} "
                   + ", ".join(str(v) for v in applied))
    else:
        click.echo(f"{where}: up to date")


# -- submit ------------------------------------------------------------------------------------


def read_payload(payload: str | None, payload_file: str | None) -> dict[str, Any]:
    if payload is not None and payload_file is not None:
        raise BadInput("give --payload or --payload-file, not both")
    if payload_file is not None:
        try:
            text = sys.stdin.read() if payload_file == "-" else Path(payload_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"cannot read payload file {payload_file}: {exc}") from exc
    else:
        text = "{}" if payload is None else payload
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"payload is not JSON: {exc}") from exc
    except RecursionError as exc:
        raise BadInput(f"payload is nested deeper than {limits.DEPTH} levels") from exc
    except ValueError as exc:  # an integer of more digits than Python converts
        raise BadInput(f"payload cannot be read: {str(exc).split(';')[0]}") from exc
    if not isinstance(value, dict):
        raise BadInput(f"payload must be a JSON object, not a {type(value).__name__}")
    return value


MANY_FIELDS = frozenset({"payload", "key"})


def read_many(path: str) -> list[tuple[dict[str, Any], str | None]]:
    """``submit --many``: one run per line, ``{"payload": {...}, "key": "..."}`` (key optional;
    blank lines are nothing), every line checked before anything is submitted."""
    runs: list[tuple[dict[str, Any], str | None]] = []
    try:
        with (nullcontext(sys.stdin) if path == "-" else open(path, encoding="utf-8")) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    runs.append(_many_line(line, n))
                if len(runs) > limits.LIST_MAX:
                    raise BadInput(f"{path}: more than {limits.LIST_MAX:,} runs; submit them "
                                   "in several files")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read {path}: {exc}") from exc
    return runs


def _many_line(line: str, n: int) -> tuple[dict[str, Any], str | None]:
    try:
        value = json.loads(line)
    except RecursionError as exc:
        raise BadInput(f"line {n}: nested deeper than {limits.DEPTH} levels") from exc
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise BadInput(f"line {n}: not JSON: {str(exc).split(';')[0]}") from exc
    if not isinstance(value, dict) or not isinstance(value.get("payload"), dict):
        raise BadInput(f'line {n}: expected {{"payload": {{...}}, "key": "..."}}')
    if extra := sorted(set(value) - MANY_FIELDS):
        raise BadInput(f"line {n}: unknown field {show(extra[0])} (payload and key only)")
    key = value.get("key")
    if key is not None and not isinstance(key, str):
        raise BadInput(f"line {n}: key must be a string")
    return value["payload"], key


def submission_line(created: bool, st: RunStatus, resumed: bool = False) -> str:
    done = f"{st.processed} processed, {st.failed} failed, {st.skipped} skipped of {st.total}"
    error = f"; error: {one_line(st.error)}" if st.error else ""
    if created:
        return (f"run {st.run_id} created (key {show(st.key)}): {st.state}, {done}; "
                f"next: {st.next}{error}")
    if resumed:
        return (f"run {st.run_id} already exists for key {show(st.key)}; its decomposition, "
                f"cut short, was carried on: {st.state}, {done}; next: {st.next}{error}")
    return (f"run {st.run_id} already exists for key {show(st.key)} (nothing new written): "
            f"{st.state}, {done}; next: {st.next}{error}")


@click.command()
@click.argument("job")
@click.option("--payload", metavar="JSON", help="The run's payload, a JSON object. [default {}]")
@click.option("--payload-file", metavar="PATH", help="Read the payload from a file ('-': stdin).")
@click.option("--key", help="Idempotency key: the same key returns the same run. "
                            "[default: a hash of the payload]")
@click.option("--deadline", metavar="WHEN",
              help="When the run should be complete: a duration after submission (2h, 90m) "
                   "or an ISO 8601 time with its zone; past it, audit reports it (exit 1). "
                   "[default: the job's deadline]")
@click.option("--priority", metavar="N",
              help="A whole number from -1000 to 1000: a claimable item of a higher-priority "
                   "run is claimed before any of a lower one. [default 0]")
@click.option("--tenant", metavar="NAME",
              help="The customer the run is for: among runs of one priority, claims rotate "
                   "across tenants by their weights (workledger tenant NAME --weight N). "
                   "[default: the default tenant]")
@click.option("--many", metavar="PATH",
              help="Record many runs at once, one per line of a JSON-lines file ('-': stdin): "
                   '{"payload": {...}, "key": "..."}; in one transaction, all or nothing.')
@click.option("--json", "as_json", is_flag=True, help="Print the submission as JSON.")
@click.pass_obj
def submit(settings: Settings, job: str, payload: str | None, payload_file: str | None,
           key: str | None, deadline: str | None, priority: str | None, tenant: str | None,
           many: str | None, as_json: bool) -> None:
    """Record a run of JOB, write one item per unit, and print its real state. Needs --app
    (it runs the job's decomposer); creates the ledger if there is none.

    Submitting again with the same key returns the existing run (created: false) with its
    real state; the same key with a different payload is refused and nothing is written.
    Run ids increase and are never given twice, but they need not be consecutive (on
    PostgreSQL a repeated, refused or rolled-back submission uses one up): poll the id this
    prints, never the next number.
    Limits: the key 1,000 bytes, the payload 16 MiB of JSON nested at most 64 levels.

    With --many FILE, every line is a run of its own, each answered as a submit of it would
    be; a bad line, a failing decomposer or a reused key writes no run of the file.
    """
    if many is not None:
        if payload is not None or payload_file is not None or key is not None or deadline:
            raise BadInput("--many takes the payloads and keys from its file: give no "
                           "--payload, --payload-file, --key or --deadline with it")
        _submit_many(settings, job, read_many(many), parse_priority(priority), tenant, as_json)
        return
    value = read_payload(payload, payload_file)
    rank = parse_priority(priority)
    ledger = settings.ledger(app=True, create=True)
    if not ledger.jobs:
        raise UnknownJob(f"unknown job {job!r}: no app loaded "
                         "(pass --app module:attribute or set WORKLEDGER_APP)")
    try:
        sub = ledger.submit(job, value, key=key, deadline=parse_deadline(deadline),
                            priority=rank, tenant=tenant)
    except DecompositionFailed as exc:
        if as_json and exc.status is not None:
            echo_json(submission_dict(exc.run_id, True, exc.status))
        raise DecompositionFailed(f"run {exc.run_id} stays accepted with nothing dispatched: "
                                  f"{exc}", exc.run_id, exc.status) from exc
    if as_json:
        echo_json(submission_dict(sub.run_id, sub.created, sub.status))
    else:
        click.echo(submission_line(sub.created, sub.status, sub.resumed))


def _submit_many(settings: Settings, job: str, runs: list[tuple[dict[str, Any], str | None]],
                 rank: int, tenant: str | None, as_json: bool) -> None:
    ledger = settings.ledger(app=True, create=True)
    if not ledger.jobs:
        raise UnknownJob(f"unknown job {job!r}: no app loaded "
                         "(pass --app module:attribute or set WORKLEDGER_APP)")
    subs = ledger.submit_many(job, runs, priority=rank, tenant=tenant)
    if as_json:
        echo_json([submission_dict(s.run_id, s.created, s.status) for s in subs])
        return
    made = sum(s.created for s in subs)
    click.echo(f"{len(subs)} runs: {made} recorded, {len(subs) - made} already there")


# -- worker ------------------------------------------------------------------------------------


@contextmanager
def stop_on_signals(worker: Worker) -> Iterator[list[int]]:
    """First SIGTERM/SIGINT: stop cleanly. A second one: exit at once."""
    received: list[int] = []

    def handle(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if received:
            os.write(2, f"{name} again: exiting now; held items return when their leases "
                        "expire\n".encode())
            os._exit(128 + signum)
        received.append(signum)
        os.write(2, f"{name}: stopping; running handlers finish, unstarted items are released "
                    "(signal again to exit at once)\n".encode())
        worker.stop()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def report_line(report: WorkReport, how: str) -> str:
    return (f"worker {how}: claimed {report.claimed}, processed {report.processed}, "
            f"failed {report.failed}, skipped {report.skipped}, retried {report.retried}, "
            f"stale {report.stale} (released {report.released}, reclaimed {report.reclaimed})")


@click.command()
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True,
              help="Handlers that run at once: threads, or coroutines for async stages (a "
                   "job with async stages claims at least this many items).")
@click.option("--processes", type=click.IntRange(1, limits.PROCESSES_MAX), default=1,
              show_default=True,
              help="Run handlers in this many child processes, each importing --app (for "
                   "CPU-bound stages; 1: the worker's own threads only).")
@click.option("--chunk", type=click.IntRange(1, limits.CHUNK_MAX), default=100,
              show_default=True, help="Items claimed per claim.")
@click.option("--lease", type=Seconds(limits.LEASE_MAX), default=30.0, show_default=True,
              help="Lease in seconds (at most a day), renewed while handlers run.")
@click.option("--until-idle", is_flag=True,
              help="Exit once nothing is claimable and nothing will be without a person.")
@click.option("--job", "jobs", multiple=True, metavar="NAME",
              help="Work only on this job (repeatable). [default: every job of the app]")
@click.option("--timeout", type=Seconds(limits.LEASE_MAX), default=None,
              help="A handler's time limit in seconds, for stages that declare none "
                   "(@job.stage(timeout=)). [default: none]")
@click.option("--db-retry-for", type=Seconds(7 * 86_400, zero=True), default=600.0,
              show_default=True,
              help="Seconds of continuous database outage to wait out before giving up "
                   "(exit 1).")
@logs.FORMAT_OPTION
@logs.LEVEL_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
@click.pass_obj
def worker(settings: Settings, concurrency: int, processes: int, chunk: int, lease: float,
           until_idle: bool,
           jobs: tuple[str, ...], timeout: float | None, db_retry_for: float, log_format: str,
           log_level: str, as_json: bool) -> None:
    """Claim items in chunks under leases, run their handlers, record outcomes. Needs --app
    (it runs the handlers); creates the ledger if there is none, and waits for work.

    It waits out a database outage (dropped connections, a restart) for up to --db-retry-for
    seconds, logging it once when it starts and once when it ends. A handler past its time
    limit is abandoned and its item settled by its stage's declaration (in a child process,
    with --processes, the process is killed and replaced); with more stuck
    handlers than --concurrency it exits 3 so that a supervisor restarts it (an async handler
    is cancelled at its limit; async handlers run on an event loop of the worker, however
    many --processes). It logs its
    lifecycle to stderr (start, a summary every 30 s, outages, timeouts, stale results, stop;
    nothing per item at info). SIGTERM or SIGINT stops it cleanly: running handlers finish,
    unstarted items are released (a second signal exits at once). Prints a one-line summary
    at the end.
    """
    logs.configure(log_format, log_level, url_secrets(settings.url))
    ledger = settings.ledger(app=True, create=True)
    if not ledger.jobs:
        raise UsageError("no jobs to work on: pass --app module:attribute or set WORKLEDGER_APP")
    w = ledger.worker(concurrency=concurrency, until_idle=until_idle, chunk=chunk, lease=lease,
                      jobs=list(jobs) or None, timeout=timeout, db_retry_for=db_retry_for,
                      processes=processes)
    with stop_on_signals(w) as received:
        report = w.run()
    how = (f"stopped by {signal.Signals(received[0]).name}" if received else
           "stuck handlers, exiting 3" if report.stuck else "idle, done")
    if as_json:
        echo_json({"worker_id": w.worker_id, "stopped_by": how, **asdict(report)})
    else:
        click.echo(report_line(report, how))
    if report.stuck:
        raise WorkerStuck(f"worker {w.worker_id}: more handlers stuck past their time limit "
                          f"than its --concurrency of {concurrency}; restart it")


COMMANDS = (init, submit, worker)
