"""The ``workledger`` command line: a thin layer over :class:`workledger.Ledger`.

Every error is one line on stderr and a documented exit code (see ``workledger --help``);
no traceback unless ``WORKLEDGER_DEBUG=1``. The reference in ``docs/cli.md`` is generated
from this module by ``make docs`` (:func:`reference`) and checked by ``tests/test_docs.py``.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

from workledger.api import Ledger, RunStatus
from workledger.errors import (
    AppError,
    BadInput,
    DecompositionFailed,
    UnknownJob,
    UsageError,
    WorkledgerError,
)
from workledger.runtime.worker import Worker, WorkReport
from workledger.storage import DEFAULT_URL, display_url

ITEM_STATES = ("pending", "claimed", "unknown", "processed", "failed", "skipped")
EXIT_CODES = """\b
Exit codes:
  0  success
  1  operational failure: database unreachable, app failed to load or raised
  2  bad usage or bad input: unknown job or run, payload not a JSON object,
     unknown URL scheme, same key with a different payload
"""

# -- settings, app loading ------------------------------------------------------------------


@dataclass
class Settings:
    """What the top-level options say; the ledger is built on first use."""

    db: str | None
    app: str | None
    _ledger: Ledger | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.db or DEFAULT_URL

    def ledger(self) -> Ledger:
        if self._ledger is None:
            ledger = load_app(self.app) if self.app else Ledger(self.url)
            if self.db:
                ledger.use(self.db)
            self._ledger = ledger
        return self._ledger

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()


def load_app(spec: str) -> Ledger:
    """Import ``module:attribute`` and return the :class:`Ledger` it names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BadInput(f"cannot load app {spec!r}: expected module:attribute")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: apps in the current folder import
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise AppError(f"cannot load app {spec!r}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, Ledger):
        raise AppError(f"cannot load app {spec!r}: it is a {type(obj).__name__}, not a Ledger")
    return obj


# -- output helpers ---------------------------------------------------------------------------


def one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


STATUS_FIELDS = ("run_id", "job", "key", "state", "total", "complete", "counts", "processed",
                 "failed", "skipped", "next", "created_at", "decomposed_at", "completed_at",
                 "error")


def status_dict(st: RunStatus) -> dict[str, Any]:
    """The JSON shape of a run's status: a contract, so new RunStatus fields stay out of it."""
    values = st.to_dict()
    return {name: values[name] for name in STATUS_FIELDS}


def counts_line(counts: dict[str, int]) -> str:
    order = [s for s in ITEM_STATES if s in counts] + sorted(set(counts) - set(ITEM_STATES))
    return " · ".join(f"{state} {counts[state]}" for state in order)


def stage_order(ledger: Ledger, st: RunStatus) -> list[str]:
    job = ledger.jobs.get(st.job)
    known = [s.name for s in job.stages] if job else []
    return known + [s for s in st.counts if s not in known]


def print_status(ledger: Ledger, st: RunStatus) -> None:
    left = st.total - st.processed - st.failed - st.skipped
    click.echo(f"run {st.run_id} · job {st.job} · key {st.key}")
    click.echo(f"state      {st.state} (next: {st.next})")
    click.echo(f"units      {st.total} total: {st.processed} processed, {st.failed} failed, "
               f"{st.skipped} skipped, {left} to go")
    for stage in stage_order(ledger, st):
        click.echo(f"stage      {stage}: {counts_line(st.counts.get(stage, {}))}")
    click.echo(f"created    {st.created_at} · decomposed {st.decomposed_at or '-'}"
               f" · completed {st.completed_at or '-'}")
    if st.error:
        click.echo(f"error      {one_line(st.error)}")


# -- the group --------------------------------------------------------------------------------


@click.group(epilog=EXIT_CODES)
@click.option("--db", envvar="WORKLEDGER_DB", metavar="URL",
              help="Ledger database: sqlite:///relative.db, sqlite:////abs.db or "
                   "postgresql://user@host:5432/db. [env WORKLEDGER_DB; default "
                   "sqlite:///workledger.db]")
@click.option("--app", envvar="WORKLEDGER_APP", metavar="MODULE:ATTR",
              help="The Ledger object holding your job definitions, e.g. myjobs:ledger. "
                   "[env WORKLEDGER_APP]")
@click.version_option(package_name="workledger")
@click.pass_context
def cli(ctx: click.Context, db: str | None, app: str | None) -> None:
    """workledger: make large batches of work complete, resumable and countable.

    Every unit of a run is a durable ledger row before anything is dispatched; workers claim
    rows in chunks under leases; a run's state is derived from its items.
    """
    settings = Settings(db or None, app or None)
    ctx.obj = settings
    ctx.call_on_close(settings.close)


@cli.command()
@click.pass_obj
def init(settings: Settings) -> None:
    """Create or upgrade the ledger schema (safe to repeat)."""
    ledger = settings.ledger()
    applied = ledger.init()
    where = display_url(ledger.url)
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
    if not isinstance(value, dict):
        raise BadInput(f"payload must be a JSON object, not a {type(value).__name__}")
    return value


def submission_line(created: bool, st: RunStatus) -> str:
    done = f"{st.processed} processed, {st.failed} failed, {st.skipped} skipped of {st.total}"
    if created:
        return f"run {st.run_id} created (key {st.key}): {st.state}, {done}; next: {st.next}"
    return (f"run {st.run_id} already exists for key {st.key} (nothing new written): "
            f"{st.state}, {done}; next: {st.next}")


@cli.command()
@click.argument("job")
@click.option("--payload", metavar="JSON", help="The run's payload, a JSON object. [default {}]")
@click.option("--payload-file", metavar="PATH", help="Read the payload from a file ('-': stdin).")
@click.option("--key", help="Idempotency key: the same key returns the same run. "
                            "[default: a hash of the payload]")
@click.option("--json", "as_json", is_flag=True, help="Print the submission as JSON.")
@click.pass_obj
def submit(settings: Settings, job: str, payload: str | None, payload_file: str | None,
           key: str | None, as_json: bool) -> None:
    """Record a run of JOB, write one item per unit, and print its real state.

    Submitting again with the same key returns the existing run (created: false) with its
    real state; the same key with a different payload is refused and nothing is written.
    """
    value = read_payload(payload, payload_file)
    ledger = settings.ledger()
    if not ledger.jobs:
        raise UnknownJob(f"unknown job {job!r}: no app loaded "
                         "(pass --app module:attribute or set WORKLEDGER_APP)")
    try:
        sub = ledger.submit(job, value, key=key)
    except DecompositionFailed as exc:
        if as_json and exc.status is not None:
            echo_json({"run_id": exc.run_id, "created": True, **status_dict(exc.status)})
        raise DecompositionFailed(f"run {exc.run_id} stays accepted with nothing dispatched: "
                                  f"{exc}", exc.run_id, exc.status) from exc
    if as_json:
        echo_json({"run_id": sub.run_id, "created": sub.created, **status_dict(sub.status)})
    else:
        click.echo(submission_line(sub.created, sub.status))


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


@cli.command()
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True,
              help="Handler threads.")
@click.option("--chunk", type=click.IntRange(min=1), default=100, show_default=True,
              help="Items claimed per claim.")
@click.option("--lease", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="Lease in seconds, renewed while handlers run.")
@click.option("--until-idle", is_flag=True,
              help="Exit once nothing is claimable and nothing will be without a person.")
@click.option("--job", "jobs", multiple=True, metavar="NAME",
              help="Work only on this job (repeatable). [default: every job of the app]")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
@click.pass_obj
def worker(settings: Settings, concurrency: int, chunk: int, lease: float, until_idle: bool,
           jobs: tuple[str, ...], as_json: bool) -> None:
    """Claim items in chunks under leases, run their handlers, record outcomes.

    SIGTERM or SIGINT stops it cleanly: running handlers finish, unstarted items are released
    (a second signal exits at once). Prints a one-line summary at the end.
    """
    ledger = settings.ledger()
    if not ledger.jobs:
        raise UsageError("no jobs to work on: pass --app module:attribute or set WORKLEDGER_APP")
    w = ledger.worker(concurrency=concurrency, until_idle=until_idle, chunk=chunk, lease=lease,
                      jobs=list(jobs) or None)
    names = ", ".join(jobs or sorted(ledger.jobs))
    click.echo(f"worker {w.worker_id} on {display_url(ledger.url)}: jobs {names}; "
               f"concurrency {concurrency}, chunk {chunk}, lease {lease:g}s", err=True)
    with stop_on_signals(w) as received:
        report = w.run()
    how = f"stopped by {signal.Signals(received[0]).name}" if received else "idle, done"
    if as_json:
        echo_json({"worker_id": w.worker_id, "stopped_by": how, **asdict(report)})
    else:
        click.echo(report_line(report, how))


# -- reading -----------------------------------------------------------------------------------


@cli.command()
@click.argument("run_id", metavar="RUN", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--watch", is_flag=True, help="Show live progress bars until the run is complete.")
@click.pass_obj
def status(settings: Settings, run_id: int, as_json: bool, watch: bool) -> None:
    """Show RUN's state, derived from its items: per-stage counts by state."""
    ledger = settings.ledger()
    st = ledger.status(run_id)
    if watch:
        try:
            st = watch_run(ledger, run_id, Console(stderr=as_json))
        except KeyboardInterrupt:
            st = ledger.status(run_id)
    if as_json:
        echo_json(status_dict(st))
    else:
        print_status(ledger, st)


@cli.command()
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="How many runs at most.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of run statuses.")
@click.pass_obj
def runs(settings: Settings, limit: int, as_json: bool) -> None:
    """List recent runs with their derived states, newest first."""
    found = settings.ledger().runs(limit)
    if as_json:
        echo_json([status_dict(st) for st in found])
        return
    table = Table("run", "job", "key", "state", "total", "processed", "failed", "skipped",
                  "created")
    for st in found:
        table.add_row(str(st.run_id), st.job, st.key, st.state, str(st.total), str(st.processed),
                      str(st.failed), str(st.skipped), st.created_at)
    Console(markup=False).print(table)


@cli.command()
@click.argument("run_id", metavar="RUN", type=int)
@click.option("--stage", help="Only items of this stage.")
@click.option("--state", type=click.Choice(ITEM_STATES), help="Only items in this state.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="How many items at most.")
@click.option("--after", type=click.IntRange(min=0), default=0, metavar="ID",
              help="Only items with an id above ID (to page through).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of items.")
@click.pass_obj
def items(settings: Settings, run_id: int, stage: str | None, state: str | None, limit: int,
          after: int, as_json: bool) -> None:
    """List RUN's items: seq, key, state, attempts, result and error (the reason)."""
    rows = settings.ledger().items(run_id, stage=stage, state=state, limit=limit, after_id=after)
    if as_json:
        echo_json([asdict(r) for r in rows])
        return
    table = Table("id", "stage", "seq", "key", "state", "attempts", "result", "error")
    for r in rows:
        result = "" if r.result is None else json.dumps(r.result)
        table.add_row(str(r.id), r.stage, str(r.seq), r.key or "", r.state, str(r.attempts),
                      result, r.error or "")
    Console(markup=False).print(table)


# -- progress ----------------------------------------------------------------------------------


def stage_done(st: RunStatus, stages: list[str], i: int) -> int:
    """Units past stage ``i``: its terminal items plus units that ended in an earlier stage."""
    counts = st.counts.get(stages[i], {})
    here = sum(counts.get(s, 0) for s in ("processed", "failed", "skipped"))
    before = sum(st.counts.get(s, {}).get(x, 0) for s in stages[:i] for x in ("failed", "skipped"))
    return here + before


def watch_run(ledger: Ledger, run_id: int, console: Console,
              stop: Callable[[], bool] | None = None, interval: float = 0.25) -> RunStatus:
    """Live progress bars, one per stage, until the run is complete (or ``stop()`` says so)."""
    columns = (TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[detail]}"))
    tasks: dict[str, TaskID] = {}
    with Progress(*columns, console=console) as progress:
        while True:
            st = ledger.status(run_id)
            stages = stage_order(ledger, st)
            for i, stage in enumerate(stages):
                if stage not in tasks:
                    tasks[stage] = progress.add_task(stage, total=st.total, detail="")
                progress.update(tasks[stage], total=st.total, completed=stage_done(st, stages, i),
                                detail=f"{st.state} · {counts_line(st.counts.get(stage, {}))}")
            if st.complete or (stop is not None and stop()):
                return st
            time.sleep(interval)


# -- demo --------------------------------------------------------------------------------------


@cli.group()
def demo() -> None:
    """Built-in demonstrations."""


@demo.command("events")
@click.option("--events", "count", type=click.IntRange(min=1), default=1000, show_default=True,
              help="How many events the remote response holds.")
@click.option("--kill-after", type=click.IntRange(min=1), metavar="K",
              help="SIGKILL the first worker once K effects exist. [default: 40% of the events]")
@click.option("--lease", type=click.FloatRange(min=0, min_open=True), default=2.0,
              show_default=True, help="The workers' lease in seconds.")
@click.pass_obj
def demo_events(settings: Settings, count: int, kill_after: int | None, lease: float) -> None:
    """The event fan-out: N events, a worker killed part-way, a second one finishing the rest.

    Submits run "events-demo-N" to the --db ledger (default ./workledger.db), writes effects
    to a sink file next to it, and ends with a table showing nothing was done twice. Run it
    again: it reports the existing run's real state and finishes whatever is left.
    """
    from workledger.demos.runner import DemoOptions, run_events_demo

    options = DemoOptions(url=settings.url, events=count,
                          kill_after=kill_after or max(1, count * 2 // 5), lease=lease)
    if not run_events_demo(options, Console()):
        raise click.exceptions.Exit(1)


@demo.command("payroll")
@click.option("--employees", type=click.IntRange(min=1), default=2000, show_default=True,
              help="How many employees the pay period has (a few are invalid on purpose).")
@click.option("--out", "out_dir", default="./payslips", show_default=True, metavar="DIR",
              help="Where the PDFs, the employee store and the mail sink's record go.")
@click.option("--crash-after", type=click.IntRange(min=1), metavar="K",
              help="SIGKILL the worker process after K deliveries, then finish with a fresh one.")
@click.option("--mail-outage", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="The built-in mail sink refuses with 451 for that long; deliveries back off.")
@click.option("--smtp-host", metavar="HOST",
              help="Deliver to this SMTP server instead of the built-in sink (no verify hook: "
                   "uncertain deliveries become unknown).")
@click.option("--smtp-port", type=click.IntRange(min=1, max=65535), metavar="PORT",
              help="The SMTP server's port (with --smtp-host; alone it means 127.0.0.1).")
@click.pass_obj
def demo_payroll(settings: Settings, employees: int, out_dir: str, crash_after: int | None,
                 mail_outage: float | None, smtp_host: str | None,
                 smtp_port: int | None) -> None:
    """The payroll run: generate a PDF payslip per employee, then deliver it by e-mail.

    Two stages with their own state, so a mail outage never forces regeneration. The pay
    period is the run's key: running the command again resumes the same run, reports its real
    state and finishes what is left; it never starts a second run. Ends with a table showing
    nothing was generated or sent twice.
    """
    from workledger.demos.payroll import run_demo  # reportlab and aiosmtpd: only when asked

    code = run_demo(settings.url, employees=employees, out_dir=out_dir, crash_after=crash_after,
                    mail_outage=mail_outage, smtp_host=smtp_host, smtp_port=smtp_port,
                    console=Console())
    if code:
        raise click.exceptions.Exit(code)


# Recovery and repair commands live in their own module and register themselves on ``cli``.
from workledger.cli import repair as _repair  # noqa: E402,F401

# -- reference docs ------------------------------------------------------------------------------


def _walk(cmd: click.Command, ctx: click.Context) -> Iterator[tuple[click.Command, click.Context]]:
    yield cmd, ctx
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, click.Context(sub, info_name=name, parent=ctx,
                                                    terminal_width=100, max_content_width=100))


def reference() -> str:
    """The CLI reference in Markdown, generated from the click commands (``make docs``)."""
    root = click.Context(cli, info_name="workledger", terminal_width=100, max_content_width=100)
    out = ["# CLI reference", "",
           "Generated from `src/workledger/cli/` by `make docs`; do not edit by hand.", ""]
    for cmd, ctx in _walk(cli, root):
        out += [f"## `{ctx.command_path}`", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(out)


# -- entry point ---------------------------------------------------------------------------------


def fail(message: str, code: int) -> int:
    click.echo(f"error: {one_line(message)}", err=True)
    return code


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code; every failure is one line on stderr."""
    try:
        rv = cli.main(args=None if argv is None else list(argv), prog_name="workledger",
                      standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.exceptions.UsageError as exc:
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        return fail(exc.format_message() + where, 2)
    except click.ClickException as exc:
        return fail(exc.format_message(), exc.exit_code)
    except WorkledgerError as exc:
        return fail(str(exc) or type(exc).__name__, exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        return fail("interrupted", 130)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        if os.environ.get("WORKLEDGER_DEBUG") == "1":
            raise
        return fail(f"unexpected {type(exc).__name__}: {exc} (WORKLEDGER_DEBUG=1 shows a "
                    "traceback)", 1)


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(argv))


