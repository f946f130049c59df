"""Per-key concurrency (issue 25, part 4): ``Item(key=..., concurrency_key="acct-42")`` and
``@job.stage(..., max_per_key=N)``: over every worker and every run of the job, at most N items
of the stage with the same concurrency key are claimed at once, counted from the claimed rows
themselves (no counter a dead worker can leak: an expired lease frees its slot when the
sweeper takes it back). Items without a key are not limited; items held back by their key do
not block other keys' items behind them; later stages inherit the first stage's key.

The port on both backends first; then the facade; then worker processes.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_cli import cli_cmd, cli_env
from test_contract_store import LONG, S1, S2, done, finish, submit
from waiting import poll

from workledger import Item, Ledger
from workledger.core.rates import pick_by_key
from workledger.errors import UsageError
from workledger.storage.port import (
    ClaimedItem,
    ClaimParams,
    ItemsInsert,
    ItemsQuery,
    NewItem,
    ReclaimParams,
    StageLimit,
    Store,
)

JOB = "ingest"
ONE = StageLimit(S1, rate=None, burst=1.0, max_in_flight=None, max_per_key=1)


def keyed_run(store: Store, name: str, keys: list[str | None], stage: str = S1) -> int:
    """A decomposed run with one pending item of ``stage`` per entry of ``keys``."""
    run = submit(store, name)
    store.items_insert_many(ItemsInsert(run.id, stage, [
        NewItem(seq, f"u{seq}", "{}", concurrency_key=k) for seq, k in enumerate(keys)]))
    store.run_mark_decomposed(run.id, S1)
    return run.id


def claim(store: Store, run_id: int, *limits: StageLimit, limit: int = 100,
          stages: tuple[str, ...] = (S1,), lease: float = LONG) -> list[ClaimedItem]:
    return store.items_claim(ClaimParams(run_id, limit, lease, job=JOB, stages=stages,
                                         limits=limits))


def finish_all(store: Store, run_id: int, items: list[ClaimedItem]) -> None:
    finish(store, run_id, *(done(c) for c in items))


# -- the pure selection ------------------------------------------------------------------------


@pytest.mark.unit
def test_the_selection_takes_each_key_up_to_its_slots_and_never_stops_at_a_held_key() -> None:
    rows = [(1, "a"), (2, "a"), (3, "b"), (4, None), (5, "a"), (6, "c"), (7, None), (8, "b")]
    assert pick_by_key(rows, {}, 1, 100) == [1, 3, 4, 6, 7]
    assert pick_by_key(rows, {"a": 1}, 1, 100) == [3, 4, 6, 7]  # a is full: b, c behind it
    assert pick_by_key(rows, {"a": 1}, 2, 100) == [1, 3, 4, 6, 7, 8]
    assert pick_by_key(rows, {}, 1, 3) == [1, 3, 4]  # no more than the claim wants
    assert pick_by_key(rows, {"a": 5, "b": 1, "c": 1}, 1, 100) == [4, 7]  # keyless: no limit


# -- the port, on both backends ----------------------------------------------------------------


@pytest.mark.contract
def test_a_claim_takes_one_item_per_key_and_the_keys_behind_a_held_one(store: Store) -> None:
    run_id = keyed_run(store, "r", ["a", "a", "a", "b", None, "c", "b", None])
    first = claim(store, run_id, ONE)
    assert [c.seq for c in first] == [0, 3, 4, 5, 7]
    assert claim(store, run_id, ONE) == []  # a, b and c each have one in flight
    finish_all(store, run_id, [c for c in first if c.seq == 0])
    assert [c.seq for c in claim(store, run_id, ONE)] == [1]  # a's next, and only it
    two = StageLimit(S1, rate=None, burst=1.0, max_in_flight=None, max_per_key=2)
    assert [c.seq for c in claim(store, run_id, two)] == [2, 6]


@pytest.mark.contract
def test_the_limit_counts_every_run_of_the_job(store: Store) -> None:
    one = keyed_run(store, "one", ["acct-1", "acct-2"])
    other = keyed_run(store, "other", ["acct-1", "acct-3"])
    assert [c.seq for c in claim(store, one, ONE)] == [0, 1]
    assert [c.seq for c in claim(store, other, ONE)] == [1]  # acct-1 is held by run one


@pytest.mark.contract
def test_an_expired_lease_holds_its_slot_until_the_sweeper_takes_it_back(store: Store) -> None:
    run_id = keyed_run(store, "r", ["a", "a"])
    assert [c.seq for c in claim(store, run_id, ONE, lease=0.05)] == [0]
    time.sleep(0.3)
    assert claim(store, run_id, ONE) == []  # expired, still claimed: still holds the slot
    store.leases_reclaim_expired(ReclaimParams(to_state="pending", reason="lease expired",
                                               job=JOB, stage=S1, limit=100))
    assert [c.seq for c in claim(store, run_id, ONE)] == [0]


@pytest.mark.contract
def test_a_later_stage_inherits_the_first_stages_key(store: Store) -> None:
    run_id = keyed_run(store, "r", ["a", "a", "b"])
    first = claim(store, run_id)  # S1 is not limited here
    finish(store, run_id, *(done(c, unit=None, next_stage=S2) for c in first))
    second = StageLimit(S2, rate=None, burst=1.0, max_in_flight=None, max_per_key=1)
    assert [c.seq for c in claim(store, run_id, second, stages=(S2,))] == [0, 2]
    rows = store.items_list(ItemsQuery(run_id, stage=S2))
    assert [(r.seq, r.concurrency_key) for r in rows] == [(0, "a"), (1, "a"), (2, "b")]


# -- the facade --------------------------------------------------------------------------------


def _ledger(url: str, peak: Counter[str], lock: threading.Lock) -> Ledger:
    led = Ledger(url)
    job = led.job("postings")
    running: Counter[str] = Counter()

    @job.decompose
    def _split(payload: dict[str, Any]) -> Any:
        for i in range(int(payload["n"])):
            account = None if i % 7 == 6 else f"acct-{i % 3}"
            yield Item(key=f"p{i}", data={"account": account}, concurrency_key=account)

    @job.stage("post", idempotent=True, max_per_key=1)
    def _post(item: Any, ctx: Any) -> None:
        account = item.data["account"] or "none"
        with lock:
            running[account] += 1
            peak[account] = max(peak[account], running[account])
        time.sleep(0.005)
        with lock:
            running[account] -= 1

    return led


@pytest.mark.integration
def test_eight_threads_never_post_two_items_of_one_account_at_once(db_url: str) -> None:
    peak: Counter[str] = Counter()
    led = _ledger(db_url, peak, threading.Lock())
    try:
        sub = led.submit("postings", {"n": 70})
        led.work(concurrency=8, chunk=20, until_idle=True)
        assert led.status(sub.run_id).processed == 70
        assert peak["acct-0"] == peak["acct-1"] == peak["acct-2"] == 1, peak
        assert peak["none"] > 1, peak  # items without a key are not limited
    finally:
        led.close()


@pytest.mark.unit
@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_a_bad_max_per_key_is_refused_where_it_is_declared(bad: Any) -> None:
    led = Ledger("sqlite:///:memory:")
    job = led.job("j")
    with pytest.raises(UsageError, match="max_per_key"):
        job.stage("s", max_per_key=bad)(lambda item, ctx: None)


@pytest.mark.integration
def test_an_unusable_concurrency_key_skips_its_item_with_the_reason(db_url: str) -> None:
    led = Ledger(db_url)
    job = led.job("j")

    @job.decompose
    def _split(payload: Any) -> Any:
        yield Item(key="ok", concurrency_key="acct-1")
        yield Item(key="nul", concurrency_key="a\x00b")
        yield Item(key="long", concurrency_key="x" * 201)
        yield Item(key="number", concurrency_key=42)

    job.stage("s", idempotent=True, max_per_key=1)(lambda item, ctx: None)
    try:
        sub = led.submit("j", {})
        assert (sub.status.total, sub.status.skipped) == (4, 2)
        rows = {r.key: r for r in led.items(sub.run_id)}
        assert rows["ok"].concurrency_key == "acct-1" and rows["number"].concurrency_key == "42"
        assert "concurrency key" in (rows["nul"].error or "")
        assert "concurrency key" in (rows["long"].error or "")
    finally:
        led.close()


# -- real worker processes ---------------------------------------------------------------------


@pytest.mark.concurrency
def test_four_worker_processes_never_run_two_items_of_one_key_at_once(
        db_url: str, tmp_path: Path) -> None:
    sink = tmp_path / "calls.log"
    got = subprocess.run(cli_cmd("--db", db_url, "--app", "limits_app:ledger", "submit", "keyed",
                                 "--json", "--payload",
                                 json.dumps({"n": 120, "sink": str(sink), "hold": 0.02})),
                         cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0, got.stderr
    workers = [subprocess.Popen(cli_cmd("--db", db_url, "--app", "limits_app:ledger", "worker",
                                        "--until-idle", "--chunk", "2", "--concurrency", "2"),
                                cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        poll(lambda: sink.exists() and len(sink.read_text().splitlines()) >= 5, timeout=60,
             what="the postings under way")
        for p in workers:
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, err
    finally:
        for p in workers:
            p.kill()
    calls = [line.split() for line in sink.read_text().splitlines()]
    assert len(calls) == 120
    by_key: dict[int, list[tuple[float, float]]] = {}
    for _stage, seq, _pid, start, end in calls:
        by_key.setdefault(int(seq) % 4, []).append((float(start), float(end)))
    for key, spans in by_key.items():  # the keyed app's key: seq % 4
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end - 0.002, (key, spans)
    assert len({pid for _, _, pid, _, _ in calls}) >= 2

