"""A FastAPI service on workledger: an endpoint records a run of notifications, ``async def``
handlers send them from ``workledger worker``, another endpoint says how far along it is.

``uvicorn service:app`` serves it; ``workledger --app service:ledger worker`` runs the
handlers (see README.md). Configured from the environment:

- ``WORKLEDGER_DB``: the ledger (default ``sqlite:///service.db`` in this folder);
- ``NOTIFY_SENT``: the file each notification is appended to, standing in for the remote
  service the handler would call (default ``sent.txt``); ``NOTIFY_SLOW``: seconds each send
  takes (default 0.01).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import FastAPI, Header, HTTPException, Response

from workledger import AsyncLedger, Item, Ledger, PayloadMismatch, Skip, UnknownRun

ledger = Ledger(os.environ.get("WORKLEDGER_DB", "sqlite:///service.db"))
notify = ledger.job("notify")
SENT = os.environ.get("NOTIFY_SENT", "sent.txt")
SLOW = float(os.environ.get("NOTIFY_SLOW", "0.01"))


@notify.decompose
def recipients(payload: dict[str, Any]) -> Any:
    for user in payload["users"]:
        if "@" in user:
            yield Item(key=user)
        else:
            yield Skip(key=user, reason="not an e-mail address")


@notify.stage("send", idempotent=True, max_attempts=5)
async def send(item: Any, ctx: Any) -> dict[str, str]:
    await asyncio.sleep(SLOW)  # the remote call; it deduplicates by ctx.idempotency_key
    with open(SENT, "a") as f:
        f.write(f"{ctx.idempotency_key} {item.key}\n")
    return {"sent": ctx.idempotency_key}


app = FastAPI(title="notifications")
runs = AsyncLedger(ledger)


@app.post("/notifications", status_code=201)
async def submit(body: dict[str, Any], response: Response,
                 idempotency_key: str | None = Header(default=None)) -> dict[str, Any]:
    """Record a run of one notification per user; the same key again returns that run."""
    if not isinstance(body.get("users"), list):
        raise HTTPException(400, "give {\"users\": [...]}")
    try:
        sub = await runs.submit("notify", {"users": body["users"]}, key=idempotency_key)
    except PayloadMismatch as exc:
        raise HTTPException(409, str(exc)) from None
    if not sub.created:
        response.status_code = 200
    return {"run": sub.run_id, "created": sub.created, "state": sub.state}


@app.get("/notifications/{run_id}")
async def progress(run_id: int) -> dict[str, Any]:
    """The run's real state and counts, derived from its items."""
    try:
        st = await runs.status(run_id)
    except UnknownRun:
        raise HTTPException(404, f"no run {run_id}") from None
    return {"run": st.run_id, "state": st.state, "total": st.total,
            "processed": st.processed, "skipped": st.skipped, "failed": st.failed,
            "next": st.next}
