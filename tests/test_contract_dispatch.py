"""The storage port's part of dispatch through a broker (migration 0007), on both backends:
the claim by identity a broker task makes, and the bookkeeping of which pending items are owed
a message (``redispatch_at``, ``dispatches``) that lets the sweeper publish again what a broker
lost or a dying publisher never sent."""

from __future__ import annotations

from typing import Any

import pytest
from test_contract_store import (
    JOB,
    LONG,
    S1,
    S2,
    claim,
    decomposed,
    insert,
    poll,
    reclaim,
    rows,
    submit,
)
from test_migrations import raw
from writes_support import write_of

from workledger.storage import dispatching, open_store
from workledger.storage.port import (
    ClaimParams,
    DispatchMark,
    Finish,
    FinishParams,
    HoldBack,
    IdentityClaim,
    ItemsInsert,
    LeaseParams,
    NewItem,
    StageLimit,
    Store,
)

pytestmark = pytest.mark.contract


def by_identity(store: Store, run_id: int, seqs: list[int], stage: str = S1,
                lease: float = LONG, record_event: bool = False, job: str = JOB) -> list[Any]:
    return store.items_claim_by_identity(IdentityClaim(job, run_id, stage, seqs, lease,
                                                       actor="task-1", record_event=record_event))


def owed_at(url: str, run_id: int) -> dict[tuple[str, int], tuple[Any, int]]:
    """(stage, seq) -> (redispatch_at, dispatches), read with a plain driver connection."""
    p = "?" if url.startswith("sqlite") else "%s"
    with raw(url) as conn:
        found = conn.execute(f"SELECT stage, seq, redispatch_at, dispatches FROM wl_items "
                             f"WHERE run_id = {p}", (run_id,)).fetchall()
    return {(r[0], r[1]): (r[2], r[3]) for r in found}


def seconds_ahead(url: str, run_id: int, stage: str, seq: int) -> float:
    """How far in the future (database clock) the item's redispatch_at is (SQLite's julianday
    arithmetic is exact to about 0.1 ms, so compare with a margin)."""
    if url.startswith("sqlite"):
        sql = ("SELECT (julianday(redispatch_at) - julianday('now')) * 86400.0 FROM wl_items "
               "WHERE run_id = ? AND stage = ? AND seq = ?")
    else:
        sql = ("SELECT extract(epoch FROM redispatch_at - clock_timestamp()) FROM wl_items "
               "WHERE run_id = %s AND stage = %s AND seq = %s")
    with raw(url) as conn:
        return float(conn.execute(sql, (run_id, stage, seq)).fetchone()[0])


@pytest.fixture
def ledger(db_url: str) -> Any:
    store = open_store(db_url)
    store.migrate()
    yield store, db_url
    store.close()


# -- the claim by identity ----------------------------------------------------------------------


def test_claim_by_identity_takes_exactly_the_named_items_under_one_fresh_token(
        store: Store) -> None:
    run = decomposed(store, 10)
    earlier = claim(store, decomposed(store, 1, key="other").id)[0].lease_token
    got = by_identity(store, run.id, [2, 5, 7])
    assert [c.seq for c in got] == [2, 5, 7]
    assert len({c.lease_token for c in got}) == 1 and got[0].lease_token > earlier
    assert [c.key for c in got] == ["key-2", "key-5", "key-7"]
    assert got[0].data == {"seq": 2, "tag": ""}
    states = {r.seq: r.state for r in rows(store, run.id)}
    assert [s for s, st in states.items() if st == "claimed"] == [2, 5, 7]
    assert store.run_counts(run.id) == {S1: {"pending": 7, "claimed": 3}}


def test_a_copy_of_a_message_already_claimed_finds_nothing(store: Store) -> None:
    run = decomposed(store, 4)
    assert len(by_identity(store, run.id, [0, 1, 2, 3])) == 4
    assert by_identity(store, run.id, [0, 1, 2, 3]) == []
    assert by_identity(store, run.id, [3, 1]) == []


def test_claim_by_identity_takes_only_the_named_run_stage_and_seqs(store: Store) -> None:
    run, other = decomposed(store, 5), decomposed(store, 5, key="k2")
    assert by_identity(store, run.id, [1], stage=S2) == []  # no such stage row
    assert [c.seq for c in by_identity(store, run.id, [1, 99])] == [1]  # 99 names no item
    assert {r.state for r in rows(store, other.id)} == {"pending"}
    assert by_identity(store, run.id, []) == []
    assert by_identity(store, run.id, [2], job="another-job") == []  # not this run's job


def test_claim_by_identity_takes_nothing_before_the_run_is_decomposed_or_while_paused(
        store: Store) -> None:
    run = submit(store)
    insert(store, run.id, range(3))
    assert by_identity(store, run.id, [0, 1, 2]) == []
    store.run_mark_decomposed(run.id, S1)
    assert store.run_set_paused(run.id, True, "op", None)
    assert by_identity(store, run.id, [0, 1, 2]) == []
    assert store.run_set_paused(run.id, False, "op", None)
    assert len(by_identity(store, run.id, [0, 1, 2])) == 3


def test_claim_by_identity_takes_nothing_in_a_cancelled_run(store: Store) -> None:
    run = decomposed(store, 3)
    store.run_cancel(run.id, "op", None)
    assert by_identity(store, run.id, [0, 1, 2]) == []


def test_claim_by_identity_takes_a_retry_only_once_it_is_due(store: Store) -> None:
    run = decomposed(store, 1)
    (c,) = by_identity(store, run.id, [0])
    store.items_finish_if_leased(FinishParams(run.id, [Finish(c.id, c.lease_token,
                                                              write_of("pending"), delay=0.4)]))
    assert by_identity(store, run.id, [0]) == []
    again = poll(lambda: by_identity(store, run.id, [0]), "the retry to come due")
    assert again[0].lease_token > c.lease_token


def test_claim_by_identity_never_takes_the_closing_entry(store: Store) -> None:
    run = decomposed(store, 1)
    store.items_insert_many(ItemsInsert(run.id, "@close", [NewItem(0, None, None)]))
    assert by_identity(store, run.id, [0], stage="@close") == []
    assert store.items_claim(ClaimParams(run.id, 1, LONG, closing=True))


def test_claim_by_identity_records_claimed_events_for_full_history(store: Store) -> None:
    run = decomposed(store, 2)
    got = by_identity(store, run.id, [0, 1], record_event=True)
    events = [e for e in store.events_list(run.id) if e.kind == "claimed"]
    assert sorted(e.item_id for e in events) == sorted(c.id for c in got)
    assert {e.actor for e in events} == {"task-1"}


def test_a_claim_by_identity_is_fenced_like_any_claim(store: Store) -> None:
    run = decomposed(store, 1)
    (c,) = by_identity(store, run.id, [0], lease=0.2)
    poll(lambda: store.outlook([run.id]).expired == 1, "the lease to expire")
    assert len(reclaim(store)) == 1
    (d,) = by_identity(store, run.id, [0])
    stale = store.items_finish_if_leased(FinishParams(run.id, [Finish(
        c.id, c.lease_token, write_of("processed"))]))
    assert stale.stale == [c.id] and stale.applied == []
    assert store.items_finish_if_leased(FinishParams(run.id, [Finish(
        d.id, d.lease_token, write_of("processed"))])).applied == [d.id]


# -- what is owed a message --------------------------------------------------------------------


def test_a_ledger_without_a_broker_owes_nothing(ledger: Any) -> None:
    store, url = ledger
    run = decomposed(store, 3)
    (c,) = claim(store, run.id, limit=1)
    store.items_release(LeaseParams(run.id, [c.id], c.lease_token))
    assert store.items_owed(run.id, 100) == []
    assert {v for v in owed_at(url, run.id).values()} == {(None, 0)}


def test_owing_marks_every_pending_row_of_the_stage_page_by_page(
        ledger: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store, url = ledger
    monkeypatch.setattr(dispatching, "OWE_PAGE", 4)
    run = submit(store)
    insert(store, run.id, range(10))
    insert(store, run.id, [3], state="skipped")  # seq 3 exists already: ignored
    assert store.items_owe(run.id, S1, 0.0) == 10
    assert {d for _at, d in owed_at(url, run.id).values()} == {1}
    store.run_mark_decomposed(run.id, S1)
    assert sorted(seq for _s, seq in store.items_owed(run.id, 100)) == list(range(10))


def test_items_owed_later_are_not_owed_now(ledger: Any) -> None:
    store, url = ledger
    run = submit(store)
    insert(store, run.id, range(3))
    store.items_owe(run.id, S1, 3600.0)
    store.run_mark_decomposed(run.id, S1)
    assert store.items_owed(run.id, 100) == []
    assert 3500 < seconds_ahead(url, run.id, S1, 0) <= 3600.01


def test_pending_seqs_page_through_a_stage_in_id_order(store: Store) -> None:
    run = decomposed(store, 7)
    by_identity(store, run.id, [2])
    first = store.items_pending_seqs(run.id, S1, 0, 4)
    assert [s for _i, s in first] == [0, 1, 3, 4]
    rest = store.items_pending_seqs(run.id, S1, first[-1][0], 4)
    assert [s for _i, s in rest] == [5, 6]


def test_marking_dispatched_marks_only_pending_items_and_waits_longer_each_time(
        ledger: Any) -> None:
    store, url = ledger
    run = decomposed(store, 3)
    by_identity(store, run.id, [1])
    assert store.items_mark_dispatched(DispatchMark(run.id, S1, [0, 1, 2], wait=10.0)) == [0, 2]
    assert 9 < seconds_ahead(url, run.id, S1, 0) <= 10.01
    store.items_mark_dispatched(DispatchMark(run.id, S1, [0], wait=10.0))
    assert 19 < seconds_ahead(url, run.id, S1, 0) <= 20.01
    for _ in range(5):
        store.items_mark_dispatched(DispatchMark(run.id, S1, [0], wait=10.0))
    assert 159 < seconds_ahead(url, run.id, S1, 0) <= 160.01  # 2^4 at most
    assert owed_at(url, run.id)[(S1, 0)][1] == 7
    store.items_mark_dispatched(DispatchMark(run.id, S1, [2], wait=10.0, delay=100.0))
    assert 119 < seconds_ahead(url, run.id, S1, 2) <= 120.01  # a retry's delay, then the wait


def test_the_owed_are_pending_due_and_overdue_oldest_first(ledger: Any) -> None:
    store, url = ledger
    run = decomposed(store, 4)
    for seq in (3, 1, 0):  # owed now, in this order (each a few ms after the one before)
        store.items_mark_dispatched(DispatchMark(run.id, S1, [seq], wait=0.0))
        poll(lambda seq=seq: seconds_ahead(url, run.id, S1, seq) < -0.005, "time to pass")
    store.items_mark_dispatched(DispatchMark(run.id, S1, [2], wait=3600.0))  # fresh
    assert store.items_owed(run.id, 100) == [(S1, 3), (S1, 1), (S1, 0)]
    assert store.items_owed(run.id, 2) == [(S1, 3), (S1, 1)]
    by_identity(store, run.id, [1])
    assert store.items_owed(run.id, 100) == [(S1, 3), (S1, 0)]


def test_a_claimed_item_is_owed_a_message_as_soon_as_it_is_pending_again(store: Store) -> None:
    run = decomposed(store, 3)
    store.items_mark_dispatched(DispatchMark(run.id, S1, [0, 1, 2], wait=3600.0))
    a, b, c = by_identity(store, run.id, [0, 1, 2])
    store.items_release(LeaseParams(run.id, [a.id], a.lease_token))
    store.items_finish_if_leased(FinishParams(run.id, [
        Finish(b.id, b.lease_token, write_of("pending"), delay=0.3),
        Finish(c.id, c.lease_token, write_of("processed"))]))
    assert store.items_owed(run.id, 100) == [(S1, 0)]  # the retry is not due yet
    poll(lambda: len(store.items_owed(run.id, 100)) == 2, "the retry to come due")


def test_a_hand_off_row_is_owed_what_its_previous_row_was(ledger: Any) -> None:
    store, url = ledger
    run = decomposed(store, 2)
    store.items_mark_dispatched(DispatchMark(run.id, S1, [0, 1], wait=3600.0))
    got = by_identity(store, run.id, [0, 1])
    store.items_finish_if_leased(FinishParams(run.id, [
        Finish(i.id, i.lease_token, write_of("processed", last=False), next_stage=S2)
        for i in got]))
    # the publisher died before marking the hand-off's message: the sweeper owes it now
    assert store.items_owed(run.id, 100) == [(S2, 0), (S2, 1)]
    assert store.items_mark_dispatched(DispatchMark(run.id, S2, [0, 1], wait=3600.0)) == [0, 1]
    assert store.items_owed(run.id, 100) == []
    assert owed_at(url, run.id)[(S2, 0)][1] == 1


def test_a_hand_off_of_an_item_claimed_without_a_broker_owes_nothing(store: Store) -> None:
    run = decomposed(store, 1)
    got = claim(store, run.id)
    store.items_finish_if_leased(FinishParams(run.id, [
        Finish(i.id, i.lease_token, write_of("processed", last=False), next_stage=S2)
        for i in got]))
    assert store.items_owed(run.id, 100) == []
    assert store.run_counts(run.id) == {S1: {"processed": 1}, S2: {"pending": 1}}


# -- held back by a limited stage's bucket (migration 0013) ----------------------------------

SLOW = StageLimit(S1, rate=1.0, burst=1.0, max_in_flight=None)  # a token a second


def limited(store: Store, run_id: int, seqs: list[int], held: int | None = None) -> list[Any]:
    return store.items_claim_by_identity(IdentityClaim(JOB, run_id, S1, seqs, LONG,
                                                       limit=SLOW, held=held))


def hold(store: Store, run_id: int, seqs: list[int], held: int | None = None,
         may_wait: bool = False) -> Any:
    return store.items_hold_back(HoldBack(JOB, run_id, S1, seqs, SLOW, 60.0, held, may_wait))


def test_held_back_items_are_due_one_after_another_as_their_bucket_refills(
        ledger: Any) -> None:
    store, url = ledger
    run = decomposed(store, 4)
    assert [c.seq for c in limited(store, run.id, [0, 1, 2, 3])] == [0]  # the one token
    first = hold(store, run.id, [1, 2, 3])
    assert first.wait == 0 and [m.seqs for m in first.messages] == [(1,), (2,), (3,)]
    assert [round(m.delay) for m in first.messages] == [1, 2, 3]
    helds = [m.held for m in first.messages]  # ms apart, by the database's clock
    assert all(abs(b - a - 1000) <= 1 for a, b in zip(helds, helds[1:], strict=False))
    # the next message held back waits behind those: the bucket's horizon
    other = decomposed(store, 2, key="other")
    later = hold(store, other.id, [0, 1])
    assert [round(m.delay) for m in later.messages] == [4, 5]
    # each is owed a message from its due time on (redispatch_after 60 s, one message so far)
    assert 60 + 2.5 < seconds_ahead(url, run.id, S1, 3) < 60 + 3.5


def test_a_group_due_later_than_a_broker_holds_is_left_owed_for_the_sweeper(
        ledger: Any) -> None:
    store, url = ledger
    run = decomposed(store, 4)
    limited(store, run.id, [0, 1, 2, 3])
    got = store.items_hold_back(HoldBack(JOB, run.id, S1, [1, 2, 3], SLOW, 60.0,
                                         broker_hold=2.5))
    assert [m.seqs for m in got.messages] == [(1,), (2,)]  # the third: no message
    assert 2.5 < seconds_ahead(url, run.id, S1, 3) < 3.5  # owed from when it is due
    assert limited(store, run.id, [3]) == []  # held for the sweeper's message


def test_a_copy_of_a_held_back_message_claims_nothing_and_holds_nothing(store: Store) -> None:
    run = decomposed(store, 3)
    limited(store, run.id, [0, 1, 2])
    held = hold(store, run.id, [1, 2])
    assert len(held.messages) == 2
    # a copy of the first message (no hold of its own): its items are held for later
    assert limited(store, run.id, [1, 2]) == []
    assert hold(store, run.id, [1, 2]).messages == ()
    # the held message itself, delivered early: its bucket is short, so it is held again,
    # and a copy of it, holding the items until an earlier time, then finds nothing either
    h1 = held.messages[0].held
    assert limited(store, run.id, [1], held=h1) == []
    again = hold(store, run.id, [1], held=h1)
    assert [m.seqs for m in again.messages] == [(1,)] and again.messages[0].held > h1
    assert limited(store, run.id, [1], held=h1) == []
    assert hold(store, run.id, [1], held=h1).messages == ()
    assert len(limited(store, run.id, [1], held=again.messages[0].held)) <= 1


def test_a_held_message_short_of_its_token_by_a_moment_waits_in_place(store: Store) -> None:
    fast = StageLimit(S1, rate=1000.0, burst=1.0, max_in_flight=None)
    run = decomposed(store, 2)
    store.items_claim_by_identity(IdentityClaim(JOB, run.id, S1, [0], LONG, limit=fast))
    got = store.items_hold_back(HoldBack(JOB, run.id, S1, [1], fast, 60.0, 1, True))
    assert 0 < got.wait <= 0.001 + 1e-9 and got.messages == ()


def test_items_of_a_paused_run_or_claimed_already_are_not_held_back(store: Store) -> None:
    run = decomposed(store, 3)
    assert by_identity(store, run.id, [2])
    assert hold(store, run.id, [2]).messages == ()  # claimed: its holder publishes
    assert store.run_set_paused(run.id, True, "op", None)
    assert hold(store, run.id, [0, 1]).messages == ()  # its resume publishes


# -- plans: O(seqs) for a claim, O(owed) for the sweeper, at any run size -----------------------


@pytest.mark.counts_drift
def test_postgres_dispatch_statements_use_the_identity_index_and_the_owed_index(
        pg_url: str) -> None:
    import psycopg
    from test_claim_plan import FINISHED, _ledger_with_finished_rows

    from workledger.storage.queries import queries

    run_id = _ledger_with_finished_rows(pg_url)
    q = queries("postgres")
    seqs = list(range(FINISHED, FINISHED + 100))
    args = {
        "items_claim_by_identity": {"run_id": run_id, "job": "plan", "stage": "apply",
                                    "seqs": seqs, "lease": 30.0, "limit": len(seqs),
                                    "holder": None, "held": None},
        "items_holdable": {"run_id": run_id, "job": "plan", "stage": "apply", "seqs": seqs,
                           "held": 1},
        "items_mark_dispatched": {"run_id": run_id, "stage": "apply", "seqs": seqs,
                                  "wait": 60.0, "delay": 0.0},
        "items_owed": {"run_id": run_id, "limit": 1000},
    }
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE wl_items SET state = 'processed' WHERE seq < %s", (FINISHED,))
        conn.execute("ANALYZE wl_items")
        plans = {name: "\n".join(r[0] for r in conn.execute("EXPLAIN " + q[name], a))
                 for name, a in args.items()}
    for name in ("items_claim_by_identity", "items_mark_dispatched", "items_holdable"):
        assert "wl_items_run_id_stage_seq_key" in plans[name], f"{name}:\n{plans[name]}"
        assert "wl_items_claimable" not in plans[name], f"{name}:\n{plans[name]}"
    assert "wl_items_owed" in plans["items_owed"], plans["items_owed"]
    for name, plan in plans.items():
        assert "Seq Scan on wl_items" not in plan, f"{name}:\n{plan}"


@pytest.mark.counts_drift
def test_sqlite_dispatch_statements_use_the_identity_index_and_the_owed_index(
        sqlite_url: str) -> None:
    import sqlite3

    from test_claim_plan import _ledger_with_finished_rows

    from workledger.storage.queries import queries

    run_id = _ledger_with_finished_rows(sqlite_url)
    conn = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    q = queries("sqlite")
    seqs = json_list(range(45_000, 45_100))
    args = {
        "items_claim_by_identity": {"token": 1, "lease": "+30 seconds", "run_id": run_id,
                                    "job": "plan", "stage": "apply", "seqs": seqs,
                                    "limit": 100, "holder": None, "held": None},
        "items_holdable": {"run_id": run_id, "job": "plan", "stage": "apply", "seqs": seqs,
                           "held": 1},
        "items_mark_dispatched": {"run_id": run_id, "stage": "apply", "seqs": seqs,
                                  "wait": 60.0, "delay": 0.0},
        "items_owed": {"run_id": run_id, "limit": 1000, "wait": 60.0},
    }
    plans = {name: " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + q[name], a))
             for name, a in args.items()}
    conn.close()
    for name in ("items_claim_by_identity", "items_mark_dispatched", "items_holdable"):
        assert "sqlite_autoindex_wl_items_1" in plans[name], f"{name}: {plans[name]}"
    assert "wl_items_owed" in plans["items_owed"], plans["items_owed"]
    for name, plan in plans.items():
        assert "SCAN wl_items " not in plan + " ", f"{name}: {plan}"


def json_list(values: Any) -> str:
    import json

    return json.dumps(list(values))
