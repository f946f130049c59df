"""Dispatch a ledger's work through Celery (RabbitMQ, Redis, any broker Celery speaks).

>>> from celery import Celery                                         # doctest: +SKIP
>>> from workledger import Ledger
>>> from workledger.contrib.celery import CeleryDispatch
>>> app = Celery("myapp", broker="amqp://guest:guest@127.0.0.1:5672//")  # doctest: +SKIP
>>> ledger = Ledger("postgresql://...", dispatch=CeleryDispatch(app))  # doctest: +SKIP

then ``celery -A myapp worker``. Every message is one call of the task ``workledger.deliver``
on the dispatch's queue (``workledger`` unless you name another), whose one argument is the
identity of some items (docs/celery.md). A worker of that app consumes the queue even under
``-Q`` (it is added to the queues it consumes), and each worker's main process runs the
ledger's sweeper, leader-elected, beside Celery's own loop: nothing else needs starting.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from celery import Celery, signals

from workledger._runtime.broker.dispatch import BrokerDispatch, Message
from workledger.contrib._broker import Sweeping, ledger_named, start_sweeping

log = logging.getLogger("workledger.dispatch")

TASK = "workledger.deliver"
# a publish that cannot reach the broker gives up after about a second: the ledger owes the
# messages still, and the sweeper publishes them later (a submit never hangs on a broker)
RETRY_POLICY = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.4,
                "interval_max": 0.5}


def deliver(body: Any) -> dict[str, int]:
    """The task: run what the message names in the ledger it names (``Ledger.deliver``).
    Only a ledger of a module this worker has imported already (``celery -A`` imports the
    app's modules): a message cannot make a worker import anything."""
    message = Message.from_body(body)
    report = ledger_named(message.app, imported=True).deliver(body)
    return {"claimed": report.claimed, "processed": report.processed, "failed": report.failed,
            "retried": report.retried, "stale": report.stale}


class CeleryDispatch(BrokerDispatch):
    """Publish a ledger's messages as tasks of ``celery_app`` on ``queue``.

    ``chunk``, ``lease``, ``redispatch_after``, ``concurrency``, ``timeout`` and ``app``: see
    :class:`~workledger._runtime.broker.dispatch.DispatchOptions`. Tasks are acknowledged when they
    start (Celery's default): a worker that dies holding one loses the message, and the ledger's
    lease and sweeper bring its items back."""

    def __init__(self, celery_app: Celery, queue: str = "workledger", **options: Any) -> None:
        super().__init__(queue, **options)
        self.celery = celery_app
        # one task per Celery app, whatever the number of ledgers: the message names its ledger
        self.task = celery_app.task(name=TASK, ignore_result=True, acks_late=False)(deliver)
        self._sweeping: Sweeping | None = None
        self._lock = threading.Lock()
        signals.celeryd_after_setup.connect(self._consume, weak=False)
        signals.worker_ready.connect(self._worker_ready, weak=False)
        signals.worker_shutdown.connect(self._worker_shutdown, weak=False)

    def publish(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        with self.celery.producer_or_acquire() as producer:  # one connection for them all
            for m in messages:
                self.task.apply_async(args=(m.body(),), queue=self.queue,
                                      countdown=m.delay or None, producer=producer,
                                      retry=True, retry_policy=RETRY_POLICY)

    def purge(self) -> int:
        """Drop every message waiting in the queue (what a broker may lose); how many."""
        with self.celery.connection_for_write() as conn:
            return int(conn.default_channel.queue_purge(self.queue) or 0)

    # -- a worker of this Celery app ---------------------------------------------------------

    def _mine(self, sender: Any) -> bool:
        return getattr(sender, "app", None) is self.celery and self.ledger is not None

    def _consume(self, sender: Any = None, instance: Any = None, **_: Any) -> None:
        if self._mine(instance):
            instance.app.amqp.queues.select_add(self.queue)

    def _worker_ready(self, sender: Any = None, **_: Any) -> None:
        if not self._mine(sender):
            return
        with self._lock:
            if self._sweeping is None:
                self._sweeping = start_sweeping(self.ledger)

    def _worker_shutdown(self, sender: Any = None, **_: Any) -> None:
        with self._lock:
            loop, self._sweeping = self._sweeping, None
        if loop is not None:
            loop.stop()
