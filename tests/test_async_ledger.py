"""``AsyncLedger``: the sync facade's calls from a running event loop, in threads, so the loop
is never held by the database (docs/design.md, "Async callers")."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from workledger import AsyncLedger, Item, Ledger, Permanent
from workledger.errors import PayloadMismatch, UnknownJob, UnknownRun

pytestmark = pytest.mark.integration


def make_ledger(url: str, gate: threading.Event | None = None) -> Ledger:
    ledger = Ledger(url)
    job = ledger.job("ingest")

    @job.decompose
    def split(payload: dict[str, Any]) -> Iterator[Item]:
        if gate is not None:  # held until the event loop, still running, opens it
            assert gate.wait(timeout=30), "the event loop was blocked by the submit"
        for n in range(payload["units"]):
            yield Item(key=f"e{n}")

    @job.stage("apply", idempotent=True, max_attempts=1)
    def apply(item: Any, ctx: Any) -> Any:
        if item.key == "e1":
            raise Permanent("no such account")
        return {"ok": item.key}

    return ledger


def test_async_calls_answer_as_the_sync_facade_does(db_url: str) -> None:
    async def main() -> None:
        async with AsyncLedger(make_ledger(db_url)) as ledger:
            sub = await ledger.submit("ingest", {"units": 3}, key="day-1")
            assert (sub.created, sub.state, sub.status.total) == (True, "running", 3)
            assert (await ledger.submit("ingest", {"units": 3}, key="day-1")).created is False
            with pytest.raises(PayloadMismatch):
                await ledger.submit("ingest", {"units": 4}, key="day-1")
            with pytest.raises(UnknownJob):
                await ledger.submit("nope", {})
            with pytest.raises(UnknownRun):
                await ledger.status(999)
            assert await ledger.pause(sub.run_id) is True
            assert (await ledger.status(sub.run_id)).state == "paused"
            assert await ledger.resume(sub.run_id) is True
            await asyncio.to_thread(ledger.ledger.work)  # a worker: sync, a process of its own
            done = await ledger.status(sub.run_id)
            assert (done.state, done.processed, done.failed) == ("failed", 2, 1)
            assert [s.run_id for s in await ledger.runs()] == [sub.run_id]
            assert (await ledger.runs_page(state="failed")).runs[0].run_id == sub.run_id
            assert await ledger.count_runs() == 1
            assert [i.key for i in await ledger.items(sub.run_id, state="failed")] == ["e1"]
            assert await ledger.count_items(sub.run_id) == 3
            item = await ledger.item(sub.run_id, "apply", 1)
            assert item is not None and item.error == "no such account"
            assert [f.kind for f in await ledger.audit(run_id=sub.run_id)] == ["failed"]
            assert await ledger.ack(sub.run_id, note="looked at it") == 1
            assert (await ledger.history(sub.run_id, "apply", 1)).item.state == "failed"
            assert "submitted" in [e.kind for e in await ledger.events(sub.run_id)]
            assert await ledger.retry(sub.run_id) == 1
            assert (await ledger.status(sub.run_id)).state == "running"
            assert (await ledger.reconcile(sub.run_id, dry_run=True)).repaired is False
            assert await ledger.cancel(sub.run_id, note="enough") == 1
            assert (await ledger.status(sub.run_id)).state == "cancelled"
            assert (await ledger.sweep(grace=0.0)).redecomposed == 0
            assert await ledger.init() == []

    asyncio.run(main())


def test_the_event_loop_runs_on_while_a_submit_is_in_the_database(db_url: str) -> None:
    """The decomposer, inside the submit, waits for a coroutine to let it go: that can only
    happen if the loop kept running while the submit was in progress."""
    gate = threading.Event()

    async def main() -> None:
        ledger = AsyncLedger(make_ledger(db_url, gate))
        try:
            submitting = asyncio.ensure_future(ledger.submit("ingest", {"units": 2}))
            await asyncio.sleep(0)  # the submit is on its way, in its thread
            gate.set()
            sub = await submitting
            assert (sub.created, sub.status.total) == (True, 2)
        finally:
            await ledger.aclose()

    asyncio.run(main())


def test_a_fastapi_endpoint_submits_and_reads_through_the_async_facade(db_url: str) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    ledger = AsyncLedger(make_ledger(db_url))
    app = FastAPI()

    @app.post("/imports/{day}")
    async def start(day: str) -> dict[str, Any]:
        sub = await ledger.submit("ingest", {"units": 2}, key=day)
        return {"run": sub.run_id, "created": sub.created, "state": sub.state}

    @app.get("/runs/{run_id}")
    async def read(run_id: int) -> dict[str, Any]:
        return (await ledger.status(run_id)).to_dict()

    try:
        with TestClient(app) as client:
            first = client.post("/imports/d1").json()
            again = client.post("/imports/d1").json()
            assert (first["created"], again["created"], again["run"]) == (True, False,
                                                                          first["run"])
            assert client.get(f"/runs/{first['run']}").json()["total"] == 2
    finally:
        ledger.ledger.close()
