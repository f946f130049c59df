"""One stage whose declaration comes from the command line, for lease-expiry crash tests:
``python declared_app.py URL SINK idempotent|verify|plain run|recover``.

The handler writes its effect to the sink (append-only) and returns; a failpoint then kills
the process before the completion commits: the classic "effect happened, not recorded" window.
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

from workledger import Item, Ledger

UNITS = 6


def effects(sink: str) -> list[str]:
    conn = sqlite3.connect(sink, timeout=30)
    try:
        return [r[0] for r in conn.execute("SELECT key FROM effects ORDER BY rowid")]
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def build(url: str, sink: str, declaration: str) -> Ledger:
    ledger = Ledger(url, seed=5)
    job = ledger.job("declared")

    @job.decompose
    def split(payload: dict[str, Any]) -> Any:
        for i in range(payload["units"]):
            yield Item(key=f"u{i}")

    def verify(item: Any, ctx: Any) -> Any:
        return "done" if ctx.idempotency_key in effects(sink) else "not_done"

    @job.stage("send", idempotent=declaration == "idempotent",
               verify=verify if declaration == "verify" else None)
    def send(item: Any, ctx: Any) -> Any:
        conn = sqlite3.connect(sink, timeout=30, isolation_level=None)
        conn.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT)")
        conn.execute("INSERT INTO effects VALUES (?)", (ctx.idempotency_key,))
        conn.close()
        return {"sent": ctx.idempotency_key}

    return ledger


def main() -> None:
    url, sink, declaration, cmd = sys.argv[1:5]
    ledger = build(url, sink, declaration)
    if cmd == "run":
        ledger.job_named("declared").submit({"units": UNITS}, key="declared")
    ledger.work(concurrency=1, chunk=UNITS, lease=0.5, until_idle=True)


if __name__ == "__main__":
    main()
