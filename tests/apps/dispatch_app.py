"""An app dispatched through a real broker, for the Celery and RQ tests.

Imported by ``celery -A dispatch_app worker`` and by ``rq worker`` work horses (the tests put
this folder on ``PYTHONPATH``); configured from the environment:

- ``WL_DB``: the ledger's URL; ``WL_SINK``: the effects sink (a SQLite file);
- ``WL_BROKER``: ``celery-amqp``, ``celery-redis`` or ``rq``; ``WL_BROKER_URL``: its URL;
  ``WL_QUEUE``: the queue; ``WL_PREFIX``: a Redis key prefix for Celery on Redis;
- ``WL_LEASE``, ``WL_AFTER`` (redispatch_after), ``WL_CHUNK``: short, so tests settle fast;
- ``WL_TWICE=1``: every message is published twice to the real broker;
- ``WL_SLOW``: seconds each ``apply`` handler takes.

Job ``batch``: payload ``{"units": N}`` becomes N items. Stage ``prepare`` is idempotent: its
effect is keyed by ``ctx.idempotency_key`` in ``effects`` (deduplicated) and every execution is
appended to ``executions`` (no unique constraint: what really ran). One unit in 50 asks for a
retry at its first attempt (a backoff the broker holds). Stage ``apply`` is not idempotent: it
only appends to ``executions``, so a second execution of one item would show. Job ``calls``
has one ``async def`` stage, ``call``. Job ``paced`` has one stage, ``call``, held to 20 claims
a second (``rate_limit="20/s"``, a burst of 5) with full history, so each claim is an event.
Job ``trickle`` has one stage, ``call``, held to 10 claims a second with the default burst of 1
(``rate_limit="10/s"``), with full history: most of its items are held back by the bucket.
Job ``accounts`` has one stage, ``post``, with at most one item per concurrency key (account)
claimed at once (``max_per_key=1``); each execution appends its account and its start and end
(wall clock) to ``spans``, so a test sees whether two of one account ever overlapped.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from workledger import Item, Ledger, Retry
from workledger._runtime.broker.dispatch import Message

JOB = "batch"


def record(sink: str, kind: str, key: str) -> None:
    conn = sqlite3.connect(sink, timeout=60, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout=60000")
        conn.execute("INSERT INTO executions (kind, key, pid) VALUES (?, ?, ?)",
                     (kind, key, os.getpid()))
        if kind == "prepare":
            conn.execute("INSERT OR IGNORE INTO effects (key) VALUES (?)", (key,))
    finally:
        conn.close()


def create_sink(sink: str) -> None:
    conn = sqlite3.connect(sink, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS executions "
                 "(id INTEGER PRIMARY KEY, kind TEXT, key TEXT, pid INTEGER)")
    conn.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY)")
    conn.execute("CREATE TABLE IF NOT EXISTS spans (account TEXT, start REAL, end REAL)")
    conn.close()


def record_span(sink: str, account: str, start: float, end: float) -> None:
    conn = sqlite3.connect(sink, timeout=60, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout=60000")
        conn.execute("INSERT INTO spans VALUES (?, ?, ?)", (account, start, end))
    finally:
        conn.close()


def dispatch_from(env: dict[str, str]) -> Any:
    kind, url, queue = env["WL_BROKER"], env["WL_BROKER_URL"], env["WL_QUEUE"]
    options: dict[str, Any] = {"lease": float(env.get("WL_LEASE", "2")),
                               "redispatch_after": float(env.get("WL_AFTER", "3")),
                               "chunk": int(env.get("WL_CHUNK", "50")),
                               "app": "dispatch_app:ledger"}
    if kind == "rq":
        from redis import Redis

        from workledger.contrib.rq import RQDispatch

        cls: Any = RQDispatch
        target: Any = Redis.from_url(url)
    else:
        from celery import Celery

        from workledger.contrib.celery import CeleryDispatch

        cls = CeleryDispatch
        target = Celery("dispatch_app", broker=url)
        target.conf.broker_connection_retry_on_startup = True
        target.conf.worker_prefetch_multiplier = 1
        target.conf.worker_hijack_root_logger = False
        target.conf.task_default_queue = queue  # never consume the shared default "celery"
        if kind == "celery-redis":
            target.conf.broker_transport_options = {"global_keyprefix": env["WL_PREFIX"]}
    if env.get("WL_TWICE") == "1":
        cls = type(f"Twice{cls.__name__}", (cls,), {"publish": _twice})
    return cls(target, queue, **options)


def _twice(self: Any, messages: Sequence[Message]) -> None:
    """Every message published twice to the real broker: the ledger must run nothing twice."""
    type(self).__mro__[1].publish(self, messages)
    type(self).__mro__[1].publish(self, messages)


def build(env: dict[str, str]) -> Ledger:
    sink, slow = env["WL_SINK"], float(env.get("WL_SLOW", "0"))
    book = Ledger(env["WL_DB"], dispatch=dispatch_from(env))
    job = book.job(JOB)

    @job.decompose
    def split(payload: dict[str, Any]) -> Any:
        for i in range(int(payload["units"])):
            yield Item(key=f"u{i}", data={"retry": i % 50 == 7})

    @job.stage("prepare", idempotent=True, base_delay=0.5, max_delay=1.0)
    def prepare(item: Any, ctx: Any) -> Any:
        record(sink, "prepare", ctx.idempotency_key)
        if item.data["retry"] and ctx.attempt == 1:
            raise Retry("asked for a retry once")
        return {"prepared": item.key}

    @job.stage("apply", after="prepare")
    def apply(item: Any, ctx: Any) -> Any:
        if slow:
            time.sleep(slow)
        record(sink, "apply", ctx.idempotency_key)
        return {"applied": item.key}

    calls = book.job("calls")  # an async stage: run on the task process's event loop

    @calls.decompose
    def split_calls(payload: dict[str, Any]) -> Any:
        for i in range(int(payload["units"])):
            yield Item(key=f"c{i}")

    @calls.stage("call", idempotent=True)
    async def call(item: Any, ctx: Any) -> Any:
        await asyncio.sleep(0.001)
        record(sink, "call", ctx.idempotency_key)
        return {"called": item.key}

    paced = book.job("paced", full_history=True)  # a limited stage through the broker

    @paced.decompose
    def split_paced(payload: dict[str, Any]) -> Any:
        for i in range(int(payload["units"])):
            yield Item(key=f"p{i}")

    @paced.stage("call", idempotent=True, rate_limit="20/s", burst=5)
    def paced_call(item: Any, ctx: Any) -> Any:
        record(sink, "paced", ctx.idempotency_key)
        return None

    trickle = book.job("trickle", full_history=True)  # mostly held back by its bucket

    @trickle.decompose
    def split_trickle(payload: dict[str, Any]) -> Any:
        for i in range(int(payload["units"])):
            yield Item(key=f"t{i}")

    @trickle.stage("call", idempotent=True, rate_limit="10/s")
    def trickle_call(item: Any, ctx: Any) -> Any:
        record(sink, "trickle", ctx.idempotency_key)
        return None

    accounts = book.job("accounts")  # one posting at a time per account, through the broker

    @accounts.decompose
    def split_accounts(payload: dict[str, Any]) -> Any:
        for i in range(int(payload["units"])):
            yield Item(key=f"a{i}", data={"account": f"acct-{i % 3}"},
                       concurrency_key=f"acct-{i % 3}")

    @accounts.stage("post", idempotent=True, max_per_key=1)
    def post(item: Any, ctx: Any) -> Any:
        start = time.time()
        time.sleep(0.02)
        record_span(sink, item.data["account"], start, time.time())
        return None

    return book


celery_app: Any = None
if "WL_DB" in os.environ:
    ledger = build(dict(os.environ))
    celery_app = getattr(ledger.dispatch, "celery", None)
