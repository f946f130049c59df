"""One item that asks for a retry in 2 s at its first attempt, dispatched through RQ (issue 24,
item 4): ``rq worker -w workledger.contrib.rq.Worker`` runs it. Configured as ``dispatch_app``
is (``WL_DB``, ``WL_SINK``, ``WL_BROKER_URL``, ``WL_QUEUE``); each attempt is appended to the
sink's ``executions`` with its time."""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

from redis import Redis

from workledger import Item, Ledger, Retry
from workledger.contrib.rq import RQDispatch

DELAY = 2.0


def attempts(sink: str) -> list[float]:
    """When each attempt ran (seconds since the epoch)."""
    with sqlite3.connect(sink) as conn:
        return [float(t) for (t,) in conn.execute("SELECT key FROM executions ORDER BY id")]


def build(env: dict[str, str]) -> Ledger:
    dispatch = RQDispatch(Redis.from_url(env["WL_BROKER_URL"]), env["WL_QUEUE"], lease=2.0,
                          redispatch_after=120.0, app="rq_retry_app:ledger")
    book = Ledger(env["WL_DB"], dispatch=dispatch)
    job = book.job("later")
    job.decompose(lambda payload: [Item(key="only")])

    @job.stage("call", idempotent=True)
    def call(item: Any, ctx: Any) -> Any:
        with sqlite3.connect(env["WL_SINK"], isolation_level=None) as conn:
            conn.execute("INSERT INTO executions (kind, key, pid) VALUES ('call', ?, ?)",
                         (repr(time.time()), os.getpid()))
        if ctx.attempt == 1:
            raise Retry("not yet", delay=DELAY)
        return {"attempt": ctx.attempt}

    return book


if "WL_DB" in os.environ:
    ledger = build(dict(os.environ))
