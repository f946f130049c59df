"""The concurrency tests' app, effects sink and worker-process driver.

Run as a script, this file is one worker process::

    python tests/concurrency/procs.py --url URL --sink SINK.db [--concurrency 2] [--chunk 25] ...

It builds the test app with :func:`build_ledger`, optionally waits for a start barrier, calls
``ledger.work(...)`` and prints the :class:`WorkReport` as one JSON line on stdout.

The **effects sink** is a separate SQLite file (WAL, busy timeout) used by both backends. Its
``effects`` table is append-only with no unique constraint: one row per execution that reached
the handler, so a test sees what really happened, not what the ledger believes. The
``effects_dedup`` table is the idempotent effect, keyed by ``ctx.idempotency_key``
(``INSERT ... ON CONFLICT DO NOTHING``).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

JOB = "conc"
STAGE = "apply"

_SINK_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT    NOT NULL,
    run_id          INTEGER NOT NULL,
    seq             INTEGER NOT NULL,
    item_key        TEXT,
    lease_token     INTEGER NOT NULL,
    attempt         INTEGER NOT NULL,
    pid             INTEGER NOT NULL,
    at              REAL    NOT NULL
);
CREATE TABLE IF NOT EXISTS effects_dedup (
    idempotency_key TEXT PRIMARY KEY,
    pid             INTEGER NOT NULL,
    lease_token     INTEGER NOT NULL,
    at              REAL    NOT NULL
);
"""


# -- the sink ------------------------------------------------------------------------------------


def _connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=60.0, isolation_level=None,
                           check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=60000")
    conn.execute("PRAGMA journal_mode=WAL")
    # a killed process loses nothing it committed in WAL mode; only power loss would
    conn.execute("PRAGMA synchronous=OFF")
    conn.row_factory = sqlite3.Row
    return conn


def sink_init(path: str | os.PathLike[str]) -> None:
    conn = _connect(path)
    try:
        conn.executescript(_SINK_SCHEMA)
    finally:
        conn.close()


class Sink:
    """Thread-safe writer: one connection per handler thread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = _connect(self.path)
        return conn

    def record(self, item: Any, ctx: Any) -> None:
        """Append the raw effect and the deduplicated one, in one transaction."""
        conn = self._conn()
        now = time.time()
        pid = os.getpid()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "INSERT INTO effects (idempotency_key, run_id, seq, item_key, lease_token,"
                " attempt, pid, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (ctx.idempotency_key, ctx.run_id, item.seq, item.key, ctx.lease_token,
                 ctx.attempt, pid, now))
            conn.execute(
                "INSERT INTO effects_dedup (idempotency_key, pid, lease_token, at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING",
                (ctx.idempotency_key, pid, ctx.lease_token, now))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def sink_effects(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    conn = _connect(path)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM effects ORDER BY id")]
    finally:
        conn.close()


def sink_dedup(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    conn = _connect(path)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM effects_dedup ORDER BY at")]
    finally:
        conn.close()


def sink_count(path: str | os.PathLike[str]) -> int:
    conn = _connect(path)
    try:
        return int(conn.execute("SELECT count(*) FROM effects").fetchone()[0])
    finally:
        conn.close()


# -- the app ---------------------------------------------------------------------------------------


def build_ledger(
    url: str,
    sink: str | os.PathLike[str],
    *,
    sleep: float = 0.0,
    block: float = 0.0,
    poison_key: str | None = None,
    crash_once_key: str | None = None,
    crash_marker: str | os.PathLike[str] | None = None,
    max_attempts: int = 5,
    idempotent: bool = True,
    hang_key: str | None = None,
    hang_for: float = 3600.0,
    timeout: float | None = None,
    retry_delay: float | None = None,
) -> Any:
    """A Ledger on ``url`` with job ``conc``: payload ``{"n": N}`` becomes items ``k0..k{N-1}``.

    Its one stage ``apply`` is idempotent (unless ``idempotent=False``). The handler

    - exits the process with 137 *before any effect* when it reaches ``crash_once_key`` and
      the file ``crash_marker`` does not exist yet (it creates it first: a crash that happens once);
    - appends the effect to ``sink``;
    - exits the process with 137 if ``item.key == poison_key`` (every time: a poison item);
    - hangs ``hang_for`` seconds after its effect if its key is one of ``hang_key``
      (comma-separated);
    - sleeps ``sleep + block`` seconds and returns ``{"pid", "token", "attempt"}``.
    """
    from workledger import Item, Ledger

    ledger = Ledger(url)
    writer = Sink(sink)
    job = ledger.job(JOB)

    @job.decompose
    def split(payload: dict[str, Any]) -> Any:
        for i in range(int(payload["n"])):
            yield Item(key=f"k{i}", data={"i": i})

    @job.stage(STAGE, idempotent=idempotent, max_attempts=max_attempts, timeout=timeout)
    def apply(item: Any, ctx: Any) -> dict[str, Any]:
        if retry_delay is not None and item.key == "k0":
            from workledger import Retry

            raise Retry("downstream asks to wait", delay=retry_delay)
        if hang_key is not None and item.key in hang_key.split(","):
            writer.record(item, ctx)
            time.sleep(hang_for)  # a handler that hangs: only its time limit ends it
        if crash_once_key is not None and item.key == crash_once_key:
            assert crash_marker is not None, "crash_once_key needs crash_marker"
            marker = Path(crash_marker)
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                os._exit(137)
        writer.record(item, ctx)
        if poison_key is not None and item.key == poison_key:
            os._exit(137)
        if sleep or block:
            time.sleep(sleep + block)
        return {"pid": os.getpid(), "token": ctx.lease_token, "attempt": ctx.attempt}

    return ledger


# -- the worker process ---------------------------------------------------------------------------


def worker_command(
    url: str,
    sink: str | os.PathLike[str],
    *,
    concurrency: int = 2,
    chunk: int = 25,
    lease: float = 30.0,
    sleep: float = 0.0,
    block: float = 0.0,
    poison_key: str | None = None,
    crash_once_key: str | None = None,
    crash_marker: str | os.PathLike[str] | None = None,
    max_attempts: int = 5,
    until_idle: bool = True,
    ready_file: str | os.PathLike[str] | None = None,
    go_file: str | os.PathLike[str] | None = None,
    idempotent: bool = True,
    hang_key: str | None = None,
    hang_for: float = 3600.0,
    timeout: float | None = None,
    retry_delay: float | None = None,
) -> list[str]:
    """The argv of one worker process running this file."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--url", url, "--sink", str(sink),
            "--concurrency", str(concurrency), "--chunk", str(chunk), "--lease", str(lease),
            "--sleep", str(sleep), "--block", str(block), "--max-attempts", str(max_attempts)]
    if poison_key is not None:
        argv += ["--poison", poison_key]
    if crash_once_key is not None:
        argv += ["--crash-once", crash_once_key, "--crash-marker", str(crash_marker)]
    if not until_idle:
        argv.append("--forever")
    if not idempotent:
        argv.append("--not-idempotent")
    if hang_key is not None:
        argv += ["--hang", hang_key, "--hang-for", str(hang_for)]
    if timeout is not None:
        argv += ["--timeout", str(timeout)]
    if retry_delay is not None:
        argv += ["--retry-delay", str(retry_delay)]
    if ready_file is not None:
        argv += ["--ready-file", str(ready_file)]
    if go_file is not None:
        argv += ["--go-file", str(go_file)]
    return argv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--sink", required=True)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--chunk", type=int, default=25)
    p.add_argument("--lease", type=float, default=30.0)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--block", type=float, default=0.0)
    p.add_argument("--poison", default=None)
    p.add_argument("--crash-once", default=None)
    p.add_argument("--crash-marker", default=None)
    p.add_argument("--max-attempts", type=int, default=5)
    p.add_argument("--forever", action="store_true")
    p.add_argument("--ready-file", default=None)
    p.add_argument("--go-file", default=None)
    p.add_argument("--not-idempotent", action="store_true")
    p.add_argument("--hang", default=None)
    p.add_argument("--hang-for", type=float, default=3600.0)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--retry-delay", type=float, default=None)
    a = p.parse_args(argv)

    ledger = build_ledger(a.url, a.sink, sleep=a.sleep, block=a.block, poison_key=a.poison,
                          crash_once_key=a.crash_once, crash_marker=a.crash_marker,
                          max_attempts=a.max_attempts, idempotent=not a.not_idempotent,
                          hang_key=a.hang, hang_for=a.hang_for, timeout=a.timeout,
                          retry_delay=a.retry_delay)
    ledger.store  # noqa: B018 - open (and migrate) the database before the start barrier
    if a.ready_file:
        Path(a.ready_file).write_text(str(os.getpid()))
    if a.go_file:
        deadline = time.monotonic() + 60.0
        while not Path(a.go_file).exists():
            if time.monotonic() > deadline:
                print("start barrier never opened", file=sys.stderr)
                return 3
            time.sleep(0.005)
    report = ledger.work(concurrency=a.concurrency, chunk=a.chunk, lease=a.lease,
                         until_idle=not a.forever, db_retry_for=120.0)
    ledger.close()
    print(json.dumps({"pid": os.getpid(), **asdict(report)}), flush=True)
    return 3 if report.stuck else 0


if __name__ == "__main__":
    sys.exit(main())
