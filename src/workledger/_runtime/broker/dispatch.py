"""Dispatch through a broker (Celery, RQ) with the ledger as the authority.

A broker carries messages that name items (an app, a job, a run, a stage and some seqs) and
nothing else. What becomes of an item is decided by the ledger alone: the task that receives a
message claims exactly those items that are still pending and claimable, under a lease with a
fresh token (``_runtime/broker/delivery.py``), so a copy of a message finds nothing to do and a
message delivered late or out of order runs nothing twice. What the broker loses, the ledger
still owes:

- **an outbox in the items.** Before a message is published, its items are marked as owed the
  next one at a time (``wl_items.redispatch_at``, migration 0007): before a run is marked
  decomposed for its first stage's rows (``DispatchingStore``), after a commit for the rows it
  made pending (a hand-off, a retry, a release). A process that dies between its commit and
  its publish (the failpoint ``dispatch.before_publish``) leaves its items owed, not lost.
- **the sweeper publishes again** what is owed and still pending once that time has passed
  (``Outbox.redispatch``, a step of every sweep): a lost message, one never published, an item
  pending again after a claim (an expired lease, a redrive, a resolution, a resumed run). Each
  time it waits twice as long (at most 16 times ``redispatch_after``), so a queue with a
  backlog is not flooded with copies.

A broker adapter (``workledger.contrib.celery``, ``workledger.contrib.rq``) is a
:class:`BrokerDispatch` that says how to :meth:`~BrokerDispatch.publish` a message and how its
worker processes hand one to :meth:`workledger.Ledger.deliver`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from workledger import failpoints
from workledger.core import limits
from workledger.errors import BadInput, UsageError
from workledger.storage.delegate import DelegatingStore
from workledger.storage.port import ClaimableRun, DispatchMark, HeldBack, RunRow, Store

log = logging.getLogger("workledger.dispatch")

VERSION = 1  # of the message body
PAGE = 1000  # items read per statement when a stage or a run's owed items are published


@dataclass(frozen=True)
class Message:
    """What a broker carries: the identity of some items of one run and stage, never data.
    ``delay``: seconds the broker holds it before delivering it (a retry's backoff, a bucket's
    wait); it is not part of the body. ``held``: for a message a limited stage's bucket held
    back, when its items are held until (ms since the epoch, by the database's clock), so that
    it, and no copy of an earlier message, claims them (``Store.items_hold_back``)."""

    app: str  # module:attribute of the Ledger, imported by the receiving process
    job: str
    run_id: int
    stage: str
    seqs: tuple[int, ...]
    delay: float = 0.0
    held: int | None = None

    def body(self) -> dict[str, Any]:
        """The payload as plain JSON (docs/celery.md, docs/rq.md)."""
        body: dict[str, Any] = {"v": VERSION, "app": self.app, "job": self.job, "run": self.run_id,
                "stage": self.stage, "seqs": list(self.seqs)}
        if self.held is not None:
            body["held"] = self.held
        return body

    @staticmethod
    def from_body(body: Any) -> Message:
        """The message a body names; :class:`BadInput` for anything else."""
        if not isinstance(body, dict) or body.get("v") != VERSION:
            raise BadInput(f"not a workledger message (version {VERSION}): {body!r:.200}")
        app, job, run, stage, seqs, held = (body.get(k) for k in (
            "app", "job", "run", "stage", "seqs", "held"))
        if not (isinstance(app, str) and isinstance(job, str) and isinstance(stage, str)
                and _whole(run) and isinstance(seqs, list) and all(map(_whole, seqs))
                and len(seqs) <= limits.CHUNK_MAX and (held is None or _whole(held))):
            raise BadInput(f"a workledger message with a field missing or malformed: "
                           f"{body!r:.200}")
        return Message(app, job, cast(int, run), stage, tuple(seqs), held=held)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


@dataclass(frozen=True)
class DispatchOptions:
    """How a ledger dispatches through its broker, and how a broker task runs what it claims.

    ``chunk``: seqs per message. ``lease``: seconds a broker task holds its items between
    renewals (as ``worker --lease``). ``redispatch_after``: seconds an item owed a message may
    wait unclaimed before the sweeper publishes another (default twice the lease).
    ``concurrency``: handler threads per broker worker process (the broker's own concurrency
    is the number of processes). ``timeout``: a handler's time limit where its stage sets none.
    ``app``: ``module:attribute`` naming the ledger in the receiving processes (found by itself
    when the ledger is a module's attribute)."""

    chunk: int = 100
    lease: float = 30.0
    redispatch_after: float | None = None
    concurrency: int = 1
    timeout: float | None = None
    app: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.chunk <= limits.CHUNK_MAX:
            raise UsageError(f"chunk must be from 1 to {limits.CHUNK_MAX:,}")
        if not 0 < self.lease <= 86_400 or self.concurrency < 1:
            raise UsageError("lease must be positive (at most a day), concurrency at least 1")
        if self.redispatch_after is not None and not 0 < self.redispatch_after <= 86_400:
            raise UsageError("redispatch_after must be positive (at most a day)")

    @property
    def wait(self) -> float:
        return self.redispatch_after if self.redispatch_after is not None else 2 * self.lease


class Broker(Protocol):
    """What a ledger needs of the broker it dispatches through."""

    queue: str
    options: DispatchOptions

    def bind(self, ledger: Any) -> None: ...
    def announce(self, app: str) -> None: ...
    def publish(self, messages: Sequence[Message]) -> None: ...


class BrokerDispatch:
    """The part of a broker adapter every broker shares: its queue, its options, its ledger.
    An adapter implements :meth:`publish` and feeds what its workers receive to
    ``ledger.deliver(body)``."""

    def __init__(self, queue: str = "workledger", *, chunk: int = 100, lease: float = 30.0,
                 redispatch_after: float | None = None, concurrency: int = 1,
                 timeout: float | None = None, app: str | None = None) -> None:
        if not queue or len(queue) > 200:
            raise UsageError("a queue name of 1 to 200 characters")
        self.queue = queue
        self.options = DispatchOptions(chunk, lease, redispatch_after, concurrency, timeout,
                                       app)
        self.ledger: Any = None

    def bind(self, ledger: Any) -> None:
        """Called by the ``Ledger`` this dispatch is given to: one ledger per dispatch."""
        if self.ledger is not None and self.ledger is not ledger:
            raise UsageError("this dispatch already serves another ledger: give each its own")
        self.ledger = ledger

    def announce(self, app: str) -> None:
        """Before the first item that will be published is marked owed: tell the broker's
        workers which ledger the queue carries, for an adapter whose workers need to know it
        to sweep (RQ's). Nothing by default."""

    def publish(self, messages: Sequence[Message]) -> None:
        raise NotImplementedError


def chunks(seqs: Sequence[int], size: int) -> Iterator[tuple[int, ...]]:
    for i in range(0, len(seqs), size):
        yield tuple(seqs[i:i + size])


class Outbox:
    """Publishes what the ledger owes, always after marking it owed (never the reverse)."""

    def __init__(self, broker: Broker, app: Callable[[], str]) -> None:
        self.broker = broker
        self.app = app  # resolved when first needed: the ledger's module may still be loading
        self.options = broker.options

    # -- a decomposition: the rows of the first stage --------------------------------------

    def owe(self, store: Store, run_id: int, stage: str) -> None:
        """Before the mark: every pending row of ``stage`` owes a message (from
        ``redispatch_after`` from now), so that dying before the publish loses none."""
        app = self.app()  # a ledger the receiving processes cannot import: refused now
        try:
            self.broker.announce(app)
        except Exception as exc:  # noqa: BLE001 - said again at the next publish
            log.warning("could not tell the workers of queue %r about %s: %s: %s",
                        self.broker.queue, app, type(exc).__name__, exc)
        store.items_owe(run_id, stage, self.options.wait)

    def publish_stage(self, store: Store, run: RunRow, stage: str) -> int:
        """After the mark: messages for the stage's pending rows, a page at a time; they were
        marked by :meth:`owe`. Returns how many messages went out."""
        failpoints.hit("dispatch.before_publish")
        sent, after = 0, 0
        while page := store.items_pending_seqs(run.id, stage, after, PAGE):
            after = page[-1][0]
            seqs = [seq for _id, seq in page]
            if not self._publish(self._messages(run.job, run.id, stage, seqs)):
                break  # the broker is away: the sweeper publishes them later
            sent += -(-len(seqs) // self.options.chunk)
            if len(page) < PAGE:
                break
        return sent

    # -- items made pending by a commit (hand-offs, retries, releases) and the sweeper ------

    def send(self, store: Store, job: str, run_id: int, stage: str, seqs: Sequence[int],
             delay: float = 0.0) -> bool:
        """Mark the items still pending as owed the next message, then publish one for them
        (held ``delay`` seconds by the broker). False: the broker would not take it."""
        marked = store.items_mark_dispatched(DispatchMark(run_id, stage, seqs,
                                                          self.options.wait, delay))
        if not marked:
            return True
        failpoints.hit("dispatch.before_publish")
        return self._publish(self._messages(job, run_id, stage, marked, delay))

    def publish_held(self, job: str, run_id: int, stage: str,
                     held: Sequence[HeldBack]) -> bool:
        """Publish the messages of held-back items, marked owed by ``Store.items_hold_back``
        already: each held by the broker until its bucket can serve it."""
        if not held:
            return True
        failpoints.hit("dispatch.before_publish")
        app = self.app()
        return self._publish([Message(app, job, run_id, stage, h.seqs, h.delay, h.held)
                              for h in held])

    def redispatch(self, store: Store, runs: Iterable[ClaimableRun]) -> int:
        """Publish again what the claimable ``runs`` owe by now: every such item, page by
        page, however many. Returns how many items were published; stops at a broker that
        is away (the rest stays owed)."""
        sent = 0
        for run_id, job, *_ in runs:
            while page := store.items_owed(run_id, PAGE, self.options.wait):
                for stage, seqs in _by_stage(page).items():
                    for part in chunks(seqs, self.options.chunk):
                        if not self.send(store, job, run_id, stage, part):
                            return sent
                        sent += len(part)
                if len(page) < PAGE:
                    break
        if sent:
            log.info("re-dispatched %d item(s) whose messages were overdue", sent)
        return sent

    # -- publishing --------------------------------------------------------------------------

    def _messages(self, job: str, run_id: int, stage: str, seqs: Sequence[int],
                  delay: float = 0.0) -> list[Message]:
        app = self.app()
        return [Message(app, job, run_id, stage, part, delay)
                for part in chunks(seqs, self.options.chunk)]

    def _publish(self, messages: list[Message]) -> bool:
        try:
            self.broker.publish(messages)
        except Exception as exc:  # the ledger still owes them: the sweeper publishes later
            log.warning("could not publish %d message(s) to queue %r: %s: %s; the sweeper "
                        "publishes them again after %gs", len(messages), self.broker.queue,
                        type(exc).__name__, exc, self.options.wait)
            return False
        return True


def _by_stage(page: Sequence[tuple[str, int]]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for stage, seq in page:
        found.setdefault(stage, []).append(seq)
    return found


class DispatchingStore(DelegatingStore):
    """A ledger's store when it dispatches through a broker: a run's decomposition is marked
    owed before it is marked decomposed, and published once it is (by whoever decomposes it:
    ``submit``, a resumed submit, the sweeper). Every other method is the store's own."""

    def __init__(self, store: Store, outbox: Outbox) -> None:
        super().__init__(store)
        self._outbox = outbox

    def run_mark_decomposed(self, run_id: int, first_stage: str) -> RunRow:
        self._outbox.owe(self.inner, run_id, first_stage)
        run = self.inner.run_mark_decomposed(run_id, first_stage)
        self._outbox.publish_stage(self.inner, run, first_stage)
        return run


def dispatching(store: Store, outbox: Outbox) -> Store:
    return DispatchingStore(store, outbox)

