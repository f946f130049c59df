"""An app of ``async def`` handlers: ``--app async_app:ledger`` (or :func:`build` in-process).

Every job takes a payload ``{"n": N, ...}`` that becomes items ``k0..k{N-1}``; each item's
data carries the payload's other keys and ``i``, and ``kind`` from ``payload["kinds"][str(i)]``
(default ``"ok"``). ``log``: a file each execution appends a line to (``start <key> <attempt>
<pid>``, and ``cancelled <key> <attempt>`` when a coroutine sees its cancellation).

- ``outcomes`` (idempotent): ``kind`` ok -> a result; none -> None; retry -> ``Retry`` at the
  first attempt; permanent -> ``Permanent``; skip -> ``Skip``; raise -> ``ValueError`` at the
  first attempt (retried).
- ``mail`` (idempotent, ``batch=10``): one entry per item: ``Permanent`` for kind bad, ``Retry``
  (first attempt) for busy, ``Skip`` for gone, a result otherwise; kind raise (on the first
  item) raises for the whole call at the first attempt. Its closing hook is async.
- ``waits`` (idempotent) and ``waits_once`` (not idempotent): ``await asyncio.sleep(wait)``;
  :data:`FLIGHT` keeps how many run at once, and the peak.
- ``slow_retry`` (idempotent, 2 attempts), ``slow_verify`` (an async verify hook that answers
  done) and ``slow_doubt`` (neither), each with ``timeout=limit``: kind hang waits a minute
  (at the first attempt only for ``slow_retry``) and logs its cancellation.
- ``stubborn`` (``timeout=limit``): ignores its cancellation until ``hold`` seconds passed.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

from workledger import BatchContext, Context, Item, ItemView, Ledger, Permanent, Retry, Skip

FLIGHT = {"now": 0, "peak": 0}
CLOSED: list[int] = []


def note(data: dict[str, Any], line: str) -> None:
    if data.get("log"):
        fd = os.open(data["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())  # one write: lines never interleave
        finally:
            os.close(fd)


def split(payload: dict[str, Any]) -> Iterator[Item]:
    extra = {k: v for k, v in payload.items() if k not in ("n", "kinds")}
    kinds = payload.get("kinds", {})
    for i in range(int(payload["n"])):
        yield Item(key=f"k{i}", data={**extra, "i": i, "kind": kinds.get(str(i), "ok")})


async def outcome(item: ItemView, ctx: Context) -> Any:
    await asyncio.sleep(0)
    kind = item.data["kind"]
    if kind == "retry" and ctx.attempt == 1:
        raise Retry("busy, try later", delay=0.01)
    if kind == "permanent":
        raise Permanent("no such account")
    if kind == "skip":
        raise Skip("nothing to do")
    if kind == "raise" and ctx.attempt == 1:
        raise ValueError("bad row")
    if kind == "none":
        return None
    return {"i": item.data["i"], "attempt": ctx.attempt}


async def send(items: list[ItemView], ctx: BatchContext) -> list[Any]:
    await asyncio.sleep(0.01)
    if items[0].data["kind"] == "raise" and ctx.attempts[0] == 1:
        raise ConnectionError("the mail server hung up")
    out: list[Any] = []
    for item, attempt in zip(items, ctx.attempts, strict=True):
        kind = item.data["kind"]
        if kind == "bad":
            out.append(Permanent("550 no such mailbox"))
        elif kind == "busy" and attempt == 1:
            out.append(Retry("451 try again later", delay=0.01))
        elif kind == "gone":
            out.append(Skip("unsubscribed"))
        else:
            out.append({"sent": item.seq, "attempt": attempt})
    return out


async def closed(status: Any) -> None:
    await asyncio.sleep(0)
    CLOSED.append(status.run_id)


async def wait(item: ItemView, ctx: Context) -> dict[str, Any]:
    note(item.data, f"start {item.key} {ctx.attempt} {os.getpid()}")
    FLIGHT["now"] += 1  # one loop: no lock needed
    FLIGHT["peak"] = max(FLIGHT["peak"], FLIGHT["now"])
    try:
        await asyncio.sleep(float(item.data["wait"]))
    finally:
        FLIGHT["now"] -= 1
    return {"attempt": ctx.attempt}


def hangs(retry_only_once: bool) -> Any:
    async def slow(item: ItemView, ctx: Context) -> str:
        if item.data["kind"] == "hang" and not (retry_only_once and ctx.attempt > 1):
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                note(item.data, f"cancelled {item.key} {ctx.attempt}")
                raise
        return "quick"

    return slow


async def answer_done(item: ItemView, ctx: Context) -> str:
    await asyncio.sleep(0)
    return "done"


async def stubborn(item: ItemView, ctx: Context) -> str:
    until = time.monotonic() + float(item.data["hold"])
    while (left := until - time.monotonic()) > 0:
        try:
            await asyncio.sleep(left)
        except asyncio.CancelledError:
            note(item.data, f"ignored {item.key} {ctx.attempt}")
    return "late"


def build(url: str | None = None, limit: float = 0.3) -> Ledger:
    ledger = Ledger(url)
    for name, stage, options in (
        ("outcomes", outcome, {"idempotent": True}),
        ("mail", send, {"idempotent": True, "batch": 10}),
        ("waits", wait, {"idempotent": True}),
        ("waits_once", wait, {}),
        ("slow_retry", hangs(True), {"idempotent": True, "max_attempts": 2, "timeout": limit}),
        ("slow_verify", hangs(False), {"verify": answer_done, "timeout": limit}),
        ("slow_doubt", hangs(False), {"timeout": limit}),
        ("stubborn", stubborn, {"idempotent": True, "max_attempts": 1, "timeout": limit}),
    ):
        job = ledger.job(name)
        job.decompose(split)
        job.stage("go", base_delay=0.01, **options)(stage)
    ledger.job_named("mail").on_complete(closed)
    return ledger


ledger = build()
