"""Cluster-wide stage limits (``@job.stage(rate_limit="25/s", max_in_flight=3)``): the claim
spends from one token bucket per stage under its row lock and counts the stage's claimed items
over the job's open runs, so however many workers claim, a downstream's limit holds.

The port's behaviour on both backends first; then four real worker processes against one
ledger, whose claims (by the database clock) and handler runs are checked window by window.
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from test_cli import cli_cmd, cli_env
from test_contract_store import LONG, S1, S2, done, finish, insert, submit
from test_prune import sql

from workledger import Ledger
from workledger.core.rates import allowance, parse_rate, tokens_now
from workledger.errors import UsageError
from workledger.storage.port import ClaimedItem, ClaimParams, StageLimit, Store

JOB = "ingest"


def limited_claim(store: Store, run_id: int, *limits: StageLimit, limit: int = 100,
                  stages: tuple[str, ...] = (S2, S1), job: str = JOB) -> list[ClaimedItem]:
    return store.items_claim(ClaimParams(run_id, limit, LONG, job=job, stages=stages,
                                         limits=limits))


def two_stage_run(store: Store, key: str, first: int, second: int) -> int:
    """A decomposed run with ``first`` pending items of S1 and then ``second`` of S2."""
    run = submit(store, key)
    insert(store, run.id, range(first))
    insert(store, run.id, range(second), stage=S2)
    store.run_mark_decomposed(run.id, S1)
    return run.id


def age_bucket(url: str, stage: str, seconds: float) -> None:
    """Move the bucket's last refill ``seconds`` into the past, as if that long went by."""
    if url.startswith("sqlite:///"):
        when = f"strftime('%Y-%m-%d %H:%M:%f', refreshed_at, '-{seconds} seconds')"
    else:
        when = f"refreshed_at - interval '{seconds} seconds'"
    sql(url, f"UPDATE wl_stage_limits SET refreshed_at = {when} WHERE stage = %s", stage)


# -- the port, on both backends ----------------------------------------------------------------


@pytest.mark.contract
def test_a_claim_takes_no_more_of_a_stage_than_its_bucket_holds(store: Store) -> None:
    run_id = two_stage_run(store, "k1", first=10, second=10)
    slow = StageLimit(S2, rate=0.001, burst=3, max_in_flight=None)
    first = limited_claim(store, run_id, slow, limit=100)
    assert sorted(i.stage for i in first).count(S2) == 3  # the bucket's three tokens
    assert [i.stage for i in first].count(S1) == 10  # the other stage is not held back
    assert len({i.lease_token for i in first}) == 1  # one claim, one token
    assert limited_claim(store, run_id, slow) == []  # the bucket is empty


@pytest.mark.contract
def test_the_bucket_refills_at_its_rate_by_the_database_clock(store: Store,
                                                              db_url: str) -> None:
    run_id = two_stage_run(store, "k1", first=0, second=20)
    paced = StageLimit(S2, rate=2.0, burst=5, max_in_flight=None)
    assert len(limited_claim(store, run_id, paced)) == 5  # a new bucket is full
    assert limited_claim(store, run_id, paced) == []
    age_bucket(db_url, S2, 1.0)  # one second: two tokens at 2/s
    assert len(limited_claim(store, run_id, paced)) == 2
    age_bucket(db_url, S2, 60.0)  # a minute refills it only up to its burst
    assert len(limited_claim(store, run_id, paced)) == 5
    (tokens, rate, burst), = sql(db_url, "SELECT tokens, rate, burst FROM wl_stage_limits")
    assert (rate, burst) == (2.0, 5.0) and float(tokens) < 1.0  # type: ignore[arg-type]


@pytest.mark.contract
def test_a_cap_counts_the_claimed_items_of_every_open_run_of_the_job(store: Store) -> None:
    a = two_stage_run(store, "a", first=5, second=0)
    b = two_stage_run(store, "b", first=5, second=0)
    cap = StageLimit(S1, rate=None, burst=1, max_in_flight=3)
    held = limited_claim(store, a, cap)
    assert len(held) == 3
    assert limited_claim(store, b, cap) == []  # the other run's items count too
    finish(store, a, done(held[0]))
    (freed,) = limited_claim(store, b, cap)  # one finished: one more may be claimed
    assert freed.run_id == b


@pytest.mark.contract
def test_a_stage_held_back_never_stands_in_front_of_another(store: Store) -> None:
    run_id = two_stage_run(store, "k1", first=300, second=5)  # S1's rows come first by id
    empty = StageLimit(S1, rate=0.001, burst=1, max_in_flight=None)
    limited_claim(store, run_id, empty, stages=(S1,), limit=1)  # spend the one token
    got = limited_claim(store, run_id, empty, limit=10)
    assert [i.stage for i in got] == [S2] * 5


@pytest.mark.contract
def test_waiting_for_a_token_writes_nothing(store: Store, db_url: str) -> None:
    run_id = two_stage_run(store, "k1", first=0, second=3)
    paced = StageLimit(S2, rate=0.001, burst=1, max_in_flight=None)
    (first,) = limited_claim(store, run_id, paced)
    before = sql(db_url, "SELECT tokens, refreshed_at FROM wl_stage_limits")
    for _ in range(3):
        assert limited_claim(store, run_id, paced) == []
    assert sql(db_url, "SELECT tokens, refreshed_at FROM wl_stage_limits") == before
    # and no fencing token was taken by the claims that found nothing
    (again,) = limited_claim(store, run_id, StageLimit(S2, None, 1, None), limit=1)
    assert again.lease_token == first.lease_token + 1


@pytest.mark.unit
def test_a_limit_that_cannot_be_met_is_refused_where_it_is_declared() -> None:
    job = Ledger("sqlite:///unused.db").job("j")
    for bad in ("50", "50/d", "-1/s", "0/s", "fast", 50):
        with pytest.raises(UsageError, match="rate_limit must look like"):
            job.stage("a", rate_limit=bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="burst goes with a rate_limit"):
        job.stage("a", burst=5)
    with pytest.raises(UsageError, match="max_in_flight must be a whole number"):
        job.stage("a", max_in_flight=0)
    stage = job.stage("a", rate_limit="600/m", burst=10)(lambda item, ctx: None)
    assert stage is not None and job.stages[0].rate is not None
    assert job.stages[0].rate.per_second == 10.0 and job.stages[0].burst == 10.0


@pytest.mark.unit
def test_the_bucket_arithmetic() -> None:
    assert parse_rate("50/s").per_second == 50.0
    assert parse_rate(" 90 / m ").per_second == 1.5
    assert parse_rate("7200/h").per_second == 2.0
    assert tokens_now(0.0, 0.5, 10.0, 3.0) == 3.0  # never above the burst
    assert tokens_now(0.2, 0.05, 10.0, 3.0) == pytest.approx(0.7)
    assert tokens_now(0.7, -5.0, 10.0, 3.0) == 0.7  # a clock that went back refills nothing
    assert tokens_now(0.0, 0.0, None, 3.0) == 3.0  # a cap only: no bucket to empty
    assert allowance(2.999, 0, None, 10) == 2  # whole tokens
    assert allowance(3.0 - 1e-12, 0, None, 10) == 3  # not lost to rounding
    assert allowance(5.0, 4, 6, 10) == 2  # the room under the cap
    assert allowance(5.0, 9, 6, 10) == 0  # over the cap (an operator lowered it)
    assert allowance(50.0, 0, None, 10) == 10  # no more than the claim wants


# -- four worker processes, one ledger ---------------------------------------------------------


def _workers(db_url: str, tmp_path: Path, n: int = 4) -> None:
    procs = [subprocess.Popen(cli_cmd("--db", db_url, "--app", "limits_app:ledger", "worker",
                                      "--until-idle", "--lease", "10", "--concurrency", "4"),
                              cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err


def _submit(db_url: str, tmp_path: Path, job: str, **payload: object) -> int:
    done_ = subprocess.run(cli_cmd("--db", db_url, "--app", "limits_app:ledger", "submit", job,
                                   "--payload", json.dumps(payload), "--json"),
                           cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                           timeout=120)
    assert done_.returncode == 0, done_.stderr
    return int(json.loads(done_.stdout)["run_id"])


def _most_in_any_window(times: list[float], width: float) -> int:
    times = sorted(times)
    most, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= width:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


def _sink(path: Path) -> list[tuple[str, int, float, float]]:
    out = []
    for line in path.read_text().splitlines():
        stage, seq, _pid, start, end = line.split()
        out.append((stage, int(seq), float(start), float(end)))
    return out


@pytest.mark.concurrency
def test_four_workers_never_claim_more_than_the_rate_in_any_second(db_url: str,
                                                                   tmp_path: Path) -> None:
    sink = tmp_path / "calls.log"
    run_id = _submit(db_url, tmp_path, "paced", n=100, sink=str(sink))
    _workers(db_url, tmp_path)
    claims = sql(db_url, "SELECT e.at FROM wl_events e JOIN wl_items i ON i.id = e.item_id "
                         "WHERE e.kind = 'claimed' AND i.stage = 'call' AND e.run_id = %s",
                 run_id)
    at = [datetime.fromisoformat(str(c[0])).timestamp() for c in claims]
    assert len(at) == 100
    # the bucket: 25 a second, a burst of 1, so at most 25 in any second, and the 100 claims
    # spread over at least (100 - 1) / 25 seconds
    assert _most_in_any_window(at, 1.0) <= 25
    assert max(at) - min(at) >= 99 / 25 - 0.05
    calls = _sink(sink)
    assert sorted(seq for stage, seq, _, _ in calls if stage == "call") == list(range(100))
    assert sorted(seq for stage, seq, _, _ in calls if stage == "after") == list(range(100))
    led = Ledger(db_url)
    try:
        assert led.status(run_id).state == "completed"
    finally:
        led.close()


@pytest.mark.concurrency
def test_four_workers_never_run_more_than_the_cap_at_once(db_url: str,
                                                         tmp_path: Path) -> None:
    sink = tmp_path / "calls.log"
    run_id = _submit(db_url, tmp_path, "capped", n=40, sink=str(sink), hold=0.05)
    _workers(db_url, tmp_path)
    calls = _sink(sink)
    assert sorted(seq for _, seq, _, _ in calls) == list(range(40))  # each ran once
    edges = sorted([(start, 1) for _, _, start, _ in calls] +
                   [(end, -1) for _, _, _, end in calls])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert most <= 3
    assert most >= 2  # the workers did run side by side: the cap, not one process, held it
    led = Ledger(db_url)
    try:
        assert led.status(run_id).state == "completed"
    finally:
        led.close()
