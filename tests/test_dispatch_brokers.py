"""Dispatch through Celery on the real RabbitMQ and the real Redis, with real ``celery worker``
processes (prefork pool), and through RQ on the real Redis, with real ``rq worker`` processes
(a work horse forked per message): a run completes; a worker SIGKILLed mid-chunk and a purged queue
lose nothing and run no effect twice; every message delivered twice runs nothing twice; a
submitter killed between its commit and its publish leaves items the sweeper dispatches.

The effects are checked against the append-only sink of ``tests/apps/dispatch_app.py``
(``broker_support.check_oracle``, docs/reliability.md's oracle)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from broker_support import Setup, check_oracle, logs_of, setup_for, wait_settled
from waiting import poll

pytestmark = pytest.mark.concurrency

UNITS = 2000
BROKERS = ["celery-amqp", "celery-redis", "rq"]


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest, pg_url: str, tmp_path: Path) -> Iterator[Setup]:
    yield from setup_for(request.param, pg_url, tmp_path)


def executions(setup: Setup, kind: str) -> int:
    conn = sqlite3.connect(setup.sink)
    try:
        return int(conn.execute("SELECT count(*) FROM executions WHERE kind = ?",
                                (kind,)).fetchone()[0])
    finally:
        conn.close()


def test_a_run_of_2000_items_completes_through_real_broker_workers(broker: Setup) -> None:
    ledger = broker.ledger()
    broker.start_worker(broker.tmp / "worker.log")
    sub = ledger.job_named("batch").submit({"units": UNITS}, key="complete")
    st = wait_settled(broker, ledger, sub.run_id)
    found = check_oracle(broker, ledger, sub.run_id, UNITS)
    assert st.state == "completed" and found["unknown"] == 0
    # every unit ran once per stage, plus the retries it asked for: nothing ran twice
    assert found == {"unknown": 0, "prepare_runs": UNITS + UNITS // 50, "apply_runs": UNITS}
    assert ledger.audit(run_id=sub.run_id) == []
    ledger.close()


SUBMIT = """
import os, dispatch_app
ledger = dispatch_app.build(dict(os.environ))
ledger.job_named("batch").submit({"units": int(os.environ["WL_UNITS"])}, key="seed")
"""


def test_a_submitter_killed_between_commit_and_publish_leaves_items_the_sweeper_dispatches(
        broker: Setup) -> None:
    """The seed's 400 never-dispatched children: the run and its items are committed, the
    process dies before one message is published; the broker workers' sweeper publishes
    them once they have waited redispatch_after, and the run completes once each."""
    done = broker.run_python(SUBMIT, WL_UNITS="400",
                             WORKLEDGER_FAILPOINTS="dispatch.before_publish:1:exit")
    assert done.returncode == 137, done.stderr[-2000:]
    ledger = broker.ledger()
    (run,) = ledger.runs()
    assert run.counts == {"prepare": {"pending": 400}} and run.state == "running"
    assert broker.waiting() == 0  # nothing reached the broker
    broker.start_worker(broker.tmp / "worker.log")
    wait_settled(broker, ledger, run.run_id)
    found = check_oracle(broker, ledger, run.run_id, 400)
    assert found == {"unknown": 0, "prepare_runs": 400 + 400 // 50, "apply_runs": 400}
    assert "re-dispatched" in logs_of(broker.tmp, tail=None)
    ledger.close()


def test_a_task_killed_between_its_commit_and_its_follow_up_publish_strands_nothing(
        broker: Setup) -> None:
    """A broker task process dies after committing its chunk's outcomes (the next stage's
    rows handed off) and before publishing their messages. While the test holds the sweeper
    lock, only task processes publish; the worker is killed once the first has died there.
    A fresh worker's sweeper then publishes what they owed, and nothing runs twice."""
    ledger = broker.ledger()
    assert ledger.store.lead("batch")  # no sweeper of the first worker publishes anything
    first = broker.start_worker(broker.tmp / "first.log",
                                WORKLEDGER_FAILPOINTS="dispatch.before_publish:1:exit")
    sub = ledger.job_named("batch").submit({"units": 400}, key="follow-up")
    poll(lambda: broker.task_died in logs_of(broker.tmp, tail=None), "a task process to die "
         "at dispatch.before_publish", every=0.05)
    broker.kill(first)
    handed_off = ledger.status(sub.run_id).counts.get("apply", {}).get("pending", 0)
    assert handed_off > 0  # committed, never published: owed
    ledger.store.unlead()
    broker.start_worker(broker.tmp / "second.log")
    wait_settled(broker, ledger, sub.run_id)
    found = check_oracle(broker, ledger, sub.run_id, 400)
    assert found["unknown"] <= 2  # at most what the two task processes were running
    assert "re-dispatched" in (broker.tmp / "second.log").read_text()
    ledger.close()


def test_a_worker_killed_mid_chunk_and_a_purged_queue_lose_nothing_and_run_nothing_twice(
        broker: Setup) -> None:
    """SIGKILL of the whole broker worker (main process and pool) while its tasks run
    chunks, then every message waiting in the broker is purged. The ledger still owes them:
    a fresh worker's sweeper takes back the expired leases and publishes what is owed; no
    idempotent effect is keyed twice, no other effect runs twice, and what was running when
    the worker died is unknown (its outcome cannot be known)."""
    ledger = broker.ledger()
    first = broker.start_worker(broker.tmp / "first.log", WL_SLOW="0.002")
    sub = ledger.job_named("batch").submit({"units": UNITS}, key="kill")
    poll(lambda: executions(broker, "apply") >= 300, "the apply stage to be under way")
    broker.kill(first)
    broker.purge(ledger)
    st = ledger.status(sub.run_id)
    assert not st.complete and st.counts["apply"].get("claimed", 0) + sum(
        st.counts["prepare"].get(s, 0) for s in ("pending", "claimed")) > 0, st.counts
    broker.start_worker(broker.tmp / "second.log", WL_SLOW="0.002")
    wait_settled(broker, ledger, sub.run_id, timeout=180)
    found = check_oracle(broker, ledger, sub.run_id, UNITS)
    assert found["unknown"] <= 2  # at most one running item per task process
    assert found["apply_runs"] == UNITS - sum(
        1 for i in ledger.items(sub.run_id, stage="apply", state="unknown")
        if executions_of(broker, f"{sub.run_id}/apply/{i.seq}") == 0)
    ledger.close()


def executions_of(setup: Setup, key: str) -> int:
    conn = sqlite3.connect(setup.sink)
    try:
        return int(conn.execute("SELECT count(*) FROM executions WHERE key = ?",
                                (key,)).fetchone()[0])
    finally:
        conn.close()


def test_every_message_published_twice_runs_nothing_twice(broker: Setup) -> None:
    """Every message reaches the real broker twice (hand-offs, retries and re-dispatches
    too): the second copy of each finds its items claimed or done and does nothing."""
    ledger = broker.ledger(WL_TWICE="1")
    broker.start_worker(broker.tmp / "worker.log", WL_TWICE="1")
    sub = ledger.job_named("batch").submit({"units": 1000}, key="twice")
    wait_settled(broker, ledger, sub.run_id)
    found = check_oracle(broker, ledger, sub.run_id, 1000)
    assert found == {"unknown": 0, "prepare_runs": 1000 + 1000 // 50, "apply_runs": 1000}
    # both copies of each message were delivered (20 for the first stage, 20 for the second,
    # at least): one of each pair claimed its items, the other nothing
    assert broker.deliveries() >= 2 * (20 + 20)
    ledger.close()


def test_an_async_stage_runs_on_the_task_processs_event_loop(broker: Setup) -> None:
    ledger = broker.ledger()
    broker.start_worker(broker.tmp / "worker.log")
    sub = ledger.job_named("calls").submit({"units": 200}, key="calls")
    st = wait_settled(broker, ledger, sub.run_id)
    assert st.state == "completed" and st.counts == {"call": {"processed": 200}}
    assert executions(broker, "call") == 200
    ledger.close()


def test_a_rate_limited_stage_holds_through_the_broker(broker: Setup) -> None:
    """A broker task claims no more of a limited stage than its bucket holds: the rest of its
    message goes back to the broker, held until the bucket has refilled. However many task
    processes run, no second sees more than 20 + 5 - 1 claims (by the database clock)."""
    ledger = broker.ledger()
    broker.start_worker(broker.tmp / "worker.log")
    sub = ledger.job_named("paced").submit({"units": 120}, key="paced")
    st = wait_settled(broker, ledger, sub.run_id)
    assert st.state == "completed" and executions(broker, "paced") == 120
    at = sorted(datetime.fromisoformat(e.at).timestamp() for e in ledger.events(sub.run_id)
                if e.kind == "claimed")
    assert len(at) == 120
    most = max(sum(1 for t in at if start <= t < start + 1.0) for start in at)
    assert most <= 20 + 5 - 1, most
    assert at[-1] - at[0] >= (120 - 5) / 20 - 0.1  # the rate, not the broker, set the pace
    ledger.close()


@pytest.mark.parametrize("twice", [False, True], ids=["once", "copies"])
def test_a_held_back_message_waits_for_its_bucket_and_its_copies_collapse(
        broker: Setup, twice: bool) -> None:
    """A stage at 10/s with a burst of 1 and 60 items in 20 messages: all but one item are
    held back by the bucket. Each held-back message is delivered when the bucket can serve
    it, so past the 20 first deliveries the broker delivers about one message per item, not
    every held-back message every tenth of a second. With every message published twice, a
    copy of a message whose items are held back already claims nothing and publishes
    nothing: twice as many deliveries, not a second chain of messages for each copy. Counted
    from the broker workers' reports of the tasks they ran and from the ledger's claims."""
    units, messages = 60, 20
    extra = {"WL_CHUNK": str(units // messages), **({"WL_TWICE": "1"} if twice else {})}
    ledger = broker.ledger(**extra)
    broker.start_worker(broker.tmp / "worker.log", **extra)
    sub = ledger.job_named("trickle").submit({"units": units}, key="trickle")
    st = wait_settled(broker, ledger, sub.run_id)
    assert st.state == "completed" and executions(broker, "trickle") == units
    claims = [e for e in ledger.events(sub.run_id) if e.kind == "claimed"]
    assert len(claims) == units  # each item claimed once: the bucket, not a copy, decided
    copies = 2 if twice else 1
    delivered = broker.deliveries()
    assert delivered <= copies * (messages + 1.2 * units), delivered
    ledger.close()


def test_a_per_key_limit_holds_through_the_broker(broker: Setup) -> None:
    """Of a stage with max_per_key=1, a broker task claims no item of an account another task
    holds: the rest of its message goes back to the broker, held, and is claimed later. 60
    postings of three accounts, five to a message, over the broker's worker processes: no two
    of one account ever ran at once, and every one ran."""
    ledger = broker.ledger(WL_CHUNK="5")
    for n in range(2):  # two workers: an rq worker runs one task at a time
        broker.start_worker(broker.tmp / f"worker-{n}.log", WL_CHUNK="5")
    sub = ledger.job_named("accounts").submit({"units": 60}, key="accounts")
    st = wait_settled(broker, ledger, sub.run_id)
    assert st.state == "completed" and st.counts == {"post": {"processed": 60}}
    conn = sqlite3.connect(broker.sink)
    try:
        spans = conn.execute("SELECT account, start, end FROM spans ORDER BY start").fetchall()
    finally:
        conn.close()
    assert len(spans) == 60
    for account in ("acct-0", "acct-1", "acct-2"):
        mine = [(s, e) for a, s, e in spans if a == account]
        assert len(mine) == 20
        for (_, end), (start, _) in zip(mine, mine[1:], strict=False):
            assert start >= end - 0.002, (account, mine)
    ledger.close()
