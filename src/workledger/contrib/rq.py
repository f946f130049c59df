"""Dispatch a ledger's work through RQ (Redis Queue).

>>> from redis import Redis                                            # doctest: +SKIP
>>> from workledger import Ledger
>>> from workledger.contrib.rq import RQDispatch
>>> ledger = Ledger("postgresql://...", dispatch=RQDispatch(Redis()))  # doctest: +SKIP

then ``rq worker -w workledger.contrib.rq.Worker workledger``. Every message is one RQ job
calling ``workledger.contrib.rq.deliver`` with one argument, the identity of some items, on the
dispatch's queue (``workledger`` unless you name another); see docs/rq.md. The worker class is
RQ's own (a work horse forked per job) plus two things: the ledger's sweeper runs in the
worker's process, leader-elected, and every such worker moves the messages of retries and of
items a rate-limited stage's bucket held back into the queue once they are due (held in the
Redis sorted set ``workledger:due:<queue>``, never behind RQ's scheduler lock, which outlives
a worker killed with ``kill -9`` by up to a minute). It
finds the ledgers to sweep where the dispatch records them when it publishes: the Redis set
``workledger:apps:<queue>`` (or ``WORKLEDGER_APP``, comma-separated).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import rq
from redis import ConnectionPool, Redis

from workledger._runtime.broker.dispatch import BrokerDispatch, Message
from workledger.contrib._broker import Sweeping, ledger_named, start_sweeping

log = logging.getLogger("workledger.dispatch")

DELIVER = "workledger.contrib.rq.deliver"
APPS_KEY = "workledger:apps:{queue}"  # the ledgers whose messages a queue carries
LOOK_EVERY = 5.0  # seconds between looks for ledgers to sweep, in an rq worker
DUE_KEY = "workledger:due:{queue}"  # retries' messages until they are due, by due time
MOVE_EVERY = 0.5  # seconds between moves of due messages into the queue, in an rq worker
UNSUBSCRIBE_WITHIN = 1.0  # seconds a warm shutdown waits on RQ's command-channel thread
# Held while a sweeper thread imports an app and while the worker forks a work horse: a fork
# in the middle of an import would leave the horse waiting forever on the import's lock.
_FORKING = threading.Lock()


def deliver(body: Any) -> dict[str, int]:
    """The job: run what the message names in the ledger it names (``Ledger.deliver``)."""
    message = Message.from_body(body)
    report = ledger_named(message.app).deliver(body)
    return {"claimed": report.claimed, "processed": report.processed, "failed": report.failed,
            "retried": report.retried, "stale": report.stale}


class RQDispatch(BrokerDispatch):
    """Publish a ledger's messages as RQ jobs on ``queue``, through ``connection``.

    ``job_timeout``: RQ's limit on one message (its work horse is killed past it; the ledger's
    leases and sweeper bring the items back), default RQ's. ``chunk``, ``lease``,
    ``redispatch_after``, ``concurrency``, ``timeout`` and ``app``: see
    :class:`~workledger._runtime.broker.dispatch.DispatchOptions`."""

    def __init__(self, connection: Redis, queue: str = "workledger", *,
                 job_timeout: int | None = None, **options: Any) -> None:
        super().__init__(queue, **options)
        self.redis = connection
        self.rq_queue = rq.Queue(queue, connection=connection)
        self.job_timeout = job_timeout
        self._recorded: set[str] = set()

    def publish(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        self.announce(messages[0].app)
        now = [m for m in messages if m.delay <= 0]
        if now:
            self.rq_queue.enqueue_many([rq.Queue.prepare_data(
                DELIVER, (m.body(),), timeout=self.job_timeout, result_ttl=0) for m in now])
        later = [m for m in messages if m.delay > 0]
        if later:
            self.hold(later)

    def hold(self, messages: Sequence[Message]) -> None:
        """Keep retries' messages in Redis until they are due, for every
        ``workledger.contrib.rq.Worker`` of the queue to move into it then (:func:`move_due`).
        Not RQ's ``enqueue_in``: its scheduler lock outlives a scheduler killed with ``kill
        -9`` by up to 60 s, and a restarted worker leaves it be, so a retry due in 2 s waited a
        minute (issue 24)."""
        now = time.time()
        self.redis.zadd(DUE_KEY.format(queue=self.queue), {
            json.dumps({"body": m.body(), "timeout": self.job_timeout}, sort_keys=True):
            now + m.delay for m in messages})

    def announce(self, app: str) -> None:
        """Say in Redis which ledger this queue carries, for the workers' sweepers: before a
        run's items are marked owed, so a submitter that dies before its publish still leaves
        the ledger's name where the workers look for it."""
        if app not in self._recorded:
            self.redis.sadd(APPS_KEY.format(queue=self.queue), app)
            self._recorded.add(app)

    def purge(self) -> int:
        """Drop every message waiting in the queue (what a broker may lose); how many."""
        waiting = self.rq_queue.count
        self.rq_queue.empty()  # type: ignore[no-untyped-call]  # rq leaves it untyped
        return waiting


def move_due(connection: Redis, queue: str, now: float | None = None) -> int:
    """Enqueue the held messages of ``queue`` that are due; how many. Each is taken out of
    the set by one ``ZREM``, so of the workers moving at once only one enqueues it; a worker
    that dies between the two loses that message, which the ledger's sweeper publishes again,
    as it does any message a broker lost."""
    key = DUE_KEY.format(queue=queue)
    due: list[bytes] = connection.zrangebyscore(  # type: ignore[assignment]  # no scores
        key, "-inf", time.time() if now is None else now, start=0, num=500)
    target = rq.Queue(queue, connection=connection)
    moved = 0
    for member in due:
        if connection.zrem(key, member):
            held = json.loads(member)
            target.enqueue(DELIVER, held["body"], job_timeout=held["timeout"], result_ttl=0)
            moved += 1
    return moved


def until_due(connection: Redis, queue: str) -> float:
    """Seconds until the next held message of ``queue`` is due (at most ``MOVE_EVERY``): a
    message a bucket held is moved when its bucket can serve it, not up to half a second on."""
    first: list[tuple[bytes, float]] = connection.zrange(  # type: ignore[assignment]
        DUE_KEY.format(queue=queue), 0, 0, withscores=True)
    if not first:
        return MOVE_EVERY
    return min(MOVE_EVERY, max(0.001, first[0][1] - time.time()))


class Worker(rq.Worker):
    """RQ's worker, with the ledgers' sweepers in its process and the retries' messages moved
    into its queues when due: ``rq worker -w workledger.contrib.rq.Worker QUEUE``."""

    _sweepers: _Sweepers | None = None
    _due: _DueMessages | None = None

    def work(self, *args: Any, **kwargs: Any) -> bool:
        kwargs["with_scheduler"] = True  # for retries an older workledger left to RQ's
        try:
            return bool(super().work(*args, **kwargs))
        finally:
            for running in (self._due, self._sweepers):
                if running is not None:
                    running.stop()

    def bootstrap(self, logging_level: str | None = "INFO", date_format: str = "%H:%M:%S",
                  log_format: str = "%(asctime)s %(message)s") -> None:
        super().bootstrap(logging_level, date_format, log_format)
        # the ledger's lines (its sweeper, its outages) go where RQ's own go
        from rq.logutils import setup_loghandlers

        level = logging_level or self.log.getEffectiveLevel()  # RQ's, when the CLI sets none
        setup_loghandlers(level, date_format, log_format, name="workledger")
        # a client of its own: the worker's blocks in its dequeue, with a timeout to match
        pool = self.connection.connection_pool
        own = Redis(connection_pool=ConnectionPool(
            connection_class=pool.connection_class,
            **{k: v for k, v in pool.connection_kwargs.items() if k != "socket_timeout"}))
        self._sweepers = _Sweepers(own, self.queue_names())
        self._sweepers.start()
        self._due = _DueMessages(own, self.queue_names())
        self._due.start()

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        with _FORKING:
            super().fork_work_horse(job, queue)

    def unsubscribe(self) -> None:
        """RQ's teardown of its command channel, within a bounded time: its thread sleeps up
        to 60 s waiting for a subscription once it has read the unsubscribe reply, and
        redis-py 8.2's ``stop()`` joins it with no limit (a warm shutdown took a minute)."""
        thread = self.pubsub_thread
        if thread is None:
            return
        self.log.info("Worker %s: unsubscribing from channel %s", self.name,
                      self.pubsub_channel_name)
        self.pubsub.unsubscribe()
        try:
            thread.stop(timeout=UNSUBSCRIBE_WITHIN)  # redis-py >= 8.2: a bounded join
        except TypeError:
            thread.stop()  # older redis-py: stop() only clears the flag
        thread.join(timeout=UNSUBSCRIBE_WITHIN)
        if not thread.is_alive():  # a daemon thread still asleep closes it as it ends
            self.pubsub.close()


class _DueMessages:
    """A thread moving the retries' messages of this worker's queues into them when due."""

    def __init__(self, connection: Redis, queues: list[str]) -> None:
        self.connection = connection
        self.queues = queues
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wl-due-messages", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        failing, wait = False, MOVE_EVERY
        while not self._stop.wait(wait):
            wait = MOVE_EVERY
            try:
                for queue in self.queues:
                    move_due(self.connection, queue)
                    wait = min(wait, until_due(self.connection, queue))
                failing = False
            except Exception:  # noqa: BLE001 - Redis away: said once, tried again
                if not failing:
                    log.exception("could not move the retries that are due into the queue")
                failing = True


class _Sweepers:
    """The sweepers of the ledgers this worker's queues carry, started as they are found."""

    def __init__(self, connection: Redis, queues: list[str]) -> None:
        self.connection = connection
        self.queues = queues
        self.loops: dict[str, Sweeping] = {}
        self.skipped: set[str] = set()  # names that cannot be swept: said once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wl-sweepers", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        for loop in self.loops.values():  # all asked at once, then waited for
            loop.terminate()
        for loop in self.loops.values():
            loop.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for app in sorted(self._apps() - set(self.loops) - self.skipped):
                    self._sweep(app)
            except Exception:  # noqa: BLE001 - Redis away: the next look tries again
                log.exception("could not look for the ledgers to sweep")
            self._stop.wait(LOOK_EVERY)

    def _apps(self) -> set[str]:
        named = {a for a in os.environ.get("WORKLEDGER_APP", "").split(",") if a}
        for queue in self.queues:
            named |= {a.decode() if isinstance(a, bytes) else str(a) for a in
                      self.connection.smembers(APPS_KEY.format(queue=queue))}
        return named

    def _sweep(self, app: str) -> None:
        with _FORKING:
            self._start(app)

    def _start(self, app: str) -> None:
        try:
            ledger = ledger_named(app)
        except Exception as exc:  # noqa: BLE001 - a stale name: said once, not retried
            log.warning("not sweeping %s: it cannot be imported: %s: %s", app,
                        type(exc).__name__, exc)
            self.skipped.add(app)
            return
        if ledger.dispatch is None:
            log.warning("not sweeping %s: it dispatches through no broker", app)
            self.skipped.add(app)
            return
        self.loops[app] = start_sweeping(ledger)
