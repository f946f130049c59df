"""``AsyncLedger``: the facade for async code (a FastAPI endpoint, an aiohttp handler).

A thin wrapper over the sync :class:`~workledger.Ledger`, not a second copy of it: every
method runs the sync one in a thread (``asyncio.to_thread``), so the event loop never waits on
the database, and checks, errors and results are exactly the sync facade's.

>>> ledger = AsyncLedger(Ledger("postgresql://app@db/app"))   # doctest: +SKIP
>>> @app.post("/imports")                                      # doctest: +SKIP
... async def start(body: dict) -> dict:
...     sub = await ledger.submit("ingest-events", body, key=body["id"])
...     return {"run": sub.run_id, "state": sub.state}
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from workledger.api import (
    Finding,
    History,
    ItemRow,
    Ledger,
    RunsPage,
    RunStatus,
    Submission,
    SweepReport,
)
from workledger.jobs import Job
from workledger.storage.port import EventRow, Reconciled

P = ParamSpec("P")
T = TypeVar("T")


class AsyncLedger:
    """The async face of a :class:`~workledger.Ledger` (given, or opened from ``url``).

    Job definitions stay on the sync ledger (``job``, ``ledger``); a worker is a process of
    its own (``workledger worker``), not a coroutine. Submitting inside the caller's
    transaction takes a sync connection: call the sync ``Ledger.submit(..., conn=...)``.
    """

    def __init__(self, ledger: Ledger | str | None = None) -> None:
        self.ledger = ledger if isinstance(ledger, Ledger) else Ledger(ledger)

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    def job(self, name: str, **options: Any) -> Job:
        """Define (or fetch) a job on the sync ledger: no I/O, nothing to await."""
        return self.ledger.job(name, **options)

    async def init(self) -> list[int]:
        return await self._call(self.ledger.init)

    async def aclose(self) -> None:
        await self._call(self.ledger.close)

    async def __aenter__(self) -> AsyncLedger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- submitting and reading --------------------------------------------------------------

    async def submit(self, job_name: str, payload: Any, key: str | None = None, *,
                     deadline: Any = None, priority: int = 0,
                     tenant: str | None = None) -> Submission:
        """Record a run, decompose it, and return its real state (``Ledger.submit``)."""
        return await self._call(self.ledger.submit, job_name, payload, key, deadline=deadline,
                                priority=priority, tenant=tenant)

    async def set_priority(self, run_id: int, priority: int, *, note: str | None = None,
                           actor: str = "operator") -> bool:
        """Change an open run's priority (``Ledger.set_priority``)."""
        return await self._call(self.ledger.set_priority, run_id, priority, note=note,
                                actor=actor)

    async def set_tenant_weight(self, tenant: str, weight: int, *, note: str | None = None,
                                actor: str = "operator") -> bool:
        """Give a tenant its share of the claims (``Ledger.set_tenant_weight``)."""
        return await self._call(self.ledger.set_tenant_weight, tenant, weight, note=note,
                                actor=actor)

    async def status(self, run_id: int) -> RunStatus:
        return await self._call(self.ledger.status, run_id)

    async def runs(self, limit: int = 100, *, before: int | None = None,
                   tenant: str | None = None) -> list[RunStatus]:
        return await self._call(self.ledger.runs, limit, before=before, tenant=tenant)

    async def runs_page(self, *, job: str | None = None, state: str | None = None,
                        limit: int = 100, after: int | None = None) -> RunsPage:
        return await self._call(self.ledger.runs_page, job=job, state=state, limit=limit,
                                after=after)

    async def count_runs(self, *, before: int | None = None) -> int:
        return await self._call(self.ledger.count_runs, before=before)

    async def items(self, run_id: int, *, stage: str | None = None, state: str | None = None,
                    limit: int = 1000, after_id: int = 0) -> list[ItemRow]:
        return await self._call(self.ledger.items, run_id, stage=stage, state=state,
                                limit=limit, after_id=after_id)

    async def count_items(self, run_id: int, *, stage: str | None = None,
                          state: str | None = None, after_id: int = 0) -> int:
        return await self._call(self.ledger.count_items, run_id, stage=stage, state=state,
                                after_id=after_id)

    async def item(self, run_id: int, stage: str, seq: int) -> ItemRow | None:
        return await self._call(self.ledger.item, run_id, stage, seq)

    async def events(self, run_id: int, item_id: int | None = None) -> list[EventRow]:
        return await self._call(self.ledger.events, run_id, item_id)

    async def history(self, run_id: int, stage: str, seq: int) -> History:
        return await self._call(self.ledger.history, run_id, stage, seq)

    async def audit(self, *, run_id: int | None = None, job: str | None = None,
                    since: str | None = None) -> list[Finding]:
        return await self._call(self.ledger.audit, run_id=run_id, job=job, since=since)

    # -- the operator's calls ----------------------------------------------------------------

    async def retry(self, run_id: int, *, stage: str | None = None,
                    seqs: Sequence[int] | None = None, note: str | None = None,
                    actor: str = "operator") -> int:
        return await self._call(self.ledger.retry, run_id, stage=stage, seqs=seqs, note=note,
                                actor=actor)

    async def resolve(self, run_id: int, stage: str, seq: int, as_state: str, *,
                      note: str | None = None, actor: str = "operator") -> bool:
        return await self._call(self.ledger.resolve, run_id, stage, seq, as_state, note=note,
                                actor=actor)

    async def resolve_many(self, run_id: int, stage: str, as_state: str, *,
                           seqs: Sequence[int] | None = None, note: str | None = None,
                           actor: str = "operator") -> tuple[int, int]:
        return await self._call(self.ledger.resolve_many, run_id, stage, as_state, seqs=seqs,
                                note=note, actor=actor)

    async def ack(self, run_id: int, *, note: str, stage: str | None = None,
                  seq: int | None = None, actor: str = "operator") -> int:
        return await self._call(self.ledger.ack, run_id, note=note, stage=stage, seq=seq,
                                actor=actor)

    async def pause(self, run_id: int, *, note: str | None = None,
                    actor: str = "operator") -> bool:
        return await self._call(self.ledger.pause, run_id, note=note, actor=actor)

    async def resume(self, run_id: int, *, note: str | None = None,
                     actor: str = "operator") -> bool:
        return await self._call(self.ledger.resume, run_id, note=note, actor=actor)

    async def cancel(self, run_id: int, *, note: str | None = None,
                     actor: str = "operator") -> int:
        return await self._call(self.ledger.cancel, run_id, note=note, actor=actor)

    async def reconcile(self, run_id: int, *, dry_run: bool = False,
                        actor: str = "operator") -> Reconciled:
        return await self._call(self.ledger.reconcile, run_id, dry_run=dry_run, actor=actor)

    async def sweep(self, *, grace: float = 30.0, lease: float = 30.0) -> SweepReport:
        return await self._call(self.ledger.sweep, grace=grace, lease=lease)
