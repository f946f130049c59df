"""The real side of the model-based test: a store on one backend, the runtime's own pieces over
it (``to_finish``, the sweeper's reclaim, verify and closing passes, the operator's actions),
and a way to read everything back in the model's terms.

The jobs here are the model's jobs (``JOBS``) declared with the real ``Job`` class: ``verified``
has a first stage with a verify hook and a second, idempotent one, and a closing hook;
``plain`` has an idempotent first stage and a second that is neither. Retries wait 0 seconds,
so a retried item is claimable again at once, as the model (which has no clock) assumes.
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from typing import Any, NamedTuple

from workledger import Permanent, Retry, Skip
from workledger._runtime.handlers.execute import to_finish
from workledger._runtime.repair import operations
from workledger._runtime.repair.reconcile import derive_projection
from workledger._runtime.repair.sweeper import Sweeper, SweepReport
from workledger.core.outcomes import Failed, Outcome, Processed, RetryLater, Skipped, Unknown
from workledger.jobs import Job as RealJob
from workledger.storage.port import (
    ClaimedItem,
    ClaimParams,
    FinishParams,
    FinishResult,
    IdentityClaim,
    ItemRow,
    ItemsInsert,
    ItemsQuery,
    LeaseParams,
    NewItem,
    NewRun,
    Reconciled,
    RunRow,
    Store,
)

from .ledger import Job

JOBS = {
    "verified": Job("verified", ("a", "b"), frozenset({"b"}), frozenset({"a"}), True),
    "plain": Job("plain", ("a", "b"), frozenset({"a"}), frozenset(), False),
}


def reason_of(error: str | None) -> str:
    """The model's class of a ``wl_items.error`` text."""
    if error is None:
        return ""
    for prefix, reason in (("lease_expired: awaiting verify", "awaiting_verify"),
                           ("lease_expired: outcome unknown", "outcome_unknown"),
                           ("lease_expired: verify: not done", "verify_not_done"),
                           ("lease_expired", "reclaimed"), ("not started", "not_started"),
                           ("verify: not done", "verify_not_done"),
                           ("verify could not tell", "verify_unsure"),
                           ("retries exhausted", "failed")):
        if error.startswith(prefix):
            return reason
    return error  # the texts the test wrote: cancelled, retry, failed, skipped, unknown


def outcome_of(name: str) -> Outcome:
    return {"processed": Processed(None), "retry": RetryLater("retry", 0.0),
            "failed": Failed("failed"), "skipped": Skipped("skipped"),
            "unknown": Unknown("unknown")}[name]


class Real:
    """One backend's store with the model's jobs; every method is one real operation."""

    def __init__(self, store: Store, url: str) -> None:
        self.store, self.url = store, url
        self.verdict: str = "unsure"  # what the verify hook answers next
        self.hook: str = "processed"  # what the closing hook does next
        self.jobs = {name: self._declare(job) for name, job in JOBS.items()}
        self.sweeper = Sweeper(store, self.jobs, lambda run_id: None, actor="sweeper",
                               lease=60.0, rng=random.Random(0))

    def _declare(self, model: Job) -> RealJob:
        job = RealJob(None, model.name)  # type: ignore[arg-type] # it never submits
        for stage in model.stages:
            verify = self._verify if stage in model.verify else None
            job.stage(stage, idempotent=stage in model.idempotent, verify=verify,
                      max_attempts=model.max_attempts, base_delay=0.0, max_delay=0.0)(
                lambda item, ctx: None)
        if model.closing:
            job.on_complete(self._close, max_attempts=model.max_attempts, base_delay=0.0)
        return job

    def _verify(self, item: Any, ctx: Any) -> str:
        if self.verdict == "unsure":
            raise ConnectionError("the downstream cannot say")
        return self.verdict

    def _close(self, status: Any) -> None:
        if self.hook == "retry":
            raise Retry("retry", delay=0.0)
        if self.hook == "failed":
            raise Permanent("failed")
        if self.hook == "skipped":
            raise Skip("skipped")

    # -- operations ----------------------------------------------------------------------------

    def submit(self, job: str, key: str, units: int, skip: frozenset[int], mark: bool) -> int:
        run, _ = self.store.run_submit(NewRun(job, key, json.dumps({"units": units})))
        rows = [NewItem(s, f"u{s}", None, "skipped" if s in skip else "pending",
                        "skipped" if s in skip else None) for s in range(units)]
        self.store.items_insert_many(ItemsInsert(run.id, JOBS[job].stages[0], rows))
        if mark:
            self.store.run_mark_decomposed(run.id, JOBS[job].stages[0])
        return run.id

    def mark(self, run_id: int, job: str) -> None:
        self.store.run_mark_decomposed(run_id, JOBS[job].stages[0])

    def claim(self, run_id: int, limit: int) -> list[ClaimedItem]:
        return self.store.items_claim(ClaimParams(run_id, limit, 60.0))

    def claim_identity(self, run_id: int, job: str, stage: str,
                       seqs: list[int]) -> list[ClaimedItem]:
        return self.store.items_claim_by_identity(IdentityClaim(job, run_id, stage, seqs, 60.0,
                                                                "broker"))

    def finish(self, job: str, run_id: int, done: list[tuple[ClaimedItem, str, int]],
               start: list[int], token: int) -> FinishResult:
        finishes = [to_finish(self.jobs[job], c, outcome_of(o), c.attempts + 1, 0.0, charge)
                    for c, o, charge in sorted(done, key=lambda d: d[0].id)]
        return self.store.items_finish_if_leased(FinishParams(run_id, finishes, "worker",
                                                              start, token))

    def expire(self, token: int) -> None:
        """Time travel for one claim: its leases end now (the database's clock moved on)."""
        if self.url.startswith("sqlite:///"):
            with closing(sqlite3.connect(self.url[len("sqlite:///"):], timeout=60)) as conn:
                conn.execute("UPDATE wl_items SET lease_until = strftime('%Y-%m-%d %H:%M:%f',"
                             " 'now', '-1 seconds') WHERE lease_token = ? AND state = 'claimed'",
                             (token,))
                conn.commit()
            return
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("UPDATE wl_items SET lease_until = now() - interval '1 second'"
                         " WHERE lease_token = %s AND state = 'claimed'", (token,))

    def reclaim(self) -> None:
        self.sweeper._expired_leases(SweepReport())

    def verify(self, verdict: str) -> None:
        self.verdict = verdict
        self.sweeper._verify_unknown(SweepReport())

    def close(self, hook: str) -> None:
        self.hook = hook
        self.sweeper._close_runs(SweepReport())

    def release(self, run_id: int, ids: list[int], token: int) -> int:
        return self.store.items_release(LeaseParams(run_id, ids, token))

    def mark_started(self, run_id: int, ids: list[int], token: int, charge: int) -> list[int]:
        return self.store.items_mark_started(LeaseParams(run_id, ids, token), charge)

    def _run(self, run_id: int) -> RunRow:
        run = self.store.run_get(run_id)
        assert run is not None
        return run

    def retry(self, run_id: int) -> int:
        """The operator's redrive; ``Refused`` in a cancelled run."""
        run = self._run(run_id)
        return operations.retry(self.store, run, self.jobs[run.job])

    def resolve(self, job: str, run_id: int, stage: str, seq: int, as_state: str) -> bool:
        return operations.resolve(self.store, self.jobs[job], self._run(run_id), stage, seq,
                                  as_state)

    def reconcile(self, run_id: int, job: str) -> Reconciled:
        stages = list(JOBS[job].stages)
        return self.store.run_reconcile(run_id, derive_projection(stages), False, "test")

    # -- reading back -----------------------------------------------------------------------------

    def items(self, run_id: int) -> Iterator[ItemRow]:
        yield from self.store.items_list(ItemsQuery(run_id, limit=10_000))

    def expired(self) -> set[int]:
        return {i.id for i in self.store.leases_expired()}


class Handle(NamedTuple):
    """One claim, on both sides: the model's token and the real claimed rows."""

    run: int  # the model's run index
    token: int  # the model's
    real_token: int
    claimed: list[ClaimedItem]
    idxs: list[int]  # the model's item indexes, in the same order
