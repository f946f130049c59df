"""RQ after a ``kill -9`` (issue 24, item 4): RQ's scheduler lock (``rq:scheduler-lock:<queue>``,
60 s) outlives a scheduler that was SIGKILLed, and a restarted worker does not take it, so a
retry RQ's scheduler holds waited a minute. A retry due in 2 s must run within 10 s of being
due on a restarted worker, on the real Redis with real ``rq worker`` processes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_support import Setup, logs_of, setup_for
from waiting import poll

pytestmark = pytest.mark.concurrency


@pytest.fixture
def rq_setup(pg_url: str, tmp_path: Path) -> Iterator[Setup]:
    yield from setup_for("rq", pg_url, tmp_path)


def test_a_retry_runs_when_due_after_the_worker_and_its_scheduler_were_killed(
        rq_setup: Setup) -> None:
    import rq_retry_app
    from redis import Redis

    setup = rq_setup
    redis = Redis.from_url(setup.env["WL_BROKER_URL"])
    lock = f"rq:scheduler-lock:{setup.queue}"
    first = setup.start_worker(setup.tmp / "first.log")
    poll(lambda: redis.exists(lock) == 1, "the first worker's scheduler to take its lock",
         timeout=60)
    setup.kill(first)  # the worker, its scheduler and anything else of its session
    assert redis.ttl(lock) > 30  # the dead scheduler's lock is still held
    setup.start_worker(setup.tmp / "second.log")
    ledger = rq_retry_app.build(setup.env)
    run_id = ledger.job_named("later").submit({}).run_id
    poll(lambda: len(rq_retry_app.attempts(setup.sink)) >= 1, "the first attempt",
         timeout=60)
    due = rq_retry_app.attempts(setup.sink)[0] + rq_retry_app.DELAY
    poll(lambda: ledger.status(run_id).complete or time.time() > due + 10,
         "the retry, or 10 s past its time", timeout=60)
    ran = rq_retry_app.attempts(setup.sink)
    assert len(ran) == 2 and ran[1] <= due + 10, (
        f"the retry due at {due:.1f} ran at {ran[1:] or 'never'}: {logs_of(setup.tmp)}")
    assert ledger.status(run_id).state == "completed"
    ledger.close()


def test_a_held_retry_is_enqueued_once_when_due_however_many_workers_move(
        rq_setup: Setup) -> None:
    from redis import Redis

    from workledger._runtime.broker.dispatch import Message
    from workledger.contrib.rq import DUE_KEY, RQDispatch, move_due

    setup = rq_setup
    redis = Redis.from_url(setup.env["WL_BROKER_URL"])
    dispatch = RQDispatch(redis, setup.queue)
    soon = Message("rq_retry_app:ledger", "later", 1, "call", (0,), delay=2.0)
    later = Message("rq_retry_app:ledger", "later", 1, "call", (1,), delay=3600.0)
    dispatch.publish([soon, later])
    assert setup.waiting() == 0 and redis.zcard(DUE_KEY.format(queue=setup.queue)) == 2
    assert move_due(redis, setup.queue) == 0  # nothing is due yet
    now = time.time() + 2.5
    assert move_due(redis, setup.queue, now) + move_due(redis, setup.queue, now) == 1
    assert setup.waiting() == 1  # the one that was due, once
    assert redis.zcard(DUE_KEY.format(queue=setup.queue)) == 1  # the other waits its hour
