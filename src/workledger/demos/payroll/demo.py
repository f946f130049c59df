"""What ``workledger demo payroll`` runs: :func:`run_demo`.

A mail sink, a run keyed by the pay period, worker subprocesses (``python -m
workledger.demos.payroll worker``; one SIGKILLed with ``crash_after``), progress bars and a final
table that counts renders and messages.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

from workledger import Ledger, RunStatus, WorkledgerError
from workledger.demos.payroll.config import (
    BOUNCE_DOMAIN,
    DEFAULT_PERIOD,
    JOB,
    PayrollConfig,
    document_id,
    message_prefix,
)
from workledger.demos.payroll.job import build
from workledger.demos.payroll.render import render_payslip
from workledger.demos.payroll.store import EmployeeStore
from workledger.demos.smtp_sink import MailSink
from workledger.errors import UsageError

OUTAGE_WAIT = 600.0  # seconds the demo waits for its database to come back, as a worker
RENDER_SAMPLE = 200  # payslips rendered to measure the render limit (scaled to the run)
WORKER_ARGS = ("--concurrency", "4", "--chunk", "100", "--lease", "5")


@dataclass
class Clock:
    """When the parent saw each stage start and finish (polled, so within a fraction of a s)."""

    seen: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        self.seen.setdefault(name, time.monotonic())

    def seconds(self, begin: str, end: str) -> float | None:
        if end not in self.seen:
            return None
        return self.seen[end] - self.seen.get(begin, self.seen[end])

    def rate(self, done: int, begin: str, end: str) -> str:
        if end not in self.seen:
            return "not finished while watched"
        took = self.seen[end] - self.seen.get(begin, self.seen[end])
        if took < 1.0:  # a resumed run: most of it was done before this command started
            return f"{done} (no rate: it was finished within a second of being watched)"
        return f"{done} in {took:.1f} s ({done / took:.0f} items/s)"


@dataclass
class Demo:
    ledger: Ledger
    config: PayrollConfig
    period: str
    employees: int
    console: Console
    sink: MailSink | None
    store: EmployeeStore
    run_id: int = 0
    clock: Clock = field(default_factory=Clock)
    limit_s: float = 0.0  # the render limit, measured after the run

    @property
    def url(self) -> str:
        return self.ledger.url

    def sent(self) -> int:
        """Deliveries so far: messages in the built-in sink (recorded in the ledger or not),
        else, with an external server, the deliveries the ledger has recorded."""
        if self.sink is not None:
            return self.sink.records.count(message_prefix(self.run_id))
        counts = self.ledger.status(self.run_id).counts.get("deliver", {})
        return int(counts.get("processed", 0))

    def worker(self, err: IO[bytes]) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "workledger.demos.payroll", "worker", "--db", self.url,
               "--out", str(self.config.out_dir),
               "--smtp", f"{self.config.smtp_host}:{self.config.smtp_port}", *WORKER_ARGS]
        if self.config.sink is not None:
            cmd += ["--sink", str(self.config.sink)]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)


def _stage_line(counts: dict[str, int]) -> str:
    shown = [f"{s} {counts[s]}" for s in ("claimed", "pending", "unknown", "failed", "skipped")
             if counts.get(s)]
    return " · ".join(shown)


def _watch(demo: Demo, proc: subprocess.Popen[bytes], kill_at: int | None) -> bool:
    """Progress bars until the worker exits; SIGKILL it once ``kill_at`` messages exist."""
    columns = (TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[detail]}"))
    with Progress(*columns, console=demo.console, transient=False) as progress:
        tasks = {s: progress.add_task(s, total=None, detail="") for s in ("generate", "deliver")}
        shown_at = 0.0
        while True:
            if kill_at is not None and demo.sent() >= kill_at:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                _show(demo, progress, tasks)
                return True
            if time.monotonic() - shown_at > 0.2:
                _show(demo, progress, tasks)
                shown_at = time.monotonic()
            try:
                proc.wait(timeout=0.005 if kill_at is not None else 0.05)
            except subprocess.TimeoutExpired:
                continue
            _show(demo, progress, tasks)
            return False


def _show(demo: Demo, progress: Progress, tasks: dict[str, TaskID]) -> None:
    st = demo.ledger.status(demo.run_id)
    gen, dlv = st.counts.get("generate", {}), st.counts.get("deliver", {})
    gen_done = sum(gen.get(s, 0) for s in ("processed", "failed", "skipped"))
    dlv_total = st.total - gen.get("failed", 0) - gen.get("skipped", 0)
    dlv_done = sum(dlv.get(s, 0) for s in ("processed", "failed", "skipped"))
    if gen_done >= st.total:
        demo.clock.mark("generate done")
    if dlv.get("processed"):
        demo.clock.mark("deliver first")
    if dlv_done >= dlv_total and gen_done >= st.total:
        demo.clock.mark("deliver done")
    outage = ""
    left, begun = demo.sink.outage_left() if demo.sink is not None else (0.0, False)
    if left > 0:
        outage = (f" · sink refusing (451) for {left:.0f} s more" if begun
                  else f" · a {left:g} s mail outage begins with the first delivery")
    progress.update(tasks["generate"], total=st.total, completed=gen_done, detail=_stage_line(gen))
    progress.update(tasks["deliver"], total=max(dlv_total, 0), completed=dlv_done,
                    detail=_stage_line(dlv) + outage)


def _run_worker(demo: Demo, label: str, kill_at: int | None) -> bool:
    with tempfile.TemporaryFile() as err:
        proc = demo.worker(err)
        demo.clock.mark("start")
        demo.console.print(f"{label} (pid {proc.pid}) started"
                           + (f"; SIGKILL after {kill_at} deliveries" if kill_at else ""),
                           markup=False)
        try:
            killed = _watch(demo, proc, kill_at)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if not killed and proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise WorkledgerError(f"{label} failed (exit {proc.returncode}): {tail[0]}")
        if not killed and proc.stdout is not None:
            report = json.loads(proc.stdout.read() or b"{}")
            demo.console.print(f"{label}: processed {report.get('processed', 0)} items, "
                               f"reclaimed {report.get('reclaimed', 0)} expired leases, "
                               f"{report.get('retried', 0)} retries", markup=False)
        return killed


def _crash_then_finish(demo: Demo, crash_after: int | None) -> None:
    kill_at = None if crash_after is None else demo.sent() + crash_after
    if not _run_worker(demo, "worker 1", kill_at):
        return
    st = demo.ledger.status(demo.run_id)
    demo.console.print(
        f"\nworker 1 SIGKILLed with {demo.sent()} messages in the sink; the ledger says "
        f"generate {_stage_line(st.counts.get('generate', {})) or 'done'}, deliver "
        f"{st.counts.get('deliver', {}).get('processed', 0)} processed · "
        f"{_stage_line(st.counts.get('deliver', {}))}\nworker 2 waits for the dead worker's "
        "leases (5 s) to expire; its sweeper asks the sink about each delivery in flight",
        markup=False)
    _run_worker(demo, "worker 2", None)


# -- the final table -------------------------------------------------------------------------


def _rows(demo: Demo, stage: str, state: str) -> Iterator[Any]:
    after = 0
    while rows := demo.ledger.items(demo.run_id, stage=stage, state=state, limit=1000,
                                    after_id=after):
        yield from rows
        after = rows[-1].id


def _reasons(demo: Demo, state: str) -> str:
    reasons: Counter[str] = Counter()
    for stage in ("generate", "deliver"):
        reasons.update(r.error or "no reason" for r in _rows(demo, stage, state))
    return ", ".join(f"{why}: {n}" for why, n in reasons.most_common())


@dataclass
class Checks:
    rows: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(self, name: str, value: Any, ok: bool = True, problem: str = "") -> None:
        self.rows.append((name, str(value)))
        if not ok:
            self.problems.append(problem or name)


def _check_documents(demo: Demo, checks: Checks, st: RunStatus) -> None:
    generated = st.counts.get("generate", {}).get("processed", 0)
    files = len(list((demo.config.out_dir / demo.period).glob(
        f"{document_id(demo.run_id, demo.period, '')}*.pdf")))
    calls, written, twice = demo.store.render_counts(demo.run_id)
    checks.add("generated", f"{generated} payslips · {files} PDF files in "
               f"{demo.config.out_dir / demo.period}", files == generated,
               f"{files} PDF files for {generated} generated payslips")
    checks.add("render calls", f"{calls} · PDFs written {written} · written twice {twice}",
               twice == 0, f"{twice} payslips written twice")


def _check_mail(demo: Demo, checks: Checks, st: RunStatus) -> None:
    delivered = {r.result.get("message_id") if isinstance(r.result, dict) else None
                 for r in _rows(demo, "deliver", "processed")}
    checks.add("delivered", len(delivered))
    if demo.sink is None:
        checks.add("mail server", f"{demo.config.smtp_host}:{demo.config.smtp_port} (external: "
                   "messages not counted)")
        return
    per_id = demo.sink.records.per_message_id(message_prefix(demo.run_id))
    twice = sum(1 for n in per_id.values() if n > 1)
    missing = len(delivered - set(per_id))
    unrecorded = len(set(per_id) - delivered)
    checks.add("sink messages", f"{sum(per_id.values())} for {len(delivered)} delivered items · "
               f"sent twice {twice} · missing {missing} · not recorded {unrecorded}",
               twice == missing == unrecorded == 0,
               "the sink does not hold exactly one message per delivered item")
    refused = demo.sink.records.refusals()
    checks.add("sink refusals (all runs)",
               " · ".join(f"{n} × {code}" for code, n in refused.items()) or "none")


def _report(demo: Demo, created: bool) -> int:
    if "deliver done" in demo.clock.seen:
        demo.limit_s = render_limit(demo)
    checks = _checks(demo, created, demo.ledger.status(demo.run_id))
    table = Table("payroll", demo.period, title="\nwhat the ledger, the files and the sink say")
    for name, value in checks.rows:
        table.add_row(name, value)
    demo.console.print(table)
    if checks.problems:
        demo.console.print("CHECK FAILED: " + "; ".join(checks.problems), markup=False)
        return 1
    demo.console.print("nothing generated or sent twice", markup=False)
    cmd = "workledger"
    if demo.url != "sqlite:///workledger.db":
        cmd += f" --db {demo.ledger.where}"
    demo.console.print(f"look closer: {cmd} status {demo.run_id}\n"
                       f"             {cmd} items {demo.run_id} --state failed\n"
                       f"  in a browser: {cmd} serve   (then open the address it prints)",
                       markup=False)
    return 0


def _checks(demo: Demo, created: bool, st: RunStatus) -> Checks:
    """The rows of the final table, and which of them show a problem."""
    checks = Checks()
    finished = st.state in ("completed", "completed_with_failures")
    checks.add("run", f"{demo.run_id} · key {st.key} · created={created} · {st.state}",
               finished, f"the run is {st.state} (next: {st.next})")
    checks.add("employees", f"{st.total} units")
    _check_documents(demo, checks, st)
    _check_mail(demo, checks, st)
    checks.add("skipped", f"{st.skipped} ({_reasons(demo, 'skipped') or 'none'})")
    checks.add("failed", f"{st.failed} ({_reasons(demo, 'failed') or 'none'})")
    unknown = sum(c.get("unknown", 0) for c in st.counts.values())
    if unknown:
        checks.add("unknown", f"{unknown} (awaiting a person: workledger audit, resolve)")
    if "start" in demo.clock.seen:  # a worker ran: how fast each stage went, as watched
        checks.add("generate", demo.clock.rate(
            st.counts.get("generate", {}).get("processed", 0), "start", "generate done"))
        checks.add("deliver", demo.clock.rate(
            st.counts.get("deliver", {}).get("processed", 0), "deliver first", "deliver done"))
        wall = demo.clock.seconds("start", "deliver done")
        if wall is not None and wall >= 1.0 and demo.limit_s:
            checks.add("wall time", f"{wall:.1f} s · render limit {demo.limit_s:.1f} s (the "
                       "same payslips rendered in one process, no I/O) · "
                       f"{wall / demo.limit_s:.1f}x")
    return checks


def render_limit(demo: Demo, sample: int = RENDER_SAMPLE) -> float:
    """Seconds one process takes to render this run's generated payslips with no I/O at all:
    the floor the run's wall time is measured against (a sample, scaled to the count)."""
    docs = [r.key for r in _rows(demo, "generate", "processed")]
    slips = [s for s in (demo.store.payslip(str(k), demo.period) for k in docs[:sample])
             if s is not None]
    if not slips:
        return 0.0
    for slip in slips[:10]:  # the first renders of a process load fonts and warm its caches
        render_payslip(slip, document_id(demo.run_id, demo.period, slip.employee_id))
    best = float("inf")
    for _ in range(2):  # a floor: the faster of two timings (a busy machine only adds)
        began = time.perf_counter()
        for slip in slips:
            render_payslip(slip, document_id(demo.run_id, demo.period, slip.employee_id))
        best = min(best, time.perf_counter() - began)
    return best / len(slips) * len(docs)


def summary(demo: Demo) -> dict[str, Any]:
    """``demo payroll --json``: the run's figures as one JSON object."""
    st = demo.ledger.status(demo.run_id)
    calls, _, _ = demo.store.render_counts(demo.run_id)
    gen, dlv = st.counts.get("generate", {}), st.counts.get("deliver", {})
    stages = {}
    for name, counts, begin, end in (("generate", gen, "start", "generate done"),
                                     ("deliver", dlv, "deliver first", "deliver done")):
        took = demo.clock.seconds(begin, end)
        done = counts.get("processed", 0)
        stages[name] = {"items": done, "seconds": took,
                        "items_per_s": round(done / took, 1) if took else None}
    return {"run_id": demo.run_id, "state": st.state, "generated": gen.get("processed", 0),
            "delivered": dlv.get("processed", 0), "skipped": st.skipped, "failed": st.failed,
            "render_calls": calls,
            "sink_messages": demo.sent() if demo.sink is not None else None,
            "wall_s": demo.clock.seconds("start", "deliver done"),
            "render_limit_s": round(demo.limit_s, 3) if demo.limit_s else None,
            "stages": stages}


def _foreign(demo: Demo) -> bool:
    """A new run whose number already has PDFs or messages here belongs to another ledger."""
    return demo.store.documents_of(demo.run_id) > 0 or (demo.sink is not None
                                                         and demo.sent() > 0)


def run_demo(db_url: str, employees: int = 2000, out_dir: str | Path = "./payslips",
             crash_after: int | None = None, mail_outage: float | None = None,
             smtp_host: str | None = None, smtp_port: int | None = None,
             console: Console | None = None, *, period: str = DEFAULT_PERIOD,
             as_json: bool = False) -> int:
    """``workledger demo payroll``: return 0 when the run is complete and nothing happened twice.

    The pay period is the run's idempotency key: a second call finds the run (created=False),
    reports its real state and finishes what is left. ``smtp_host``/``smtp_port`` deliver to an
    existing server instead of the built-in sink (then ``deliver`` has no verify hook).
    ``crash_after``: SIGKILL the first worker after that many deliveries, then start a fresh
    one. ``mail_outage``: the built-in sink answers 451 for that many seconds, counted from
    the first delivery. Exit codes: 0 checks hold, 1 a check failed or the run is not finished,
    2 ``out_dir`` holds another ledger's run. Raises ``PayloadMismatch`` when the period's run
    was submitted for another number of employees.

    >>> run_demo("sqlite:///workledger.db", employees=200, crash_after=50)  # doctest: +SKIP
    0
    """
    console = console or Console()
    out = prepare_out(Path(out_dir))
    external = smtp_host is not None or smtp_port is not None
    config = PayrollConfig(out, smtp_host or "127.0.0.1", smtp_port or 25,
                           None if external else out / "mail-sink.db")
    store = EmployeeStore(config.store_path)
    store.seed(employees, period)
    sink = None if external else MailSink(out / "mail-sink.db", reject_domains=[BOUNCE_DOMAIN])
    try:
        if sink is not None:
            sink.start()
            config = replace(config, smtp_port=sink.port)
            if mail_outage:
                sink.outage(mail_outage, on_first_delivery=True)
        book = build(db_url, config)
        book.wait_out_outages(OUTAGE_WAIT)  # the progress display outlives a database restart
        demo = Demo(book, config, period, employees, console, sink, store)
        return _run(demo, crash_after, as_json)
    finally:
        store.close()
        if sink is not None:
            sink.stop()


def prepare_out(out: Path) -> Path:
    """The output folder, made if need be; refused (``UsageError``) before anything is written
    when it is a file, cannot be made, or is a folder that holds other things than a payroll
    demo's (no ``employees.db``): ``--out /`` must not scatter payslips over a file system."""
    out = out.resolve()
    try:
        if out.is_dir():
            if any(out.iterdir()) and not (out / "employees.db").is_file():
                raise UsageError(f"--out {out} is a folder that is not empty and holds no "
                                 "payroll demo (employees.db): choose a new or empty folder")
            return out
        if out.exists():
            raise UsageError(f"--out {out} is a file, not a folder")
        out.mkdir(parents=True)
    except OSError as exc:
        raise UsageError(f"cannot use --out {out}: {exc.strerror or exc}") from exc
    return out


def _run(demo: Demo, crash_after: int | None, as_json: bool = False) -> int:
    try:
        sub = demo.ledger.submit(JOB, {"period": demo.period, "employees": demo.employees},
                                 key=demo.period)
        demo.run_id = sub.run_id
        where = (f"mail sink 127.0.0.1:{demo.sink.port} ({demo.config.sink})" if demo.sink
                 else f"SMTP {demo.config.smtp_host}:{demo.config.smtp_port}")
        demo.console.print(f"payroll {demo.period}: run {sub.run_id} (created={sub.created}, "
                           f"{sub.state}) · {sub.status.total} employees\nPDFs in "
                           f"{demo.config.out_dir / demo.period} · {where}", markup=False)
        if sub.created and _foreign(demo):
            demo.console.print(f"{demo.config.out_dir} already holds payslips or messages of a "
                               f"run {sub.run_id} of another ledger; use another --out",
                               markup=False)
            return 2
        if not sub.status.complete:
            _crash_then_finish(demo, crash_after)
        code = _report(demo, sub.created)
        if as_json:  # the last line of output: one JSON object
            demo.console.file.flush()
            print(json.dumps(summary(demo)), flush=True)
        return code
    finally:
        demo.ledger.close()
