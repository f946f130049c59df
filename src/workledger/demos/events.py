"""The demo app: one remote response of N events fanned out into one item per event.

Some events are invalid on purpose (every 50th has no timestamp): they become ``skipped`` items
with a reason, never dropped. The ``apply`` stage is idempotent: its effect is written to a
separate SQLite *sink* keyed by ``ctx.idempotency_key``, so a re-run after a crash cannot apply
an effect twice. The sink has two tables:

- ``effects``: one row per applied effect (``INSERT OR IGNORE`` on the idempotency key);
- ``executions``: one row per handler run, append-only, with ``applied`` = 1 when that run
  created the effect and 0 when it found the effect already there.

Environment: ``WORKLEDGER_DEMO_SINK`` (sink path; default next to the SQLite ledger, or
``./workledger-demo-sink.db``) and ``WORKLEDGER_DEMO_DELAY_MS`` (work per item, default 3).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from workledger import Context, Item, ItemView, Ledger, Skip
from workledger.demos.local_db import LocalDb

JOB = "ingest-events"
INVALID_EVERY = 50
_EPOCH = datetime(2026, 11, 30, 9, 0, 0)

ledger = Ledger()
ingest = ledger.job(JOB)


def make_events(n: int) -> list[dict[str, Any]]:
    """The remote response: ``n`` events, the same for the same ``n`` (so the key is stable)."""
    events: list[dict[str, Any]] = []
    for i in range(n):
        event: dict[str, Any] = {"id": f"evt-{i:06d}", "kind": "page_view", "user": i % 97}
        if (i + 1) % INVALID_EVERY:
            event["timestamp"] = (_EPOCH + timedelta(seconds=i)).isoformat() + "Z"
        events.append(event)
    return events


def has_valid_timestamp(event: dict[str, Any]) -> bool:
    stamp = event.get("timestamp")
    if not isinstance(stamp, str):
        return False
    try:
        datetime.fromisoformat(stamp)
    except ValueError:
        return False
    return True


@ingest.decompose
def split(payload: dict[str, Any]) -> Iterator[Item | Skip]:
    for event in payload["events"]:
        if has_valid_timestamp(event):
            yield Item(key=event["id"], data={"id": event["id"]})
        else:
            yield Skip(key=event.get("id"), reason="invalid timestamp")


@ingest.stage("apply", idempotent=True, max_attempts=5)
def apply(item: ItemView, ctx: Context) -> dict[str, str]:
    time.sleep(float(os.environ.get("WORKLEDGER_DEMO_DELAY_MS", "3")) / 1000)
    fresh = sink_for(ledger.url).apply(ctx.idempotency_key, ctx.run_id, str(item.key))
    return {"effect": "applied" if fresh else "already applied"}


# -- the sink: what really happened downstream -----------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    idempotency_key TEXT PRIMARY KEY,
    run_id          INTEGER NOT NULL,
    event_id        TEXT NOT NULL,
    applied_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
CREATE TABLE IF NOT EXISTS executions (
    idempotency_key TEXT NOT NULL,
    run_id          INTEGER NOT NULL,
    applied         INTEGER NOT NULL,
    at              TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
CREATE INDEX IF NOT EXISTS executions_run ON executions (run_id, idempotency_key);
"""


@dataclass(frozen=True)
class SinkCounts:
    executions: int  # handler runs that reached the sink
    effects: int  # distinct effects applied
    repeats: int  # runs that found their effect already applied (deduplicated)
    applied_twice: int  # idempotency keys whose effect was applied by more than one run


def sink_path(url: str) -> Path:
    """``WORKLEDGER_DEMO_SINK``, else ``<ledger stem>-demo-sink.db`` next to a SQLite ledger."""
    given = os.environ.get("WORKLEDGER_DEMO_SINK")
    if given:
        return Path(given)
    if url.lower().startswith("sqlite:///"):
        db = Path(unquote(url[len("sqlite:///"):]))
        return db.with_name(f"{db.stem}-demo-sink.db")
    return Path("workledger-demo-sink.db")


class Sink:
    """The downstream system, as a SQLite file. One connection per thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = LocalDb(self.path, _SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        return self._db.conn()

    def apply(self, key: str, run_id: int, event_id: str) -> bool:
        """Apply the effect for ``key`` once; return False if it was already applied."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            cur = conn.execute("INSERT OR IGNORE INTO effects (idempotency_key, run_id, event_id)"
                               " VALUES (?, ?, ?)", (key, run_id, event_id))
            fresh = cur.rowcount == 1
            conn.execute("INSERT INTO executions (idempotency_key, run_id, applied)"
                         " VALUES (?, ?, ?)", (key, run_id, int(fresh)))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return fresh

    def effects(self, run_id: int) -> int:
        row = self._conn().execute("SELECT count(*) FROM effects WHERE run_id = ?", (run_id,))
        return int(row.fetchone()[0])

    def counts(self, run_id: int) -> SinkCounts:
        conn = self._conn()
        one = conn.execute(
            "SELECT (SELECT count(*) FROM executions WHERE run_id = :r),"
            " (SELECT count(*) FROM effects WHERE run_id = :r),"
            " (SELECT count(*) FROM executions WHERE run_id = :r AND applied = 0),"
            " (SELECT count(*) FROM (SELECT idempotency_key FROM executions WHERE run_id = :r"
            "   GROUP BY idempotency_key HAVING sum(applied) > 1))",
            {"r": run_id}).fetchone()
        return SinkCounts(*one)

    def close(self) -> None:
        self._db.close()


_sinks: dict[Path, Sink] = {}
_sinks_lock = threading.Lock()


def sink_for(url: str) -> Sink:
    path = sink_path(url).resolve()
    with _sinks_lock:
        if path not in _sinks:
            _sinks[path] = Sink(path)
        return _sinks[path]
