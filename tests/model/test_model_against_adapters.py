"""The real adapters against the model, step by step: Hypothesis draws random operations
(submit, claim, record starts, finish, finish late with a stale token, release, let a lease
expire, sweep expired leases, verify, close, retry, resolve, pause, resume, cancel,
reconcile), applies each to a real store and to the model (tests/model/ledger.py), and fails on
the first disagreement: every run's markers and counters, every item's state, attempts,
reason, lease and start, and the stage counts. On SQLite and on PostgreSQL.

Deterministic (``derandomize``); ``WORKLEDGER_MODEL_EXAMPLES=N`` runs more examples.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from workledger.errors import Refused, UsageError
from workledger.storage import open_store

from . import ledger as m
from . import settles as rules
from .adapter import JOBS, Handle, Real, reason_of
from .ledger import CLOSE, Finish, Ledger

pytestmark = pytest.mark.contract

EXAMPLES = int(os.environ.get("WORKLEDGER_MODEL_EXAMPLES", "60"))
OUTCOMES = ("processed", "retry", "failed", "skipped", "unknown")
pick = st.integers(min_value=0, max_value=10**6)


class LedgerAgainstModel(RuleBasedStateMachine):
    fresh: Callable[[], str]  # a fresh database for each example: set per backend by the test

    def __init__(self) -> None:
        super().__init__()
        url = self.fresh()
        self.store = open_store(url)
        self.store.migrate()
        self.real = Real(self.store, url)
        self.model = Ledger()
        self.run_ids: list[int] = []
        self.handles: list[Handle] = []

    def teardown(self) -> None:
        self.store.close()

    # -- helpers -----------------------------------------------------------------------------

    def _job(self, run: int) -> str:
        return self.model.runs[run].job

    def _ids(self) -> dict[tuple[int, str, int], int]:
        """Real item ids by the model's (run index, stage, seq)."""
        found = {}
        for run, run_id in enumerate(self.run_ids):
            for row in self.real.items(run_id):
                found[(run, row.stage, row.seq)] = row.id
        return found

    def _handle(self, n: int, live_only: bool = False, stale_only: bool = False) -> Handle | None:
        chosen = [h for h in self.handles if not (live_only and self._stale(h))
                  and not (stale_only and not self._stale(h))]
        return chosen[n % len(chosen)] if chosen else None

    def _stale(self, h: Handle) -> bool:
        return not any(self.model.items[i].state == "claimed" and self.model.items[i].token ==
                       h.token for i in h.idxs)

    # -- operations --------------------------------------------------------------------------

    @initialize(units=st.lists(st.integers(1, 3), min_size=2, max_size=2),
                skip=st.booleans())
    def two_runs(self, units: list[int], skip: bool) -> None:
        """Every example starts with a decomposed run of each job."""
        self.submit("verified", units[0], False, True)
        self.submit("plain", units[1], skip, True)

    @precondition(lambda self: len(self.model.runs) < 3)
    @rule(job=st.sampled_from(sorted(JOBS)), units=st.integers(1, 3), skip=st.booleans(),
          mark=st.booleans())
    def submit(self, job: str, units: int, skip: bool, mark: bool) -> None:
        skipped = frozenset({units - 1}) if skip and units > 1 else frozenset()
        run = len(self.model.runs)
        self.run_ids.append(self.real.submit(job, f"run{run}", units, skipped, mark))
        self.model = m.submit(self.model, job, units)
        self.model, _ = m.decompose_insert(self.model, JOBS, run, skipped)
        if mark:
            self.model = m.decompose_mark(self.model, JOBS, run)

    @precondition(lambda self: any(not r.decomposed for r in self.model.runs))
    @rule(n=pick)
    def mark(self, n: int) -> None:
        runs = [i for i, r in enumerate(self.model.runs) if not r.decomposed]
        run = runs[n % len(runs)]
        self.real.mark(self.run_ids[run], self._job(run))
        self.model = m.decompose_mark(self.model, JOBS, run)

    @precondition(lambda self: bool(self.model.runs))
    @rule(n=pick, limit=st.integers(1, 3))
    def claim(self, n: int, limit: int) -> None:
        run = n % len(self.model.runs)
        claimed = self.real.claim(self.run_ids[run], limit)
        self.model, token, taken, _ = m.claim(self.model, run, limit, "worker")
        ids = self._ids()
        assert [c.id for c in claimed] == [ids[(run, self.model.items[i].stage,
                                                self.model.items[i].seq)] for i in taken]
        if taken:
            self.handles.append(Handle(run, token, claimed[0].lease_token, claimed, taken))

    @precondition(lambda self: bool(self.model.items))
    @rule(n=pick, width=st.integers(1, 3))
    def claim_by_identity(self, n: int, width: int) -> None:
        """A broker's message names some seqs of one stage of one run, whatever their state."""
        first = self.model.items[n % len(self.model.items)]
        run, stage = first.run, first.stage
        seqs = sorted({it.seq for it in self.model.items if it.run == run
                       and it.stage == stage and it.seq >= first.seq})[:width]
        claimed = self.real.claim_identity(self.run_ids[run], self._job(run), stage, seqs)
        self.model, token, taken, _ = m.claim_identity(self.model, run, stage, seqs)
        ids = self._ids()
        assert sorted(c.id for c in claimed) == sorted(
            ids[(run, self.model.items[i].stage, self.model.items[i].seq)] for i in taken)
        if taken:
            by_id = {c.id: c for c in claimed}
            ordered = [by_id[ids[(run, stage, self.model.items[i].seq)]] for i in taken]
            self.handles.append(Handle(run, token, claimed[0].lease_token, ordered, taken))

    @precondition(lambda self: bool(self.handles))
    @rule(n=pick, outcomes=st.lists(st.sampled_from(OUTCOMES), min_size=3, max_size=3),
          charge=st.integers(0, 1), start_rest=st.booleans())
    def finish(self, n: int, outcomes: list[str], charge: int, start_rest: bool) -> None:
        h = self._handle(n)
        assert h is not None
        self._finish(h, outcomes, charge, start_rest)

    @precondition(lambda self: any(self._stale(h) for h in self.handles))
    @rule(n=pick, outcomes=st.lists(st.sampled_from(OUTCOMES), min_size=3, max_size=3))
    def finish_late_with_a_stale_token(self, n: int, outcomes: list[str]) -> None:
        h = self._handle(n, stale_only=True)
        assert h is not None
        self._finish(h, outcomes, 1, False)

    def _finish(self, h: Handle, outcomes: list[str], charge: int, start_rest: bool) -> None:
        job = self._job(h.run)
        half = max(1, len(h.idxs) // 2) if start_rest else len(h.idxs)
        done = [(c, outcomes[k], charge) for k, c in enumerate(h.claimed[:half])]
        start = [c.id for c in h.claimed[half:]]
        result = self.real.finish(job, self.run_ids[h.run], done, start, h.real_token)
        finishes = []
        for (c, outcome, _), idx in zip(done, h.idxs, strict=False):
            decided = "failed" if outcome == "retry" and \
                c.attempts + 1 >= JOBS[job].max_attempts else outcome
            finishes.append(Finish(idx, h.token, decided, charge,
                                   "" if decided == "processed" else decided))
        self.model, applied, stale, started, _ = m.finish(
            self.model, JOBS, h.run, finishes, "worker", h.idxs[half:], h.token)
        by_id = {c.id: i for c, i in zip(h.claimed, h.idxs, strict=True)}
        assert sorted(by_id[i] for i in result.applied) == sorted(applied)
        assert sorted(by_id[i] for i in result.stale) == sorted(stale)
        assert sorted(by_id[i] for i in result.started) == sorted(started)

    @precondition(lambda self: bool(self.handles))
    @rule(n=pick, charge=st.integers(0, 1))
    def record_starts(self, n: int, charge: int) -> None:
        h = self._handle(n)
        assert h is not None
        started = self.real.mark_started(self.run_ids[h.run], [c.id for c in h.claimed],
                                         h.real_token, charge)
        self.model, mine = m.mark_started(self.model, h.idxs, h.token, charge)
        by_id = {c.id: i for c, i in zip(h.claimed, h.idxs, strict=True)}
        assert sorted(by_id[i] for i in started) == sorted(mine)

    @precondition(lambda self: bool(self.handles))
    @rule(n=pick)
    def release(self, n: int) -> None:
        h = self._handle(n)
        assert h is not None
        moved = self.real.release(self.run_ids[h.run], [c.id for c in h.claimed], h.real_token)
        self.model, moves = m.release(self.model, h.idxs, h.token)
        assert moved == sum(1 for mv in moves if mv[0] == "release")

    @precondition(lambda self: bool(self.handles))
    @rule(n=pick)
    def expire(self, n: int) -> None:
        h = self._handle(n, live_only=True)
        if h is not None:
            self.real.expire(h.real_token)
            self.model = m.expire(self.model, h.token)

    @rule()
    def sweep_expired_leases(self) -> None:
        self.real.reclaim()
        for name, job in JOBS.items():
            for stage in job.all_stages():
                self.model, _ = m.reclaim(self.model, JOBS, name, stage)

    @rule(verdict=st.sampled_from(["done", "not_done", "unsure"]))
    def verify(self, verdict: str) -> None:
        self.real.verify(verdict)
        for i, it in enumerate(self.model.items):
            if it.state == "unknown" and it.reason == "awaiting_verify" and \
                    it.stage in JOBS[self._job(it.run)].verify:
                self.model, _ = rules.verify(self.model, JOBS, i, verdict)

    @rule(hook=st.sampled_from(["processed", "retry", "failed", "skipped"]))
    def close(self, hook: str) -> None:
        self.real.close(hook)
        for run in range(len(self.model.runs)):
            if not rules.to_close(self.model, JOBS, run):
                continue
            self.model, _ = rules.close_insert(self.model, run)
            self.model, token, taken, _ = m.claim(self.model, run, 1, "sweeper")
            if taken and self.model.items[taken[0]].stage == CLOSE:
                it = self.model.items[taken[0]]
                decided = "failed" if hook == "retry" and \
                    it.attempts + 1 >= JOBS[self._job(run)].max_attempts else hook
                self.model, *_ = m.finish(self.model, JOBS, run, [Finish(
                    taken[0], token, decided, 1, "" if decided == "processed" else decided)],
                    "sweeper")

    @precondition(lambda self: bool(self.model.runs))
    @rule(n=pick)
    def retry(self, n: int) -> None:
        run = n % len(self.model.runs)
        if self.model.runs[run].cancelled:  # a cancelled run's failures are not redriven
            with pytest.raises(Refused):
                self.real.retry(self.run_ids[run])
            return
        moved = self.real.retry(self.run_ids[run])
        self.model, moves = rules.retry(self.model, run)
        assert moved == sum(1 for mv in moves if mv[0] == "redrive")

    @precondition(lambda self: any(it.state == "unknown" for it in self.model.items))
    @rule(n=pick, as_state=st.sampled_from(["processed", "failed", "pending"]))
    def resolve(self, n: int, as_state: str) -> None:
        unknown = [i for i, it in enumerate(self.model.items) if it.state == "unknown"]
        idx = unknown[n % len(unknown)]
        it = self.model.items[idx]
        if self.model.runs[it.run].cancelled:  # nor are its unknown items resolved
            with pytest.raises(Refused):
                self.real.resolve(self._job(it.run), self.run_ids[it.run], it.stage, it.seq,
                                  as_state)
            return
        try:
            done = self.real.resolve(self._job(it.run), self.run_ids[it.run], it.stage, it.seq,
                                     as_state)
        except UsageError as exc:  # the model says it is unknown: the adapter must agree
            raise AssertionError(f"resolve refused: {exc}") from exc
        self.model, _ = rules.resolve(self.model, JOBS, idx, as_state)
        assert done

    @precondition(lambda self: bool(self.model.runs))
    @rule(n=pick, what=st.sampled_from(["pause", "resume", "cancel"]))
    def operate(self, n: int, what: str) -> None:
        run = n % len(self.model.runs)
        run_id = self.run_ids[run]
        if what == "cancel":
            self.store.run_cancel(run_id, "operator", None)
            self.model, _ = rules.cancel(self.model, run)
        else:
            self.store.run_set_paused(run_id, what == "pause", "operator", None)
            self.model = (rules.pause if what == "pause" else rules.resume)(self.model, run)

    @precondition(lambda self: bool(self.model.runs))
    @rule(n=pick)
    def reconcile(self, n: int) -> None:
        run = n % len(self.model.runs)
        found = self.real.reconcile(self.run_ids[run], self._job(run))
        stored = found.stored
        assert (stored.total, stored.processed, stored.failed, stored.skipped,
                stored.complete) == rules.stored(self.model, run)
        if self.model.runs[run].decomposed:
            d = found.derived
            assert (d.total, d.processed, d.failed, d.skipped, d.complete) == \
                rules.derived(self.model, JOBS, run)
        assert dict(found.stored_counts) == dict(found.ledger_counts)

    # -- the comparison, after every step ------------------------------------------------------

    @invariant()
    def the_adapter_agrees_with_the_model(self) -> None:
        tokens = {h.real_token: h.token for h in self.handles}
        expired = self.real.expired()
        for run, run_id in enumerate(self.run_ids):
            r = self.store.run_get(run_id)
            assert r is not None
            mr = self.model.runs[run]
            assert (r.decomposed_at is not None, r.paused_at is not None,
                    r.cancelled_at is not None, r.total, r.processed, r.failed, r.skipped,
                    r.completed_at is not None) == (
                mr.decomposed, mr.paused, mr.cancelled, mr.total, mr.processed, mr.failed,
                mr.skipped, mr.completed), f"run {run}"
            real = {(row.stage, row.seq): row for row in self.real.items(run_id)}
            mine = {(it.stage, it.seq): it for it in self.model.items if it.run == run}
            assert set(real) == set(mine), f"run {run}: rows {sorted(real)} vs {sorted(mine)}"
            for key, it in mine.items():
                row = real[key]
                seen = (row.state, row.attempts, reason_of(row.error), row.started_at is not None)
                assert seen == (it.state, it.attempts, it.reason, it.started), f"{run} {key}"
                if it.state == "claimed":
                    assert tokens.get(row.lease_token or 0) == it.token, f"{run} {key} token"
                    assert (row.id in expired) == (not it.live), f"{run} {key} lease"
            counts = self.store.run_counts(run_id)
            grouped = Counter((it.stage, it.state) for it in mine.values())
            assert {(s, st_): n for s, states in counts.items() for st_, n in states.items()} \
                == dict(grouped), f"run {run}: stage counts"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_adapters_behave_as_the_model(backend: str, tmp_path: Path,
                                          request: pytest.FixtureRequest) -> None:
    if backend == "postgres":
        base = request.getfixturevalue("pg_database")

        def fresh() -> str:
            schema = f"m_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "{schema}"')
            sep = "&" if "?" in base else "?"
            return f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    else:
        def fresh() -> str:
            return f"sqlite:///{tmp_path / f'ledger-{uuid.uuid4().hex[:8]}.db'}"

    class Machine(LedgerAgainstModel):
        pass

    Machine.fresh = staticmethod(fresh)  # type: ignore[method-assign]

    run_state_machine_as_test(Machine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=40, deadline=None, derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        database=None))
