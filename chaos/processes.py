"""The round's processes: every one is the real ``workledger`` command line, started with the
chaos app, its output in files, and judged by how it ended (check E of the oracle).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHAOS_DIR = Path(__file__).resolve().parent
APP = "chaos_app:ledger"


@dataclass
class Proc:
    role: str  # worker | sweeper | submitter | operator | recovery
    name: str
    argv: list[str]
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path
    failpoint: str | None = None
    started: float = field(default_factory=time.monotonic)
    stopping: bool = False  # the supervisor asked it to stop
    killed: bool = False  # a fault sent it SIGKILL
    stopped_until: float | None = None  # SIGSTOPped until then
    note: dict[str, Any] = field(default_factory=dict)
    reaped: bool = False  # its exit was judged (poll() alone does not judge it)
    broker: bool = False  # an ``rq worker``, in a session of its own with its work horse

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> bool:
        """Send ``sig`` if the process has not been reaped (so never to a reused pid). An rq
        worker's SIGKILL, SIGSTOP and SIGCONT reach its work horse too (what runs the
        handlers, in a process group of its own): the machine dies or stalls, not only the
        parent; its SIGTERM is RQ's warm shutdown, for the parent alone."""
        if self.popen.returncode is not None:
            return False
        try:
            self.popen.send_signal(sig)
        except ProcessLookupError:
            return False
        if self.broker and sig != signal.SIGTERM:
            for pid in in_session(self.popen.pid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        return True

    def stdout(self) -> str:
        try:
            return self.out.read_text(errors="replace")
        except OSError:
            return ""

    def stderr(self) -> str:
        try:
            return self.err.read_text(errors="replace")
        except OSError:
            return ""


@dataclass(frozen=True)
class Exit:
    """How a process ended, and whether that was a clear outcome (check E)."""

    role: str
    name: str
    rc: int
    fired: bool  # died at its armed failpoint
    error: str | None  # its one-line "error: ..." if it printed one
    problem: str | None  # why this exit breaks check E, if it does
    lived: float

    @property
    def gave_up_on_the_database(self) -> bool:
        """It ended with one clear line because the database stayed away past its patience:
        what it had done and not yet recorded is, to the ledger, the work of a dead process."""
        return self.rc == 1 and self.error is not None and self.error.startswith(DB_AWAY)


def in_session(sid: int) -> list[int]:
    """The processes of session ``sid`` but its leader."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != sid:
            try:
                if os.getsid(int(entry.name)) == sid:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


class Spawner:
    """Starts command-line processes of one round with the round's environment."""

    def __init__(self, url: str, folder: Path, env: dict[str, str]) -> None:
        self.url = url
        self.folder = folder
        self.env = env
        self.count = 0

    def start(self, role: str, args: list[str], failpoint: str | None = None,
              skew: str | None = None, url: str | None = None, inside: Any = None,
              broker: Any = None, **note: Any) -> Proc:
        """``url``: another way to the same ledger (the lost-acknowledgement proxy, or the
        partition's address); ``inside``: a netns.Partition the process runs in; ``broker``:
        the round's broker.RQBroker, whose ``rq worker`` this process is (``args`` unused)."""
        if broker is not None:
            return self._start_rq(role, broker, url, note)
        self.count += 1
        name = f"{role}-{self.count}" + ("-skewed" if skew else "") \
            + ("-partitioned" if inside is not None else "")
        env = dict(self.env)
        if failpoint:
            env["WORKLEDGER_FAILPOINTS"] = failpoint
        if skew:
            env.update(faketime_env(skew))
        argv = [sys.executable, "-m", "workledger.cli", "--db", url or self.url, "--app", APP,
                *args]
        if inside is not None:
            argv = inside.wrap(argv)
        out, err = self.folder / f"{name}.out", self.folder / f"{name}.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            popen = subprocess.Popen(argv, stdout=o, stderr=e, env=env,
                                     stdin=subprocess.DEVNULL, cwd=self.folder)
        return Proc(role, name, argv, popen, out, err, failpoint, note=note)

    def _start_rq(self, role: str, broker: Any, url: str | None, note: dict[str, Any]) -> Proc:
        """An ``rq worker`` of the round's queue, in a session of its own, reaching the ledger
        the app names through ``WORKLEDGER_DB``."""
        self.count += 1
        name = f"rq-{role}-{self.count}"
        env = dict(self.env)
        env["WORKLEDGER_DB"] = url or self.url
        argv = broker.worker_argv()
        out, err = self.folder / f"{name}.out", self.folder / f"{name}.err"
        with open(err, "wb") as e:  # RQ logs (and a failed job's traceback) to stdout
            popen = subprocess.Popen(argv, stdout=e, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, stdin=subprocess.DEVNULL,
                                     cwd=self.folder)
        out.touch()
        return Proc(role, name, argv, popen, out, err, note=note, broker=True)


def faketime_library() -> str | None:
    """Debian's libfaketime (package ``libfaketime``, pulled in by ``faketime``), if installed."""
    if shutil.which("faketime") is None:
        return None
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
                   + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


def faketime_env(offset: str) -> dict[str, str]:
    """What ``faketime -f OFFSET`` sets for the program it runs, set here directly: the
    ``faketime`` wrapper forks and waits, so its pid would not be the worker's, and a SIGKILL or
    SIGSTOP meant for the worker would stop only the wrapper.

    Only the wall clock is skewed, as on a host whose clock is wrong: libfaketime would move
    the monotonic clock too, and then every timed wait (a deadline computed on the moved clock,
    waited for by the kernel on the real one) lasts minutes longer or returns at once, which
    no real host does."""
    library = faketime_library()
    if library is None:
        raise RuntimeError("faketime is not installed (Debian: apt-get install faketime)")
    site = str(CHAOS_DIR / "faketime_site")  # time.sleep that works under libfaketime
    path = os.environ.get("PYTHONPATH")
    return {"LD_PRELOAD": library, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [site, str(CHAOS_DIR), path]))}


def round_env(sink: Path, control: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORKLEDGER_FAILPOINTS", "WORKLEDGER_DEBUG", "WORKLEDGER_DB",
                        "WORKLEDGER_APP")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHAOS_DIR), env.get("PYTHONPATH")]))
    env["CHAOS_SINK"] = str(sink)
    env["CHAOS_CONTROL"] = str(control)
    return env


ERROR_LINE = re.compile(r"^error: (.*)$", re.MULTILINE)
# the one-line errors of a process that gave up on an unreachable database (storage/*.py)
DB_AWAY = ("no connection to ", "cannot connect to ", "lost the connection to ")
# the exception a traceback in an rq worker's log ends with: a job that raised (RQ logs it and
# moves the job to its failed registry; the ledger's sweeper takes its items back)
# (the last of a chain: a cause, whose message may run over more lines, indented or not, such
# as psycopg's DETAIL, is followed by a blank line and "The above exception ..." or "During
# handling")
RAISED = re.compile(r"^Traceback \(most recent call last\):\n(?:[ \t].*\n)*(\S.*)$"
                    r"(?!(?:\n.+)*\n\n+(?:The above exception|During handling))",
                    re.MULTILINE)
# what a broker task may fail with: the database away past the retry layer's patience (a
# restart, terminated sessions, a partition), or a COMMIT whose outcome could not be learned
BROKER_RAISES = ("workledger.errors.DatabaseUnavailable", "workledger.errors.CommitInDoubt",
                 "workledger.errors.Contention")


def judge(proc: Proc) -> Exit:
    """Check E for one finished process: no traceback, no unexpected error, and an exit code
    that fits how it ended (killed, stopped, died at its failpoint, or a one-line error)."""
    rc = proc.popen.returncode
    assert rc is not None
    text = proc.stderr()
    errors = ERROR_LINE.findall(text)
    error = errors[-1].strip() if errors else None
    fired = bool(proc.failpoint) and rc == 137
    problem = None
    if proc.broker:
        problem = _broker_problem(text)
    elif "Traceback (most recent call last)" in text:
        problem = "a traceback on stderr"
    elif error is not None and error.startswith("unexpected"):
        problem = f"an unexpected error: {error}"
    elif rc in (1, 2) and error is None:
        problem = f"exit {rc} without a one-line error"
    elif len(errors) > 1:
        problem = f"{len(errors)} error lines"
    elif rc not in _allowed(proc):
        problem = f"exit code {rc}"
    return Exit(proc.role, proc.name, rc, fired, error, problem,
                time.monotonic() - proc.started)


def _broker_problem(text: str) -> str | None:
    """Check E for an rq worker: RQ logs a job that raised with its traceback and goes on, so
    a traceback is a problem only when the job raised what a broker task must not (a bug, not
    a database away); its own errors are the same one-line kinds as a worker's."""
    for raised in RAISED.findall(text):
        if not raised.startswith(BROKER_RAISES):
            return f"a job raised {raised.strip()[:200]}"
    if "Traceback (most recent call last)" in text and not RAISED.findall(text):
        return "a traceback on stderr"
    return None


def _allowed(proc: Proc) -> set[int]:
    allowed = {0, 1, 2}
    if proc.killed:
        allowed.add(-signal.SIGKILL)
    if proc.failpoint:
        allowed.add(137)
    if proc.stopping:
        allowed |= {-signal.SIGTERM, -signal.SIGKILL}
    return allowed


def error_kind(error: str) -> str:
    """An error line without its numbers and names, to count errors by kind."""
    text = re.sub(r"\d+", "N", error)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", text)
    return text[:90]


def submission_of(proc: Proc) -> dict[str, Any] | None:
    """What a finished submitter reported (run id, created) from its ``--json`` output."""
    if proc.popen.returncode != 0:
        return None
    lines = proc.stdout().strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def count_errors(exits: list[Exit]) -> Counter[str]:
    return Counter(error_kind(e.error) for e in exits if e.error)
