"""The port methods of dispatch through a broker, written once over the dialect hooks.

A broker task claims exactly the items its message names (``items_claim_by_identity``); the
ledger knows which pending items are owed a message and since when (``wl_items.redispatch_at``,
migration 0007), so that a message the broker lost, or one never published because its
publisher died after its commit, is published again by the sweeper
(``_runtime/broker/dispatch.py``).
``LedgerStore`` inherits these; they are here to keep ``base.py`` about moving items.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any

from workledger.core import rates
from workledger.core.states import ItemState
from workledger.storage import common
from workledger.storage.dialect import C
from workledger.storage.limited import StageLimits
from workledger.storage.port import (
    ClaimedItem,
    DispatchMark,
    HeldBack,
    Hold,
    HoldBack,
    IdentityClaim,
)

OWE_PAGE = 5000  # rows per transaction when a decomposition's rows are marked owed


class Dispatching(StageLimits[C]):
    """Claims by identity and the outbox's bookkeeping; mixed into ``LedgerStore``."""

    def items_claim_by_identity(self, params: IdentityClaim) -> list[ClaimedItem]:
        if not params.seqs:
            return []
        with self._tx() as conn:
            tokens, allowed, seqs = 0.0, len(params.seqs), params.seqs
            if params.limit is not None:  # its bucket first, as the claim of a worker does
                tokens, allowed = self._limit_allows(conn, params.job, params.limit, allowed)
                if allowed and params.limit.max_per_key is not None:
                    seqs = self._keys_allow(conn, params, params.limit.max_per_key, allowed)
                    allowed = len(seqs)
                if not allowed:
                    return []
            rows = self._tuples(conn, self.Q["items_claim_by_identity"], {
                "lease": self._lease(params.lease_seconds), "run_id": params.run_id,
                "job": params.job, "stage": params.stage, "seqs": self._list(seqs),
                "limit": allowed, "holder": params.holder, "held": params.held,
                **self._lease_token(conn)})
            claimed = common.claimed_items(rows, decode=self.json_as_text)
            if claimed and params.limit is not None and params.limit.rate is not None:
                conn.execute(self.Q["limit_spend"], {
                    **common.limit_params(params.job, params.limit),
                    "tokens": tokens - len(claimed)})
            if claimed:
                self._lease_token_taken(conn)
                if params.record_event:  # a limited claim's carry when its bucket was spent
                    events = (self.Q["events_add"] if params.limit is None
                              else self.Q["events_add_now"])
                    self._many(conn, events, common.claim_events(claimed, params.actor))
                self._count(conn, params.run_id, common.Tally.moves(
                    map(itemgetter(2), rows), ItemState.PENDING.value, ItemState.CLAIMED.value))
        common.failpoint("claim.after_commit")
        return claimed

    def _keys_allow(self, conn: C, params: IdentityClaim, max_per_key: int,
                    allowed: int) -> list[int]:
        """Of the named seqs of a stage with ``max_per_key``, those the keys' free slots allow
        (counted from the claimed rows, after the bucket's lock, as a worker's claim does)."""
        busy = {str(k): int(n) for k, n in self._tuples(conn, self.Q["keys_in_flight"], {
            "job": params.job, "stage": params.stage})}
        rows = self._tuples(conn, self.Q["items_keyed_named"], {
            "run_id": params.run_id, "stage": params.stage, "seqs": self._list(params.seqs)})
        picked = set(rates.pick_by_key([(int(r[0]), r[2]) for r in rows], busy, max_per_key,
                                       allowed))
        return [int(r[1]) for r in rows if int(r[0]) in picked]

    def items_owe(self, run_id: int, stage: str, wait: float) -> int:
        owed, after = 0, 0
        while True:
            with self._tx() as conn:
                ids = [int(r[0]) for r in self._tuples(conn, self.Q["items_owe"], {
                    "run_id": run_id, "stage": stage, "after_id": after,
                    "limit": OWE_PAGE, "wait": float(wait)})]
            owed += len(ids)
            if len(ids) < OWE_PAGE:
                return owed
            after = max(ids)

    def items_pending_seqs(self, run_id: int, stage: str, after_id: int,
                           limit: int) -> list[tuple[int, int]]:
        rows = self._read_tuples(self.Q["items_pending_seqs"], {
            "run_id": run_id, "stage": stage, "after_id": after_id, "limit": limit})
        return [(int(r[0]), int(r[1])) for r in rows]

    def items_mark_dispatched(self, params: DispatchMark) -> list[int]:
        if not params.seqs:
            return []
        with self._tx() as conn:
            rows = self._tuples(conn, self.Q["items_mark_dispatched"], {
                "run_id": params.run_id, "stage": params.stage,
                "seqs": self._list(params.seqs), "wait": float(params.wait),
                "delay": float(params.delay)})
        return sorted(int(r[0]) for r in rows)

    def items_hold_back(self, params: HoldBack) -> Hold:
        """Hold what a limited claim left until its bucket can serve it (migration 0013): in
        one transaction, the bucket locked first (the lock order of a claim), then the items."""
        if not params.seqs:
            return Hold()
        limit = params.limit
        with self._tx() as conn:
            tokens, allowed = self._limit_allows(conn, params.job, limit, len(params.seqs))
            now, horizon = self._first(self._tuples(conn, self.Q["limit_horizon"],
                                                    common.limit_params(params.job, limit)))
            ids = [int(r[0]) for r in self._tuples(conn, self.Q["items_holdable"], {
                "run_id": params.run_id, "job": params.job, "stage": params.stage,
                "seqs": self._list(params.seqs), "held": params.held})]
            # a key held back is a cap: nothing says when its slot frees
            plan = rates.hold_plan(
                len(ids), tokens, -math.inf if horizon is None else float(horizon) - now,
                limit.rate, limit.burst,
                capped=(allowed == 0 and tokens >= 1) or limit.max_per_key is not None,
                may_wait=params.may_wait)
            if not plan.groups:
                return Hold(wait=plan.wait)
            waits = [wait for count, wait in plan.groups for _ in range(count)]
            due_of = {i: math.ceil((now + w) * 1000) for i, w in zip(ids, waits, strict=True)}
            rows = self._hold(conn, [i for i, w in zip(ids, waits, strict=True)
                                     if w <= params.broker_hold], due_of, params.wait)
            # later than a broker holds a message: owed from their due time, published then
            self._hold(conn, [i for i, w in zip(ids, waits, strict=True)
                              if w > params.broker_hold], due_of, 0.0)
            if plan.horizon is not None:
                conn.execute(self.Q["limit_hold"], {
                    "job": params.job, "stage": limit.stage,
                    "held": math.ceil((now + plan.horizon) * 1000)})
        by_due: dict[int, list[int]] = {}
        for item_id, seq in rows:
            by_due.setdefault(due_of[int(item_id)], []).append(int(seq))
        return Hold(messages=tuple(HeldBack(tuple(sorted(seqs)), max(0.0, due / 1000 - now), due)
                                   for due, seqs in sorted(by_due.items())))

    def _hold(self, conn: C, ids: list[int], due_of: dict[int, int],
              wait: float) -> list[Any]:
        """Hold ``ids`` until their due times, owed a message from then plus ``wait`` (and
        more for each message so far). Dues rise with ids (the groups are in id order), so a
        dialect that sends a list in id order (PostgreSQL's) keeps each due beside its id."""
        if not ids:
            return []
        return self._tuples(conn, self.Q["items_hold"], {
            "ids": self._list(ids), "dues": self._list(due_of[i] for i in ids),
            "wait": float(wait)})

    def items_owed(self, run_id: int, limit: int,
                   wait: float | None = None) -> list[tuple[str, int]]:
        rows = self._read_tuples(self.Q["items_owed"], {
            "run_id": run_id, "limit": limit, "wait": None if wait is None else float(wait)})
        return [(str(r[0]), int(r[1])) for r in rows]
