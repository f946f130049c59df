"""An RQ worker's warm shutdown never waits on its pub/sub thread's minute-long sleep (issue 21;
the campaign's broker rounds on SQLite, seed 1311 round 18: an ``rq worker`` that did not stop
within 30 s of SIGTERM, caught with ``py-spy dump`` in ``BaseWorker.unsubscribe`` ->
``PubSubWorkerThread.stop``).

RQ runs its command channel in redis-py's ``run_in_thread(sleep_time=60)`` and tears it down with
``unsubscribe()`` then ``stop()``. Once the thread has read the unsubscribe reply it waits up to
``sleep_time`` for a subscription that never comes, and redis-py 8.2's ``stop()`` joins it with no
time limit: a worker whose thread got there first took a minute to stop. Our worker class
tears the channel down within a bounded time. The real Redis; the thread put into that wait the
way a loaded machine does, by letting it read the reply first."""

from __future__ import annotations

import threading
import uuid

import pytest
from waiting import poll

pytestmark = pytest.mark.concurrency


def test_the_worker_unsubscribes_at_once_when_its_thread_already_read_the_reply() -> None:
    from redis import Redis

    from workledger.contrib.rq import Worker

    connection = Redis.from_url("redis://127.0.0.1:6379/15")
    worker = Worker([f"wl-teardown-{uuid.uuid4().hex[:8]}"], connection=connection)
    worker.subscribe()
    poll(lambda: worker.pubsub.subscribed, "the worker to subscribe to its channel", timeout=10)
    worker.pubsub.unsubscribe()  # what unsubscribe() sends first; the thread reads the reply
    poll(lambda: not worker.pubsub.subscribed, "the thread to read the unsubscribe reply",
         timeout=10)
    teardown = threading.Thread(target=worker.unsubscribe, daemon=True)
    teardown.start()
    teardown.join(timeout=10)
    assert not teardown.is_alive(), "unsubscribe() waited on the pub/sub thread's sleep"
    connection.close()
