"""A two-stage job for crash tests, run as a real process: ``python crash_app.py URL SINK CMD``.

Handlers append every execution to ``executions`` (no unique constraint: what really ran) and
their effect to ``effects`` keyed by ``ctx.idempotency_key`` (the deduplicated effect).
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

from workledger import Item, Ledger

UNITS = 40


def record(sink: str, kind: str, key: str) -> None:
    conn = sqlite3.connect(sink, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS executions (kind TEXT, key TEXT)")
    conn.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, kind TEXT)")
    conn.execute("INSERT INTO executions VALUES (?, ?)", (kind, key))
    conn.execute("INSERT OR IGNORE INTO effects VALUES (?, ?)", (key, kind))
    conn.close()


def build(url: str, sink: str) -> Ledger:
    ledger = Ledger(url, seed=3)
    job = ledger.job("crashy", batch_size=10)

    @job.decompose
    def split(payload: dict[str, Any]) -> Any:
        for i in range(payload["units"]):
            yield Item(key=f"u{i}", data={"i": i})

    @job.stage("prepare", idempotent=True)
    def prepare(item: Any, ctx: Any) -> Any:
        record(sink, "prepare", ctx.idempotency_key)
        return {"prepared": item.key}

    @job.stage("apply", idempotent=True, after="prepare")
    def apply(item: Any, ctx: Any) -> Any:
        record(sink, "apply", ctx.idempotency_key)
        return {"applied": item.key}

    @job.on_complete
    def close(status: Any) -> None:
        record(sink, "close", f"close/{status.run_id}")

    return ledger


def main() -> None:
    url, sink, cmd = sys.argv[1:4]
    ledger = build(url, sink)
    if cmd == "run":
        ledger.job_named("crashy").submit({"units": UNITS}, key="crash")
        ledger.work(concurrency=2, chunk=7, lease=1.0, until_idle=True)
    elif cmd == "recover":
        ledger.sweeper(grace=0.0, lease=1.0).sweep()
        ledger.work(concurrency=2, chunk=7, lease=1.0, until_idle=True)
    elif cmd == "reconcile":
        for run in ledger.runs():
            ledger.reconcile(run.run_id)
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
