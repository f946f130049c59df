"""The claim of a job with limited stages (``@job.stage(rate_limit=..., max_in_flight=...)``),
written once over the dialect hooks: stage by stage, each limited stage no further than its
token bucket and cap allow (docs/design.md, "How a worker runs": rate limits and caps).
``LedgerStore.items_claim`` takes this path when ``ClaimParams.stages`` is given; it is here to
keep ``base.py`` about moving items.
"""

from __future__ import annotations

from operator import attrgetter, itemgetter
from typing import Any

from workledger.core import rates
from workledger.storage import common
from workledger.storage.dialect import C, Dialect
from workledger.storage.port import ClaimParams, StageLimit


class StageLimits(Dialect[C]):
    """The limited claim; mixed into ``LedgerStore``."""

    def _claim_by_stage(self, conn: C, params: ClaimParams) -> list[Any]:
        """A limited job's claim: the buckets of its limited stages locked first (in stage
        order: every claimer takes them in the same order), then each stage's rows in turn,
        a limited stage no further than its bucket and cap allow, all under one token."""
        allowed = {limit.stage: self._limit_allows(conn, params.job, limit, params.limit)
                   for limit in sorted(params.limits, key=attrgetter("stage"))}
        token: dict[str, Any] = {"token": None, **self._lease_token(conn)}
        rows: list[Any] = []
        keyed = {limit.stage: limit.max_per_key for limit in params.limits
                 if limit.max_per_key is not None}
        for stage in params.stages:
            want = min(params.limit - len(rows), allowed.get(stage, (0.0, params.limit))[1])
            if want <= 0:
                continue
            if stage in keyed:
                got = self._claim_keyed(conn, params, stage, want, keyed[stage], token)
            else:
                got = self._tuples(conn, self.Q["items_claim_stage"], {
                    "lease": self._lease(params.lease_seconds), "run_id": params.run_id,
                    "stage": stage, "limit": want, "holder": params.holder, **token})
            if got and token["token"] is None:
                token["token"] = got[0][7]  # the token the first statement took
            rows += got
        for limit in params.limits:
            spent = sum(1 for r in rows if r[2] == limit.stage)
            if spent and limit.rate is not None:
                conn.execute(self.Q["limit_spend"], {
                    **common.limit_params(params.job, limit),
                    "tokens": allowed[limit.stage][0] - spent})
        return rows

    def _claim_keyed(self, conn: C, params: ClaimParams, stage: str, want: int,
                     max_per_key: int, token: dict[str, Any]) -> list[Any]:
        """A stage with ``max_per_key``: the items of each concurrency key claimed now (from
        the claimed rows, after the stage's bucket was locked: one claimer at a time), then
        the run's pending rows without the keys already full, then those rows a key's free
        slots allow (core/rates.py ``pick_by_key``: a full key is passed over, not a stop)."""
        busy = {str(k): int(n) for k, n in self._tuples(conn, self.Q["keys_in_flight"], {
            "job": params.job, "stage": stage})}
        full = [k for k, n in busy.items() if n >= max_per_key]
        rows = self._tuples(conn, self.Q["items_keyed_pending"], {
            "run_id": params.run_id, "stage": stage, "full": self._list(full),
            "limit": want * rates.KEYED_WINDOW})
        ids = rates.pick_by_key([(int(r[0]), r[1]) for r in rows], busy, max_per_key, want)
        if not ids:
            return []
        got = self._tuples(conn, self.Q["items_claim_ids"], {
            "lease": self._lease(params.lease_seconds), "run_id": params.run_id,
            "ids": self._list(ids), "holder": params.holder, **token})
        return sorted(got, key=itemgetter(0))

    def _limit_allows(self, conn: C, job: str, limit: StageLimit, want: int
                      ) -> tuple[float, int]:
        """Lock the stage's bucket (made full on first use) and say (its tokens now, how many
        items this claim may take of the stage)."""
        args = common.limit_params(job, limit)
        row = conn.execute(self.Q["limit_lock"], args).fetchone()
        if row is None:
            conn.execute(self.Q["limit_create"], args)
            row = conn.execute(self.Q["limit_lock"], args).fetchone()
        tokens = rates.tokens_now(float(row["tokens"]), float(row["elapsed"]), limit.rate,
                                  limit.burst) if limit.rate is not None else float(want)
        in_flight = 0
        if limit.max_in_flight is not None:
            in_flight = int(self._first(self._tuples(conn, self.Q["limit_in_flight"], args))[0])
        return tokens, rates.allowance(tokens, in_flight, limit.max_in_flight, want)
