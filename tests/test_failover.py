"""Failover on PostgreSQL: a private primary and its asynchronous streaming standby
(``tests/pg_cluster.py``), the primary lost with its last commits, the standby promoted.

The commits of the lost window are gone, among them a claim and the lease token it took; the
sequence behind the tokens is WAL-logged 32 values ahead, so the promoted standby hands out the
same token again. Fencing must still tell the zombie (the holder of the lost claim, still
running its handler) from the new holder: every token carries the timeline it was taken on
(docs/reliability.md, "Failover (PostgreSQL)").
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
from pg_cluster import Cluster
from writes_support import write_of

from workledger._runtime.patience import Patience, patient
from workledger.storage import doubt, open_store
from workledger.storage.port import (
    ClaimParams,
    Finish,
    FinishParams,
    ItemsInsert,
    ItemsQuery,
    LeaseParams,
    NewItem,
    NewRun,
    Store,
)

pytestmark = pytest.mark.concurrency

JOB, STAGE = "ingest", "generate"
TIMELINE_SHIFT = 40


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.close()


def failover_url(c: Cluster) -> str:
    """Both nodes, the writable one chosen: how a worker follows a promotion on its own."""
    return (f"postgresql://postgres@127.0.0.1:{c.primary.port},127.0.0.1:{c.standby.port}"
            "/postgres?target_session_attrs=read-write")


def processed(item_id: int, token: int) -> Finish:
    return Finish(id=item_id, lease_token=token, write=write_of("processed"))


def lose_the_primary_and_promote(c: Cluster) -> None:
    """The primary dies (immediate: nothing more is sent), the standby is promoted."""
    c.primary.stop("immediate")
    c.standby.start()
    c.standby.promote()


def test_a_zombie_of_the_lost_window_cannot_pass_fencing_after_a_promotion(
        cluster: Cluster) -> None:
    setup = open_store(cluster.primary.url)
    setup.migrate()
    run, _ = setup.run_submit(NewRun(JOB, "k1", json.dumps({"n": 1})))
    setup.items_insert_many(ItemsInsert(run.id, STAGE, [NewItem(0, "key-0", "{}")]))
    setup.run_mark_decomposed(run.id, STAGE)
    setup.close()
    cluster.wait_replayed()
    cluster.standby.stop()  # from here the primary's commits reach no standby: the lost window

    zombie_store = open_store(failover_url(cluster))
    zombie: Store = patient(zombie_store, Patience(60.0))
    (held,) = zombie.items_claim(ClaimParams(run_id=run.id, limit=10, lease_seconds=600.0))
    lose_the_primary_and_promote(cluster)

    fresh = open_store(cluster.standby.url)
    try:
        (item,) = fresh.items_list(ItemsQuery(run.id))
        assert item.state == "pending"  # the claim was in the lost window
        (again,) = fresh.items_claim(ClaimParams(run_id=run.id, limit=10, lease_seconds=600.0))

        # the zombie's store follows the promotion, and its writes are fenced
        assert zombie.items_heartbeat(LeaseParams(run.id, [held.id], held.lease_token,
                                                  600.0)) == 0
        assert zombie.items_mark_started(LeaseParams(run.id, [held.id], held.lease_token)) == []
        late = zombie.items_finish_if_leased(FinishParams(
            run.id, [processed(held.id, held.lease_token)], actor="zombie"))
        assert (late.applied, late.stale) == ([], [held.id])

        # the new holder's outcome is the one that counts
        mine = fresh.items_finish_if_leased(FinishParams(
            run.id, [processed(again.id, again.lease_token)], actor="new"))
        assert (mine.applied, mine.stale) == ([again.id], [])
        (item,) = fresh.items_list(ItemsQuery(run.id))
        assert (item.state, item.lease_token, item.attempts) == (
            "processed", again.lease_token, 1)
        stale = [e for e in fresh.events_list(run.id) if e.kind == "stale_result"]
        assert [(e.lease_token, e.actor) for e in stale] == [(held.lease_token, "zombie")]
        # each token carries its timeline: the second can never be the first again
        assert held.lease_token >> TIMELINE_SHIFT == 1
        assert again.lease_token >> TIMELINE_SHIFT == 2
    finally:
        fresh.close()
        zombie_store.close()


def test_an_outcome_asked_about_after_a_promotion_is_not_taken_for_another(
        cluster: Cluster) -> None:
    """A transaction id of the lost window names another transaction on the promoted standby;
    asked about there (a COMMIT whose answer was lost just before the failover), it is no
    answer at all: the call is tried again, fenced (storage/doubt.py)."""
    cluster.wait_replayed()
    cluster.standby.stop()
    with psycopg.connect(cluster.primary.url) as conn:
        conn.execute("CREATE TABLE lost (n int)")
        conn.execute("INSERT INTO lost VALUES (1)")
        pending = doubt.before_commit(conn)
        conn.commit()
    assert pending is not None and pending.timeline == 1
    lose_the_primary_and_promote(cluster)

    def connect() -> psycopg.Connection[object]:
        return psycopg.connect(cluster.standby.url, autocommit=True)

    with psycopg.connect(cluster.standby.url, autocommit=True) as conn:
        for _ in range(5):  # the promoted standby gives the same ids out again, and commits
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS t (n int)")
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t VALUES (1)")
            reused = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
            conn.execute("COMMIT")
            assert reused is not None
            if int(reused[0]) >= pending.xid:
                break
        status = conn.execute("SELECT pg_xact_status(%s::xid8)", (str(pending.xid),)).fetchone()
    assert status == ("committed",)  # the same id, another transaction
    assert doubt.learn(connect, pending, 5.0) is None  # not taken as ours


def test_every_fenced_write_compares_the_whole_token(pg_url: str) -> None:
    """A token that differs from the claim's only in its timeline bits (the same sequence
    value taken on another timeline) or only in its sequence bits is refused by each fenced
    write; the claim's own token is accepted."""
    store = open_store(pg_url)
    try:
        store.migrate()
        run, _ = store.run_submit(NewRun(JOB, "k1", json.dumps({"n": 3})))
        store.items_insert_many(ItemsInsert(run.id, STAGE, [
            NewItem(i, f"key-{i}", "{}") for i in range(3)]))
        store.run_mark_decomposed(run.id, STAGE)
        held = store.items_claim(ClaimParams(run_id=run.id, limit=10, lease_seconds=600.0))
        token = held[0].lease_token
        assert token >> TIMELINE_SHIFT >= 1
        ids = [c.id for c in held]
        others = [token ^ (3 << TIMELINE_SHIFT), token % (1 << TIMELINE_SHIFT), token + 1]
        for other in others:
            lease = LeaseParams(run.id, ids, other, 600.0)
            assert store.items_heartbeat(lease) == 0
            assert store.items_mark_started(lease) == []
            assert store.items_release(lease) == 0
            one_shape = store.items_finish_if_leased(FinishParams(
                run.id, [processed(i, other) for i in ids]))
            many_shapes = store.items_finish_if_leased(FinishParams(run.id, [
                Finish(id=i, lease_token=other, write=write_of(state), result=json.dumps(n))
                for n, (i, state) in enumerate(zip(ids, ["processed", "failed", "skipped"],
                                                   strict=True))]))
            assert one_shape.applied == many_shapes.applied == []
        assert {i.state for i in store.items_list(ItemsQuery(run.id))} == {"claimed"}
        done = store.items_finish_if_leased(FinishParams(
            run.id, [processed(i, token) for i in ids]))
        assert done.applied == sorted(ids)
    finally:
        store.close()
