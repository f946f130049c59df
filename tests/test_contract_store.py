"""The storage port's contract: every behaviour once, on SQLite and on PostgreSQL.

Each test takes the ``store`` fixture, a migrated store on a fresh database per backend. Waits on
time (leases, retry delays) poll the ledger with a deadline; nothing sleeps a fixed time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from waiting import poll
from writes_support import write_of

from workledger import failpoints
from workledger.storage import open_store
from workledger.storage.port import (
    ClaimedItem,
    ClaimParams,
    EventRow,
    Finish,
    FinishParams,
    FinishResult,
    ItemRow,
    ItemsInsert,
    ItemsQuery,
    LeaseParams,
    NewEvent,
    NewItem,
    NewRun,
    ReclaimParams,
    RunRow,
    Store,
)
from workledger.storage.queries import migrations

pytestmark = pytest.mark.contract

JOB = "ingest"
S1, S2 = "generate", "deliver"
LONG = 60.0  # a lease that will not run out during a test
SHORT = 0.2  # a lease a test waits out (by polling)



# -- helpers ---------------------------------------------------------------------------------


def submit(store: Store, key: str = "k1", job: str = JOB) -> RunRow:
    run, _created = store.run_submit(NewRun(job, key, json.dumps({"key": key})))
    return run


def new_items(
    seqs: Iterable[int], state: str = "pending", error: str | None = None, tag: str = ""
) -> list[NewItem]:
    return [
        NewItem(
            seq=s,
            key=f"key-{s}{tag}",
            data=json.dumps({"seq": s, "tag": tag}),
            state=state,
            error=error,
        )
        for s in seqs
    ]


def insert(
    store: Store,
    run_id: int,
    seqs: Iterable[int],
    stage: str = S1,
    state: str = "pending",
    error: str | None = None,
    tag: str = "",
) -> int:
    return store.items_insert_many(ItemsInsert(run_id, stage, new_items(seqs, state, error, tag)))


def decomposed(store: Store, n: int, key: str = "k1", job: str = JOB) -> RunRow:
    run = submit(store, key, job)
    insert(store, run.id, range(n))
    return store.run_mark_decomposed(run.id, S1)


def rows(store: Store, run_id: int, **kw: Any) -> list[ItemRow]:
    return store.items_list(ItemsQuery(run_id, **kw))


def run_of(store: Store, run_id: int) -> RunRow:
    found = store.run_get(run_id)
    assert found is not None, f"run {run_id} not found"
    return found


def row(store: Store, run_id: int, item_id: int) -> ItemRow:
    (found,) = [r for r in rows(store, run_id) if r.id == item_id]
    return found


def claim(
    store: Store,
    run_id: int,
    limit: int = 100,
    lease: float = LONG,
    after_id: int = 0,
    record_event: bool = False,
) -> list[ClaimedItem]:
    return store.items_claim(
        ClaimParams(
            run_id=run_id,
            limit=limit,
            lease_seconds=lease,
            after_id=after_id,
            record_event=record_event,
        )
    )


def finish(store: Store, run_id: int, *finishes: Finish) -> FinishResult:
    return store.items_finish_if_leased(FinishParams(run_id, finishes))


def done(c: ClaimedItem, state: str = "processed", unit: str | None = "", **kw: Any) -> Finish:
    """The fenced finish of a claimed item under the token it was claimed with.

    ``unit`` defaults to the counter a terminal state moves (none for pending or unknown).
    """
    kw.pop("event", None)  # the write names its event kind
    write = write_of(state, last=unit is not None, record=False)
    return Finish(id=c.id, lease_token=c.lease_token, write=write, **kw)


def lease(
    c: ClaimedItem | Iterable[ClaimedItem], token: int | None = None, seconds: float = 0.0
) -> LeaseParams:
    held = [c] if isinstance(c, ClaimedItem) else list(c)
    return LeaseParams(
        held[0].run_id,
        [i.id for i in held],
        held[0].lease_token if token is None else token,
        seconds,
    )



def wait_expired(store: Store, run_id: int, n: int) -> None:
    poll(lambda: store.outlook([run_id]).expired == n, f"{n} expired leases in run {run_id}",
         timeout=10.0, every=0.02)


def item_events(store: Store, run_id: int) -> list[EventRow]:
    """The history of a run's items (run milestones such as 'submitted' left out)."""
    return [e for e in store.events_list(run_id) if e.item_id is not None]


def ts(text: str | None) -> datetime:
    assert text is not None
    return datetime.fromisoformat(text)


def seconds_between(a: str | None, b: str | None) -> float:
    return (ts(b) - ts(a)).total_seconds()


def reclaim(
    store: Store,
    job: str = JOB,
    stage: str = S1,
    to_state: str = "pending",
    reason: str = "lease_expired",
) -> list[ItemRow]:
    return store.leases_reclaim_expired(ReclaimParams(job, stage, to_state, reason))


# -- schema ----------------------------------------------------------------------------------


def test_migrate_applies_every_version_once_and_then_nothing(db_url: str) -> None:
    store = open_store(db_url)
    try:
        versions = [v for v, _, _ in migrations(store.dialect)]
        assert store.schema_version() == 0
        assert store.migrate() == versions
        assert store.schema_version() == versions[-1]
        assert store.migrate() == []
        assert store.schema_version() == versions[-1]
    finally:
        store.close()


def test_migrate_on_a_migrated_store_applies_nothing(store: Store) -> None:
    assert store.migrate() == []
    assert store.schema_version() == migrations(store.dialect)[-1][0]


# -- runs ------------------------------------------------------------------------------------


def test_submit_creates_a_run_with_its_payload_retained(store: Store) -> None:
    run, created = store.run_submit(NewRun(JOB, "import-1", json.dumps({"events": [1, 2]})))
    assert created is True
    assert (run.job, run.idempotency_key, run.payload) == (JOB, "import-1", {"events": [1, 2]})
    assert run.created_at
    assert (run.decomposed_at, run.completed_at, run.paused_at, run.cancelled_at) == (None,) * 4
    assert (run.total, run.processed, run.failed, run.skipped, run.error) == (0, 0, 0, 0, None)
    # readers get the run without its payload (it can be large and none shows it)
    assert store.run_get(run.id) == replace(run, payload=None)
    assert store.runs_list() == [replace(run, payload=None)]
    assert store.run_payload(run.id) == {"events": [1, 2]}


def test_runs_list_pages_back_by_id_and_counts_what_is_left(store: Store) -> None:
    ids = [store.run_submit(NewRun(JOB, f"k{i}", "{}"))[0].id for i in range(5)]
    assert [r.id for r in store.runs_list(2)] == ids[:-3:-1]
    assert [r.id for r in store.runs_list(2, before=ids[3])] == [ids[2], ids[1]]
    assert store.runs_count() == 5 and store.runs_count(before=ids[1]) == 1


def test_submit_with_an_existing_key_returns_the_existing_run_unchanged(store: Store) -> None:
    first, _ = store.run_submit(NewRun(JOB, "import-1", json.dumps({"v": 1})))
    again, created = store.run_submit(NewRun(JOB, "import-1", json.dumps({"v": 2})))
    assert created is False
    assert again == first
    assert again.payload == {"v": 1}  # never overwritten by the second submission
    assert [r.id for r in store.runs_list()] == [first.id]


def test_the_same_key_under_another_job_is_another_run(store: Store) -> None:
    a, _ = store.run_submit(NewRun("alpha", "same", "{}"))
    b, created = store.run_submit(NewRun("beta", "same", "{}"))
    assert created is True
    assert a.id != b.id


def test_runs_list_is_newest_first_and_limited(store: Store) -> None:
    ids = [submit(store, f"k{i}").id for i in range(3)]
    assert [r.id for r in store.runs_list()] == ids[::-1]
    assert [r.id for r in store.runs_list(limit=2)] == ids[:0:-1]


def test_run_get_of_a_missing_run_is_none(store: Store) -> None:
    assert store.run_get(987654) is None


def test_run_record_error_keeps_the_reason_and_decomposition_clears_it(store: Store) -> None:
    run = submit(store)
    store.run_record_error(run.id, "decomposer raised: KeyError 'events'")
    assert run_of(store, run.id).error == "decomposer raised: KeyError 'events'"
    insert(store, run.id, range(2))
    assert store.run_mark_decomposed(run.id, S1).error is None


# -- decomposition ---------------------------------------------------------------------------


def test_repeated_insert_adds_only_the_missing_rows(store: Store) -> None:
    run = submit(store)
    assert insert(store, run.id, range(5)) == 5
    assert insert(store, run.id, range(10), tag="-again") == 5
    assert insert(store, run.id, range(10)) == 0
    assert store.items_insert_many(ItemsInsert(run.id, S1, [])) == 0
    got = rows(store, run.id)
    assert [r.seq for r in got] == list(range(10))
    # existing rows are kept as they were, not overwritten by the repeat
    assert [r.key for r in got[:5]] == [f"key-{s}" for s in range(5)]
    assert [r.key for r in got[5:]] == [f"key-{s}-again" for s in range(5, 10)]


def test_the_same_seq_in_another_stage_or_run_is_another_row(store: Store) -> None:
    a, b = submit(store, "a"), submit(store, "b")
    assert insert(store, a.id, [0]) == 1
    assert insert(store, a.id, [0], stage=S2) == 1
    assert insert(store, b.id, [0]) == 1
    assert len(rows(store, a.id)) == 2
    assert len(rows(store, b.id)) == 1


def test_inserted_rows_carry_identity_data_and_reason(store: Store) -> None:
    run = submit(store)
    insert(store, run.id, [0])
    insert(store, run.id, [1], state="skipped", error="invalid timestamp")
    first, second = rows(store, run.id)
    assert (first.stage, first.seq, first.key, first.data) == (
        S1,
        0,
        "key-0",
        {"seq": 0, "tag": ""},
    )
    assert (first.state, first.attempts, first.lease_token, first.error) == (
        "pending",
        0,
        None,
        None,
    )
    assert (second.state, second.error) == ("skipped", "invalid timestamp")
    assert first.created_at and first.updated_at


def test_mark_decomposed_counts_total_and_skipped_from_rows(store: Store) -> None:
    run = submit(store)
    insert(store, run.id, range(3))
    insert(store, run.id, range(3, 5), state="skipped", error="invalid")
    marked = store.run_mark_decomposed(run.id, S1)
    assert marked.decomposed_at is not None
    assert (marked.total, marked.skipped, marked.processed, marked.failed) == (5, 2, 0, 0)
    assert marked.completed_at is None
    assert store.run_get(run.id) == marked


def test_total_counts_only_first_stage_rows(store: Store) -> None:
    run = submit(store)
    insert(store, run.id, range(3))
    insert(store, run.id, range(2), stage=S2)
    assert store.run_mark_decomposed(run.id, S1).total == 3


def test_repeated_mark_decomposed_keeps_the_first_time_and_recounts(store: Store) -> None:
    run = submit(store)
    insert(store, run.id, range(2))
    first = store.run_mark_decomposed(run.id, S1)
    insert(store, run.id, range(4))
    second = store.run_mark_decomposed(run.id, S1)
    assert second.decomposed_at == first.decomposed_at
    assert second.total == 4 == len(rows(store, run.id))


def test_a_run_of_only_skipped_items_is_complete_once_decomposed(store: Store) -> None:
    run = submit(store)
    insert(store, run.id, range(2), state="skipped", error="invalid")
    marked = store.run_mark_decomposed(run.id, S1)
    assert marked.completed_at is not None
    assert (marked.total, marked.skipped) == (2, 2)


def test_items_are_not_claimable_before_the_run_is_decomposed(store: Store) -> None:
    run = submit(store)
    insert(store, run.id, range(3))
    assert claim(store, run.id) == []
    assert store.runs_claimable([JOB]) == []
    assert {r.state for r in rows(store, run.id)} == {"pending"}
    store.run_mark_decomposed(run.id, S1)
    assert store.runs_claimable([JOB]) == [(run.id, JOB, 0, None, 1)]
    assert len(claim(store, run.id)) == 3


def test_skipped_rows_are_never_claimed(store: Store) -> None:
    run = submit(store)
    insert(store, run.id, range(2))
    insert(store, run.id, [2], state="skipped", error="invalid")
    store.run_mark_decomposed(run.id, S1)
    assert [c.seq for c in claim(store, run.id)] == [0, 1]


# -- claims ----------------------------------------------------------------------------------


def test_claim_takes_at_most_limit_rows_in_id_order_under_one_fresh_token(store: Store) -> None:
    run = decomposed(store, 5)
    ids = [r.id for r in rows(store, run.id)]
    first = claim(store, run.id, limit=2)
    second = claim(store, run.id, limit=2)
    third = claim(store, run.id, limit=2)
    assert [c.id for c in first] == ids[:2]
    assert [c.id for c in second] == ids[2:4]
    assert [c.id for c in third] == ids[4:]
    tokens = [{c.lease_token for c in chunk} for chunk in (first, second, third)]
    assert all(len(t) == 1 for t in tokens)  # one token per claim
    assert len(set.union(*tokens)) == 3  # a fresh one each time
    assert claim(store, run.id) == []


def test_claim_returns_identity_and_marks_rows_claimed_under_its_token(store: Store) -> None:
    run = decomposed(store, 1)
    (c,) = claim(store, run.id)
    assert (c.run_id, c.stage, c.seq, c.key, c.data) == (
        run.id,
        S1,
        0,
        "key-0",
        {"seq": 0, "tag": ""},
    )
    assert (c.attempts, c.error) == (0, None)
    r = row(store, run.id, c.id)
    assert (r.state, r.lease_token) == ("claimed", c.lease_token)


def test_claim_does_not_charge_attempts(store: Store) -> None:
    run = decomposed(store, 2)
    claim(store, run.id)
    assert [r.attempts for r in rows(store, run.id)] == [0, 0]


def test_lease_until_is_set_by_the_database_for_the_lease_asked(store: Store) -> None:
    run = decomposed(store, 2)
    a, b = claim(store, run.id, limit=1, lease=LONG) + claim(store, run.id, limit=1, lease=5.0)
    ra, rb = row(store, run.id, a.id), row(store, run.id, b.id)
    # claim writes updated_at and lease_until from the same database clock reading
    assert seconds_between(ra.updated_at, ra.lease_until) == pytest.approx(LONG, abs=0.01)
    assert seconds_between(rb.updated_at, rb.lease_until) == pytest.approx(5.0, abs=0.01)


def test_rows_under_a_live_lease_are_not_claimed_again(store: Store) -> None:
    run = decomposed(store, 3)
    held = claim(store, run.id, limit=2)
    again = claim(store, run.id)
    assert {c.id for c in again}.isdisjoint({c.id for c in held})
    assert len(again) == 1
    assert claim(store, run.id) == []


def test_claim_after_id_starts_past_the_cursor(store: Store) -> None:
    run = decomposed(store, 5)
    ids = [r.id for r in rows(store, run.id)]
    assert [c.id for c in claim(store, run.id, after_id=ids[2])] == ids[3:]
    assert claim(store, run.id, after_id=ids[4]) == []
    assert [c.id for c in claim(store, run.id, after_id=0)] == ids[:3]


def test_claim_is_scoped_to_its_run(store: Store) -> None:
    a, b = decomposed(store, 2, key="a"), decomposed(store, 2, key="b")
    assert {c.run_id for c in claim(store, a.id)} == {a.id}
    assert {r.state for r in rows(store, b.id)} == {"pending"}


def test_claim_with_record_event_writes_one_claimed_event_per_item(store: Store) -> None:
    run = decomposed(store, 2)
    chunk = claim(store, run.id, record_event=True)
    events = item_events(store, run.id)
    assert [(e.kind, e.item_id, e.lease_token) for e in events] == [
        ("claimed", c.id, c.lease_token) for c in chunk
    ]


def test_plain_claim_writes_no_history(store: Store) -> None:
    run = decomposed(store, 2)
    claim(store, run.id)
    assert item_events(store, run.id) == []


def test_paused_run_is_not_claimable_until_resumed(store: Store) -> None:
    run = decomposed(store, 2)
    assert store.run_set_paused(run.id, True, "test", None) is True
    assert run_of(store, run.id).paused_at is not None
    assert claim(store, run.id) == []
    assert store.runs_claimable([JOB]) == []
    assert store.run_set_paused(run.id, False, "test", None) is True
    assert store.runs_claimable([JOB]) == [(run.id, JOB, 0, None, 1)]
    assert len(claim(store, run.id)) == 2


def test_an_item_given_back_in_a_cancelled_run_is_skipped_not_left_pending(
    store: Store,
) -> None:
    run = decomposed(store, 3)
    (held,) = claim(store, run.id, limit=1)
    assert store.run_cancel(run.id, "test", None) == 2  # the two pending items
    cancelled = [r for r in rows(store, run.id) if r.id != held.id]
    assert [(r.state, r.error) for r in cancelled] == [("skipped", "cancelled")] * 2
    assert store.items_release(lease(held)) == 1  # its holder gives it back
    assert (row(store, run.id, held.id).state, row(store, run.id, held.id).error) == (
        "skipped", "cancelled")  # nothing would ever claim it in a cancelled run
    assert claim(store, run.id) == []
    assert store.runs_claimable([JOB]) == []
    assert store.run_get(run.id).skipped == 3


def test_runs_claimable_lists_decomposed_open_runs_of_the_given_jobs(store: Store) -> None:
    a = decomposed(store, 1, key="a", job="alpha")
    b = decomposed(store, 1, key="b", job="beta")
    undecomposed = submit(store, "c", job="alpha")
    insert(store, undecomposed.id, [0])
    finished = submit(store, "d", job="alpha")
    insert(store, finished.id, [0], state="skipped", error="invalid")
    store.run_mark_decomposed(finished.id, S1)
    assert store.runs_claimable(["alpha"]) == [(a.id, "alpha", 0, None, 1)]
    assert store.runs_claimable(["alpha", "beta"]) == [(a.id, "alpha", 0, None, 1),
                                                       (b.id, "beta", 0, None, 1)]
    assert store.runs_claimable(["gamma"]) == []


# -- fenced finish ---------------------------------------------------------------------------


def test_finish_with_the_holders_token_applies(store: Store) -> None:
    run = decomposed(store, 1)
    (c,) = claim(store, run.id)
    result = finish(store, run.id, done(c, result=json.dumps({"ok": True})))
    assert (result.applied, result.stale) == ([c.id], [])
    r = row(store, run.id, c.id)
    assert (r.state, r.result, r.error, r.lease_until, r.attempts) == (
        "processed",
        {"ok": True},
        None,
        None,
        1,
    )
    assert item_events(store, run.id) == []  # the happy path leaves no history row


def test_finish_writes_a_whole_chunk_and_reports_applied_and_stale(store: Store) -> None:
    run = decomposed(store, 3)
    a, b, c = claim(store, run.id)
    bad = Finish(id=c.id, lease_token=c.lease_token + 1000, write=write_of("processed"))
    result = finish(store, run.id, done(a), done(b, "failed", error="gone"), bad)
    assert sorted(result.applied) == [a.id, b.id]
    assert result.stale == [c.id]
    assert [r.state for r in rows(store, run.id)] == ["processed", "failed", "claimed"]


def test_stale_token_finish_changes_nothing_and_is_recorded(store: Store) -> None:
    run = decomposed(store, 1)
    (c,) = claim(store, run.id)
    before = rows(store, run.id)
    wrong = c.lease_token + 1000
    result = finish(
        store,
        run.id,
        Finish(id=c.id, lease_token=wrong, write=write_of("processed"), result='"late"'),
    )
    assert (result.applied, result.stale) == ([], [c.id])
    assert rows(store, run.id) == before
    assert run_of(store, run.id).processed == 0
    (event,) = item_events(store, run.id)
    assert (event.kind, event.item_id, event.lease_token) == ("stale_result", c.id, wrong)


def test_finish_under_a_released_lease_is_stale_after_another_claim(store: Store) -> None:
    run = decomposed(store, 1)
    (old,) = claim(store, run.id)
    store.items_release(lease(old))
    (new,) = claim(store, run.id)
    assert new.lease_token != old.lease_token
    assert finish(store, run.id, done(old)).stale == [old.id]
    assert row(store, run.id, new.id).state == "claimed"
    assert finish(store, run.id, done(new)).applied == [new.id]


@pytest.mark.parametrize("first", ["processed", "failed", "skipped"])
def test_a_terminal_item_can_never_be_finished_again(store: Store, first: str) -> None:
    run = decomposed(store, 1)
    (c,) = claim(store, run.id)
    assert finish(store, run.id, done(c, first, error="reason")).applied == [c.id]
    terminal = rows(store, run.id)
    counters = store.run_get(run.id)
    for later in ("processed", "failed", "skipped", "pending", "unknown"):
        assert finish(store, run.id, done(c, later, error="again")).stale == [c.id]
    assert store.items_heartbeat(lease(c, seconds=LONG)) == 0
    assert store.items_release(lease(c)) == 0
    assert store.items_mark_started(lease(c)) == []
    assert claim(store, run.id) == []
    assert rows(store, run.id) == terminal
    assert store.run_get(run.id) == counters


def test_retry_with_delay_is_not_claimable_until_not_before(store: Store) -> None:
    run = decomposed(store, 1)
    (c,) = claim(store, run.id)
    started = time.monotonic()
    finish(store, run.id, done(c, "pending", error="busy", delay=0.3))
    r = row(store, run.id, c.id)
    assert (r.state, r.error, r.lease_until) == ("pending", "busy", None)
    assert seconds_between(r.updated_at, r.not_before) == pytest.approx(0.3, abs=0.01)
    assert claim(store, run.id) == []
    outlook = store.outlook([run.id])
    assert (outlook.ready, outlook.waiting) == (0, 1)
    again = poll(lambda: claim(store, run.id), "the retry to become claimable", timeout=10.0,
                 every=0.02)
    assert time.monotonic() - started >= 0.28
    assert [(i.id, i.error, i.attempts) for i in again] == [(c.id, "busy", 1)]


def test_retry_without_delay_is_claimable_at_once(store: Store) -> None:
    run = decomposed(store, 1)
    (c,) = claim(store, run.id)
    finish(store, run.id, done(c, "pending", error="flaky"))
    assert row(store, run.id, c.id).not_before is None
    (again,) = claim(store, run.id)
    assert (again.id, again.error) == (c.id, "flaky")
    assert again.lease_token != c.lease_token


def test_finish_charge_adds_exactly_that_many_attempts(store: Store) -> None:
    run = decomposed(store, 2)
    a, b = claim(store, run.id)
    finish(store, run.id, done(a, charge=0), done(b, charge=1))
    assert [r.attempts for r in rows(store, run.id)] == [0, 1]


def test_an_execution_charged_when_it_started_is_not_charged_again(store: Store) -> None:
    run = decomposed(store, 1)
    (c,) = claim(store, run.id)
    assert store.items_mark_started(lease(c)) == [c.id]
    finish(store, run.id, done(c, "pending", error="busy", charge=0))
    (again,) = claim(store, run.id)
    assert again.attempts == 1
    store.items_mark_started(lease(again))
    finish(store, run.id, done(again, charge=0))
    assert row(store, run.id, c.id).attempts == 2


# -- attempts, heartbeats, release -----------------------------------------------------------


def test_mark_started_charges_only_items_still_held(store: Store) -> None:
    run = decomposed(store, 4)
    a, b, c, d = claim(store, run.id)
    store.items_release(lease(c))  # given back
    finish(store, run.id, done(d, charge=0))  # already finished
    assert store.items_mark_started(lease([a, b, c, d], token=a.lease_token + 1000)) == []
    assert store.items_mark_started(lease([a, b, c, d])) == sorted([a.id, b.id])
    assert [r.attempts for r in rows(store, run.id)] == [1, 1, 0, 0]


def test_poison_item_does_not_charge_its_chunk_siblings(store: Store) -> None:
    run = decomposed(store, 3)
    poison, b, c = claim(store, run.id, lease=SHORT)
    store.items_mark_started(lease(poison))  # it starts, and its worker dies with the chunk
    wait_expired(store, run.id, 3)
    assert len(reclaim(store)) == 3
    attempts = {r.id: r.attempts for r in rows(store, run.id)}
    assert attempts == {poison.id: 1, b.id: 0, c.id: 0}
    assert {r.state for r in rows(store, run.id)} == {"pending"}


def test_heartbeat_extends_the_lease_only_with_the_right_token(store: Store) -> None:
    run = decomposed(store, 2)
    held = claim(store, run.id, lease=5.0)
    before = {r.id: ts(r.lease_until) for r in rows(store, run.id)}
    assert store.items_heartbeat(lease(held, token=held[0].lease_token + 1000, seconds=LONG)) == 0
    assert {r.id: ts(r.lease_until) for r in rows(store, run.id)} == before
    assert store.items_heartbeat(lease(held, seconds=LONG)) == 2
    for r in rows(store, run.id):
        assert (ts(r.lease_until) - before[r.id]).total_seconds() > LONG - 5.0 - 1.0
        assert r.state == "claimed"


def test_a_heartbeated_item_is_not_reclaimed_when_its_sibling_expires(store: Store) -> None:
    run = decomposed(store, 2)
    (kept,) = claim(store, run.id, limit=1, lease=SHORT)
    (lost,) = claim(store, run.id, limit=1, lease=SHORT)
    assert store.items_heartbeat(lease(kept, seconds=LONG)) == 1
    wait_expired(store, run.id, 1)
    assert [r.id for r in reclaim(store)] == [lost.id]
    assert row(store, run.id, kept.id).state == "claimed"
    assert finish(store, run.id, done(kept)).applied == [kept.id]


def test_release_returns_items_to_pending_without_charging_attempts(store: Store) -> None:
    run = decomposed(store, 2)
    held = claim(store, run.id)
    assert store.items_release(lease(held, token=held[0].lease_token + 1000)) == 0
    assert {r.state for r in rows(store, run.id)} == {"claimed"}
    assert store.items_release(lease(held)) == 2
    released = rows(store, run.id)
    assert [(r.state, r.lease_until, r.attempts) for r in released] == [("pending", None, 0)] * 2
    assert [c.id for c in claim(store, run.id)] == [c.id for c in held]


def test_a_claimed_retry_released_is_due_at_once_whatever_clock_wrote_its_time(
    store: Store, db_url: str,
) -> None:
    """A retry's backoff is served once it is claimed. Its time, written by a clock 15 minutes
    ahead (shifted here, with its updated_at, as such a writer leaves them), stayed on the row
    through a claim and a release, and the item waited the skew again (a reviewer's case)."""
    run = decomposed(store, 1)
    (c,) = claim(store, run.id)
    finish(store, run.id, done(c, "pending", error="busy", delay=1.0))
    if db_url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(db_url[len("sqlite:///"):]) as conn:
            conn.execute("UPDATE wl_items SET not_before = strftime('%Y-%m-%d %H:%M:%f',"
                         " not_before, '+900 seconds'), updated_at = strftime("
                         "'%Y-%m-%d %H:%M:%f', updated_at, '+900 seconds')")
        (again,) = claim(store, run.id)  # written by a clock ahead: due for this one
    else:
        deadline = time.monotonic() + 10
        while not (found := claim(store, run.id)) and time.monotonic() < deadline:
            time.sleep(0.05)
        (again,) = found
    assert store.items_release(lease([again])) == 1
    assert rows(store, run.id)[0].not_before is None
    assert [x.id for x in claim(store, run.id)] == [c.id]


# -- lease expiry ----------------------------------------------------------------------------


def test_reclaim_moves_only_expired_rows_of_the_given_job_and_stage(store: Store) -> None:
    run = submit(store, "a", job="alpha")
    insert(store, run.id, range(2))
    insert(store, run.id, [0], stage=S2)
    store.run_mark_decomposed(run.id, S1)
    (live,) = claim(store, run.id, limit=1, lease=LONG)
    (expired,) = claim(store, run.id, limit=1, lease=SHORT)
    (other_stage,) = claim(store, run.id, limit=1, lease=SHORT)
    assert other_stage.stage == S2
    other = decomposed(store, 1, key="b", job="beta")
    (other_job,) = claim(store, other.id, lease=SHORT)
    wait_expired(store, run.id, 2)
    wait_expired(store, other.id, 1)

    moved = reclaim(store, job="alpha", stage=S1, reason="lease_expired")
    assert [(r.id, r.state, r.error, r.lease_until) for r in moved] == [
        (expired.id, "pending", "lease_expired", None)
    ]
    assert row(store, run.id, expired.id).state == "pending"
    assert row(store, run.id, live.id).state == "claimed"
    assert row(store, run.id, other_stage.id).state == "claimed"
    assert row(store, other.id, other_job.id).state == "claimed"
    (event,) = item_events(store, run.id)
    assert (event.kind, event.item_id, event.lease_token) == (
        "lease_expired",
        expired.id,
        expired.lease_token,
    )
    assert event.actor == "sweeper"
    assert event.detail["reason"] == "lease_expired"
    assert reclaim(store, job="alpha", stage=S1) == []  # nothing left to move


def test_reclaim_does_not_charge_attempts(store: Store) -> None:
    run = decomposed(store, 1)
    claim(store, run.id, lease=SHORT)
    wait_expired(store, run.id, 1)
    (moved,) = reclaim(store)
    assert moved.attempts == 0


def test_old_holder_finish_is_stale_after_its_lease_was_reclaimed(store: Store) -> None:
    run = decomposed(store, 1)
    (old,) = claim(store, run.id, lease=SHORT)
    wait_expired(store, run.id, 1)
    reclaim(store)
    assert finish(store, run.id, done(old)).stale == [old.id]  # while pending
    (new,) = claim(store, run.id)
    assert new.lease_token != old.lease_token
    assert finish(store, run.id, done(old)).stale == [old.id]  # while re-claimed
    assert store.items_heartbeat(lease(old, seconds=LONG)) == 0
    r = row(store, run.id, new.id)
    assert (r.state, r.lease_token) == ("claimed", new.lease_token)
    assert run_of(store, run.id).processed == 0
    assert finish(store, run.id, done(new)).applied == [new.id]
    assert run_of(store, run.id).processed == 1
    kinds = [(e.kind, e.lease_token) for e in store.events_list(run.id, new.id)]
    assert kinds == [
        ("lease_expired", old.lease_token),
        ("stale_result", old.lease_token),
        ("stale_result", old.lease_token),
    ]


def test_reclaim_to_unknown_leaves_the_item_awaiting_repair(store: Store) -> None:
    run = decomposed(store, 1)
    (c,) = claim(store, run.id, lease=SHORT)
    assert store.items_mark_started(LeaseParams(run.id, [c.id], c.lease_token), charge=0) == [c.id]
    wait_expired(store, run.id, 1)
    (moved,) = reclaim(store, to_state="unknown", reason="lease expired; effect unknown")
    assert (moved.id, moved.state, moved.error) == (
        c.id,
        "unknown",
        "lease expired; effect unknown",
    )
    assert claim(store, run.id) == []
    (event,) = item_events(store, run.id)
    assert (event.kind, event.item_id, event.lease_token) == ("unknown", c.id, c.lease_token)


def test_reclaim_sends_an_item_whose_handler_never_started_back_to_pending(store: Store) -> None:
    run = decomposed(store, 2)
    started, idle = claim(store, run.id, lease=SHORT)
    store.items_mark_started(LeaseParams(run.id, [started.id], started.lease_token), charge=0)
    wait_expired(store, run.id, 2)
    moved = {m.id: m for m in reclaim(store, to_state="unknown", reason="effect unknown")}
    assert (moved[started.id].state, moved[started.id].error) == ("unknown", "effect unknown")
    assert moved[started.id].started_at is not None and moved[started.id].attempts == 0
    assert moved[idle.id].state == "pending" and moved[idle.id].started_at is None
    assert moved[idle.id].error == "not started: its holder stopped before running it"
    kinds = {e.item_id: (e.kind, e.detail["started"]) for e in item_events(store, run.id)}
    assert kinds == {started.id: ("unknown", True), idle.id: ("lease_expired", False)}
    assert [i.id for i in claim(store, run.id)] == [idle.id]  # claimable again, nothing doubted


def test_a_new_claim_forgets_the_start_of_the_previous_one(store: Store) -> None:
    run = decomposed(store, 1)
    (c,) = claim(store, run.id, lease=SHORT)
    store.items_mark_started(LeaseParams(run.id, [c.id], c.lease_token), charge=0)
    wait_expired(store, run.id, 1)
    reclaim(store, to_state="pending", reason="lease_expired: gone")
    (again,) = claim(store, run.id)
    (row,) = store.items_list(ItemsQuery(run.id))
    assert again.id == c.id and row.started_at is None


# -- stage hand-off --------------------------------------------------------------------------


def test_finish_with_next_stage_inserts_the_next_row_only_when_applied(store: Store) -> None:
    run = decomposed(store, 2)
    a, b = claim(store, run.id)
    result = finish(
        store,
        run.id,
        done(a, unit=None, next_stage=S2),
        Finish(id=b.id, lease_token=b.lease_token + 1000, write=write_of("processed", False),
               next_stage=S2),
    )
    assert result.applied == [a.id]
    (nxt,) = rows(store, run.id, stage=S2)
    assert (nxt.seq, nxt.key, nxt.data, nxt.state, nxt.attempts) == (
        a.seq,
        a.key,
        a.data,
        "pending",
        0,
    )
    (claimed_next,) = [c for c in claim(store, run.id) if c.stage == S2]
    assert claimed_next.id == nxt.id


def test_hand_off_rolls_back_with_its_finish(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    run = decomposed(store, 1)
    (c,) = claim(store, run.id)
    monkeypatch.setenv("WORKLEDGER_FAILPOINTS", "handoff.before_commit:*:raise")
    with pytest.raises(failpoints.FailpointHit):
        finish(store, run.id, done(c, unit=None, next_stage=S2))
    monkeypatch.delenv("WORKLEDGER_FAILPOINTS")
    assert [(r.stage, r.state) for r in rows(store, run.id)] == [(S1, "claimed")]
    assert finish(store, run.id, done(c, unit=None, next_stage=S2)).applied == [c.id]
    assert [(r.stage, r.state) for r in rows(store, run.id)] == [(S1, "processed"), (S2, "pending")]


def test_failed_or_skipped_first_stage_hands_nothing_off(store: Store) -> None:
    run = decomposed(store, 2)
    a, b = claim(store, run.id)
    finish(store, run.id, done(a, "failed", error="x"), done(b, "skipped", error="y"))
    assert rows(store, run.id, stage=S2) == []


# -- projection ------------------------------------------------------------------------------


def test_finishes_move_unit_counters_and_complete_the_run_at_the_last_unit(store: Store) -> None:
    run = submit(store)
    insert(store, run.id, range(4))
    insert(store, run.id, [4], state="skipped", error="invalid")
    store.run_mark_decomposed(run.id, S1)
    a, b, c, d = claim(store, run.id)
    finish(
        store, run.id, done(a), done(b, "failed", error="gone"), done(c, "pending", error="busy")
    )
    r = store.run_get(run.id)
    assert r is not None
    assert (r.total, r.processed, r.failed, r.skipped, r.completed_at) == (5, 1, 1, 1, None)
    (c2,) = claim(store, run.id)
    finish(store, run.id, done(c2, "skipped", error="duplicate"))
    assert run_of(store, run.id).completed_at is None
    finish(store, run.id, done(d))
    r = store.run_get(run.id)
    assert r is not None
    assert (r.total, r.processed, r.failed, r.skipped) == (5, 2, 1, 2)
    assert r.completed_at is not None


def test_two_stage_run_completes_when_its_last_stage_finishes(store: Store) -> None:
    run = decomposed(store, 2)
    a, b = claim(store, run.id)
    finish(store, run.id, done(a, unit=None, next_stage=S2), done(b, unit=None, next_stage=S2))
    r = store.run_get(run.id)
    assert r is not None
    assert (r.total, r.processed, r.completed_at) == (2, 0, None)
    x, y = claim(store, run.id)
    assert {x.stage, y.stage} == {S2}
    finish(store, run.id, done(x), done(y, "failed", error="bounced"))
    r = store.run_get(run.id)
    assert r is not None
    assert (r.total, r.processed, r.failed, r.skipped) == (2, 1, 1, 0)
    assert r.completed_at is not None
    assert len(rows(store, run.id)) == 4  # total still counts units, not rows


# -- outlook, counts, listings ---------------------------------------------------------------


def test_outlook_counts_ready_waiting_leased_and_expired(store: Store) -> None:
    run = decomposed(store, 6)
    (expiring,) = claim(store, run.id, limit=1, lease=SHORT)
    waiting, finished = claim(store, run.id, limit=2, lease=LONG)
    finish(store, run.id, done(waiting, "pending", error="busy", delay=LONG), done(finished))
    claim(store, run.id, limit=1, lease=LONG)  # leased
    other = decomposed(store, 3, key="other")  # not asked about
    wait_expired(store, run.id, 1)
    o = store.outlook([run.id])
    assert (o.ready, o.waiting, o.leased, o.expired) == (2, 1, 1, 1)
    assert o.next_ready_in is not None and LONG - 10 < o.next_ready_in <= LONG
    assert o.lease_ends_in is not None and LONG - 10 < o.lease_ends_in <= LONG
    both = store.outlook([run.id, other.id])
    assert (both.ready, both.waiting, both.leased, both.expired) == (5, 1, 1, 1)


def test_outlook_of_a_finished_run_is_empty(store: Store) -> None:
    run = decomposed(store, 1)
    (c,) = claim(store, run.id)
    finish(store, run.id, done(c))
    o = store.outlook([run.id])
    assert (o.ready, o.waiting, o.leased, o.expired) == (0, 0, 0, 0)
    assert (o.next_ready_in, o.lease_ends_in) == (None, None)


def test_run_counts_group_items_by_stage_and_state(store: Store) -> None:
    run = submit(store)
    insert(store, run.id, range(4))
    insert(store, run.id, [4], state="skipped", error="invalid")
    store.run_mark_decomposed(run.id, S1)
    a, b = claim(store, run.id, limit=2)
    finish(store, run.id, done(a, unit=None, next_stage=S2), done(b, "failed", error="x"))
    claim(store, run.id, limit=1)
    assert store.run_counts(run.id) == {
        S1: {"processed": 1, "failed": 1, "claimed": 1, "pending": 1, "skipped": 1},
        S2: {"pending": 1},
    }
    assert store.run_counts(submit(store, "empty").id) == {}


def test_items_list_filters_by_stage_and_state_and_pages_by_id(store: Store) -> None:
    run = decomposed(store, 4)
    other = decomposed(store, 2, key="other")
    a, b = claim(store, run.id, limit=2)
    finish(store, run.id, done(a, unit=None, next_stage=S2), done(b, "failed", error="x"))
    everything = rows(store, run.id)
    assert [r.id for r in everything] == sorted(r.id for r in everything)
    assert {r.run_id for r in everything} == {run.id}
    assert len(everything) == 5
    assert [r.seq for r in rows(store, run.id, stage=S2)] == [a.seq]
    assert [r.id for r in rows(store, run.id, state="failed")] == [b.id]
    assert [r.seq for r in rows(store, run.id, stage=S1, state="pending")] == [2, 3]
    assert rows(store, run.id, stage=S2, state="failed") == []
    page1 = rows(store, run.id, limit=2)
    page2 = rows(store, run.id, limit=2, after_id=page1[-1].id)
    page3 = rows(store, run.id, limit=2, after_id=page2[-1].id)
    assert page1 + page2 + page3 == everything
    assert len(rows(store, other.id)) == 2


def test_items_count_counts_what_items_list_would_find_after_an_id(store: Store) -> None:
    run = decomposed(store, 4)
    decomposed(store, 2, key="other")
    (a,) = claim(store, run.id, limit=1)
    finish(store, run.id, done(a, "failed", error="x"))
    first = rows(store, run.id)[0]
    assert store.items_count(ItemsQuery(run.id)) == 4
    assert store.items_count(ItemsQuery(run.id, after_id=first.id)) == 3
    assert store.items_count(ItemsQuery(run.id, S1, "pending")) == 3
    assert store.items_count(ItemsQuery(run.id, state="failed", after_id=a.id)) == 0


def test_items_list_shows_results_and_reasons(store: Store) -> None:
    run = decomposed(store, 2)
    a, b = claim(store, run.id)
    finish(
        store,
        run.id,
        done(a, result=json.dumps([1, "two"])),
        done(b, "failed", error="account closed"),
    )
    ra, rb = rows(store, run.id)
    assert (ra.result, ra.error) == ([1, "two"], None)
    assert (rb.result, rb.error) == (None, "account closed")


def test_events_list_keeps_insertion_order_and_filters_by_item(store: Store) -> None:
    run = decomposed(store, 2)
    other = decomposed(store, 1, key="other")
    first, second = (r.id for r in rows(store, run.id))
    milestones = {e.id for e in store.events_list(run.id)} | {
        e.id for e in store.events_list(other.id)
    }
    store.events_add(
        [
            NewEvent(run.id, "redrive", item_id=second, actor="ops", detail=json.dumps({"n": 1})),
            NewEvent(run.id, "paused", actor="ops"),
            NewEvent(run.id, "resolve", item_id=first, lease_token=7, detail=json.dumps({"n": 2})),
            NewEvent(other.id, "paused"),
        ]
    )
    store.events_add([NewEvent(run.id, "redrive", item_id=second, detail=json.dumps({"n": 3}))])
    events = [e for e in store.events_list(run.id) if e.id not in milestones]
    assert [(e.kind, e.item_id) for e in events] == [
        ("redrive", second),
        ("paused", None),
        ("resolve", first),
        ("redrive", second),
    ]
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert [ts(e.at) for e in events] == sorted(ts(e.at) for e in events)
    assert [e.detail for e in store.events_list(run.id, second)] == [{"n": 1}, {"n": 3}]
    (resolved,) = store.events_list(run.id, first)
    assert (resolved.lease_token, resolved.actor, resolved.run_id) == (7, None, run.id)
    assert [e.kind for e in store.events_list(other.id) if e.id not in milestones] == ["paused"]
