"""The console excerpts of the README and the docs, produced by running their commands.

An excerpt is a fenced ``text`` block right after a marker line ``<!-- excerpt: NAME -->`` in
a Markdown file (:data:`FILES`). Each NAME is made here by a scenario that runs the commands
the block shows, as a user types them, in a folder of its own: ``python tests/excerpts.py``
(``make excerpts``) runs every scenario and rewrites the blocks, and ``tests/test_doc_excerpts.py``
runs them and fails when a block differs from what the commands print now, so an excerpt
cannot drift from the code. What changes from one run to the next (times, worker ids, lease
tokens, ports, durations, and in scenarios whose timing decides them, counts) is compared
masked (:func:`stable`); every other character must be the same.

A block shows each command after ``$ `` and its output (stdout and stderr, as a terminal
shows them), whole or the lines a scenario keeps, with ``...`` where lines were left out.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", ROOT / "examples" / "celery_payroll" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- excerpt: ([\w-]+) -->\n```text\n(.*?)```", re.M | re.S)
COLUMNS = "100"  # the terminal width the excerpts are printed at

Keep = Callable[[list[str]], list[str]]


def every(lines: list[str]) -> list[str]:
    return lines


def matching(*patterns: str, more: bool = True) -> Keep:
    """Only the lines matching one of ``patterns``, after a ``...`` line when others come
    before them (``more``)."""
    def keep(lines: list[str]) -> list[str]:
        kept = [ln for ln in lines if any(re.search(p, ln) for p in patterns)]
        return (["..."] if more and kept != lines else []) + kept
    return keep


def dropping(*patterns: str) -> Keep:
    return lambda lines: [ln for ln in lines if not any(re.search(p, ln) for p in patterns)]


@dataclass
class Shell:
    """Commands run as typed in a terminal, in ``cwd``; ``workledger`` is this checkout's."""

    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    code: int = 0  # the exit code of the last command, for ``echo $?``

    def environment(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("WORKLEDGER_", "COLUMNS", "LINES"))}
        return {**base, "COLUMNS": COLUMNS, "TERM": "dumb", **self.env}

    def argv(self, typed: str) -> list[str]:
        words = shlex.split(typed)
        if words[0] == "workledger":
            return [sys.executable, "-m", "workledger.cli", *words[1:]]
        return words

    def run(self, typed: str, keep: Keep = every, *, timeout: float = 300) -> list[str]:
        """``$ typed`` and the output lines ``keep`` keeps."""
        if typed == "echo $?":
            return [f"$ {typed}", str(self.code)]
        done = subprocess.run(self.argv(typed.replace("\\\n    ", "")), cwd=self.cwd,
                              env=self.environment(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        self.code = done.returncode
        return [f"$ {typed}", *keep([ln.rstrip() for ln in done.stdout.splitlines()])]

    def quietly(self, typed: str, *, codes: tuple[int, ...] = (0,),
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """A set-up command the excerpt does not show, exiting with one of ``codes``."""
        done = subprocess.run(self.argv(typed), cwd=self.cwd, env=self.environment(),
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode not in codes:
            raise RuntimeError(f"{typed}: exit {done.returncode}: {done.stderr[-2000:]}")
        return done

    def start(self, typed: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(typed), cwd=self.cwd, env=self.environment(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def block(*parts: list[str]) -> str:
    return "\n".join(line for part in parts for line in part) + "\n"


# -- the scenarios -------------------------------------------------------------------------------


def after_the_demo(folder: Path) -> dict[str, str]:
    """README "When things go wrong" and the status the Celery example ends with: the payroll
    demo (2,000 employees, 8 refused mailboxes), then audit, a redrive, and a reconcile."""
    sh = Shell(folder)
    sh.quietly("workledger demo payroll")
    out = {"payroll-status": block(sh.run("workledger status 1", dropping("^created "))[1:])}
    out["audit-after-demo"] = block(sh.run("workledger audit"), sh.run("echo $?"))
    out["redrive-one-delivery"] = block(
        sh.run("sqlite3 payslips/employees.db \"UPDATE employees SET email = "
               "'tariq.bauer@staff.example.com' WHERE id = 'E00199'\""),
        sh.run('workledger retry 1 --stage deliver --item 198 --note "E00199 has a new '
               'address"'),
        sh.run("workledger status 1", dropping("^created ")),
        sh.run("workledger demo payroll", matching(r"│ (delivered|sink messages) ",
                                                   r"^│ +│ recorded")),
        sh.run("workledger history 1 --stage deliver --item 198"))
    sh.quietly("sqlite3 workledger.db \"UPDATE wl_runs SET total = 99, processed = 0, "
               "failed = 0, skipped = 0, completed_at = NULL\"")
    out["reconcile-broken-counters"] = block(sh.run("workledger reconcile 1 --dry-run"),
                                             sh.run("workledger reconcile 1"))
    return out


def external_server(folder: Path) -> dict[str, str]:
    """README: a crash while delivering to a server without a verify hook leaves the
    deliveries in flight unknown; a person resolves them and the demo finishes. A kill that
    falls between two batches leaves nothing in doubt, and then there is nothing to show:
    the crash is tried again on a fresh ledger, at most five times."""
    from workledger.demos.smtp_sink import MailSink

    with contextlib.ExitStack() as stack:
        for attempt in range(5):
            here = folder / f"attempt-{attempt + 1}"
            here.mkdir()
            sh = Shell(here)
            server = stack.enter_context(MailSink(here / "external-server.db"))
            port = server.port
            sh.quietly(f"workledger --db sqlite:///ext.db demo payroll --smtp-port {port} "
                       f"--crash-after {610 + 10 * attempt}", codes=(0, 1))  # 1: unknown
            status = sh.run("workledger --db sqlite:///ext.db status 1",
                            matching("^state ", "^stage +deliver", more=False))
            if "awaiting_repair" in status[1]:
                break
        resolved = sh.run("workledger --db sqlite:///ext.db resolve 1 --stage deliver "
                          "--all-unknown --as pending \\\n    --note \"none of them is in "
                          "the mail server's log\"")
        again = sh.run(f"workledger --db sqlite:///ext.db demo payroll --smtp-port {port}",
                       matching(r"│ (run|delivered) ", "^nothing generated"))
    return {"resolve-unknown-deliveries": block(status, resolved, again)}


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A mail server that accepts connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def hung_handlers(folder: Path) -> dict[str, str]:
    """README "A handler that hangs": a mail server that never answers, worker --timeout 5."""
    from workledger.demos.payroll import DEFAULT_PERIOD, EmployeeStore

    store = EmployeeStore(folder / "payslips" / "employees.db")
    store.seed(2000, DEFAULT_PERIOD)
    store.close()
    with silent_server() as port:
        sh = Shell(folder, {"WORKLEDGER_DB": "sqlite:///t.db",
                            "WORKLEDGER_PAYROLL_SMTP": f"127.0.0.1:{port}"})
        sh.quietly("workledger --app workledger.demos.payroll:ledger submit payroll --payload "
                   "'{\"period\": \"2026-11\", \"employees\": 2000}' --key 2026-11")
        worker = sh.run("workledger --app workledger.demos.payroll:ledger worker --until-idle "
                        "--timeout 5", first_of("started on", "still running after",
                                                "handlers are stuck", "^error: "))
    return {"hung-handlers": block(worker, sh.run("echo $?"))}


def first_of(*patterns: str) -> Keep:
    """The first line matching each pattern, in order, with ``...`` where lines were left out."""
    def keep(lines: list[str]) -> list[str]:
        kept: list[str] = []
        at = 0
        for pattern in patterns:
            for i in range(at, len(lines)):
                if re.search(pattern, lines[i]):
                    if i > at and kept:
                        kept.append("...")
                    kept.append(lines[i])
                    at = i + 1
                    break
        return kept
    return keep


def database_outage(folder: Path) -> dict[str, str]:
    """README "The database goes away": the demo on a private PostgreSQL server stopped for
    9 s mid-run (``pg_ctl stop -m fast``, then ``pg_ctl start``)."""
    sys.path.insert(0, str(ROOT / "chaos"))
    try:
        from pgserver import PrivatePostgres
    finally:
        sys.path.remove(str(ROOT / "chaos"))
    server = PrivatePostgres()
    server.create()
    try:
        url = server.create_database("payroll")
        sh = Shell(folder)
        typed = f"workledger --db {url} demo payroll"
        demo = sh.start(typed)
        wait_for_deliveries(url, 300, demo)
        server.stop("fast")
        time.sleep(9)
        server.start()
        output, _ = demo.communicate(timeout=300)
        sh.code = demo.returncode
        lines = [ln.rstrip() for ln in output.splitlines()]
        keep = matching("^database unavailable", "^database back", r"│ (render calls|sink "
                        r"messages) ", r"^│ +│ (missing|recorded)", "^nothing generated")
        return {"database-outage": block([f"$ {typed}", *keep(lines)])}
    finally:
        server.remove()


def private_server_here() -> str | None:
    """Why no private PostgreSQL server can be started here (None: one can)."""
    sys.path.insert(0, str(ROOT / "chaos"))
    try:
        from pgserver import PrivatePostgres, ServerUnavailable
    finally:
        sys.path.remove(str(ROOT / "chaos"))
    try:
        PrivatePostgres().remove()
    except ServerUnavailable as exc:
        return str(exc)
    return None


def wait_for_deliveries(url: str, n: int, demo: subprocess.Popen[str]) -> None:
    """Until the run has ``n`` deliveries processed (the outage comes mid-run)."""
    import psycopg

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and demo.poll() is None:
        with contextlib.suppress(psycopg.Error), psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM wl_items WHERE stage = 'deliver' AND "
                               "state = 'processed'").fetchone()
            if row and row[0] >= n:
                return
        time.sleep(0.1)
    raise RuntimeError("the demo did not get to its deliveries")


SCENARIOS: dict[str, Callable[[Path], dict[str, str]]] = {
    "after the demo": after_the_demo,
    "an external server": external_server,
    "hung handlers": hung_handlers,
    "a database outage": database_outage,
}
# the excerpts each scenario makes
MAKES = {
    "after the demo": {"payroll-status", "audit-after-demo", "redrive-one-delivery",
                       "reconcile-broken-counters"},
    "an external server": {"resolve-unknown-deliveries"},
    "hung handlers": {"hung-handlers"},
    "a database outage": {"database-outage"},
}
# what each scenario's timing decides: compared as <n>
COUNTS = {"resolve-unknown-deliveries", "hung-handlers", "database-outage"}


# -- comparing and writing -----------------------------------------------------------------------


VOLATILE = [
    # Whether the first call to fail in an outage meets its session terminated ("lost the
    # connection ...") or a new connection refused ("no connection ...") is the moment the
    # server stopped, not the code: CI printed the one, the README shows the other.
    (r"database unavailable: .+?; retrying", "database unavailable: <why>; retrying"),
    (r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:\d\d|Z)?", "<time>"),
    (r"\b\d\d:\d\d:\d\d(?:[.,]\d+)?\b", "<time>"),
    # a table cell's time wraps: its date alone on one line, the rest on the next
    (r"\b\d{4}-\d\d-\d\d\b", "<date>"),
    (r"[\w.-]+:\d+:[0-9a-f]{6}\b", "<worker>"),
    (r"lease token \d+", "lease token <n>"),
    (r"(127\.0\.0\.1|--smtp-port|localhost):? ?\d{2,5}\b", r"\1:<port>"),
    (r"\d+(?:\.\d+)? ?s\b", "<n> s"),
    (r"sqlite:///\S+?\.db", "sqlite:///<file>"),
    (r"postgresql://\S+", "postgresql://<url>"),
    (r"│ \d+( +│ <worker>)", r"│ <n>\1"),  # a history event's lease token
]


TABLE = "│┃┏┡┗└╇┳┻┩┓┛┘┴┬┼├┤╭╮╰╯"


def stable(text: str, counts: bool = False) -> list[str]:
    """``text`` with what changes from run to run masked, as lines to compare. A table's
    lines are compared as the words its cells hold, in sorted order: how its columns wrap
    depends on the width of what changes (a worker id holds the host name), not on the code.
    """
    for pattern, mask in VOLATILE:
        text = re.sub(pattern, mask, text)
    if counts:
        text = re.sub(r"\d[\d,]*", "<n>", text)
    lines: list[str] = []
    words: list[str] = []
    for line in text.splitlines():
        if line[:1] in TABLE:
            words += re.sub(f"[{TABLE}━─]", " ", line).split()
            continue
        if words:
            lines.append("table: " + " ".join(sorted(words)))
            words = []
        lines.append(" ".join(line.split()))
    if words:
        lines.append("table: " + " ".join(sorted(words)))
    return lines


def blocks_in(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in MARKER.finditer(text)}


def marked() -> dict[Path, dict[str, str]]:
    """Every marked block of every file."""
    return {path: found for path in FILES if (found := blocks_in(path.read_text()))}


def produce(names: set[str] | None = None) -> dict[str, str]:
    """Run the scenarios (those making ``names``, or all) and return every excerpt they made."""
    made: dict[str, str] = {}
    for name, scenario in SCENARIOS.items():
        if name == "a database outage" and (why := private_server_here()) is not None:
            print(f"kept the excerpts of {name}: no private PostgreSQL server here ({why})")
            continue
        with tempfile.TemporaryDirectory(prefix="wl-excerpt-") as folder:
            made.update(scenario(Path(folder)))
    return made if names is None else {k: v for k, v in made.items() if k in names}


def rewrite(made: dict[str, str]) -> list[Path]:
    """Put the excerpts into their blocks; the files changed."""
    changed = []
    for path in FILES:
        text = path.read_text()
        new = MARKER.sub(lambda m: (f"<!-- excerpt: {m.group(1)} -->\n```text\n"
                                    f"{made.get(m.group(1), m.group(2))}```"), text)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


if __name__ == "__main__":
    for changed in rewrite(produce()):
        print(f"rewrote the excerpts of {changed.relative_to(ROOT)}")
