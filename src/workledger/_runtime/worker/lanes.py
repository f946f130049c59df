"""A worker's claim loops: one *lane* per kind of executor its stages run in.

A worker whose stages all run in one place (its threads, or its handler processes) has one
lane over every stage: the claim loop described in docs/design.md. A worker with handler
processes and a stage kept in threads (the payroll demo: ``generate`` renders in processes,
``deliver`` sends from threads) has two, each claiming only its own stages and running in a
thread of its own, so that neither kind of executor waits for the other's chunk: the processes
render while the threads deliver what was rendered a moment before. The handler processes'
lane keeps two chunks in flight, so they never wait for a claim or a flush between chunks.

A lane runs a chunk in the claiming thread when it holds one chunk at a time, and each chunk in
a thread of its own when it holds more. :class:`Nudge` tells idle lanes that work may be there
(a chunk handed items on to their stage, a chunk finished, the store woke the worker).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from workledger._runtime.handlers.executors import Executor
from workledger.core.shares import Shares


class Nudge:
    """A counter lanes wait on: each nudge wakes every lane waiting for one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.generation = 0

    def __call__(self) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> bool:
        """Block until a nudge after generation ``seen`` (True), or ``timeout`` s (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.generation != seen, timeout)


@dataclass(eq=False)
class Lane:
    """One claim loop. ``stages``: the (job, stage) pairs it claims (None: every stage, the one
    lane of a worker whose stages all run in one place); ``depth``: chunks in flight at once."""

    name: str
    executor: Executor
    stages: frozenset[tuple[str, str]] | None = None
    depth: int = 1
    cursor: dict[int, int] = field(default_factory=dict)  # per run: claim ids above this
    # per (priority, tenant): the run to claim from first, so a small run is not stuck behind
    # a big one; and each tenant's credit in the weighted rotation across tenants
    turns: dict[tuple[int, str | None], int] = field(default_factory=dict)
    shares: Shares = field(default_factory=Shares)
    seen: int = 0  # the last nudge it looked at
    failure: BaseException | None = None  # what ended a chunk run in a thread of its own
    _running: list[threading.Thread] = field(default_factory=list)

    def claims(self, job: str, stage: str) -> bool:
        return self.stages is None or (job, stage) in self.stages

    @property
    def busy(self) -> bool:
        """Some of its chunks are still running."""
        self._running = [t for t in self._running if t.is_alive()]
        return bool(self._running)

    @property
    def room(self) -> bool:
        """It may claim another chunk now."""
        return not self.busy or len(self._running) < self.depth

    def run(self, work: Callable[[], None], done: Callable[[], None]) -> None:
        """Run a chunk: here, for a lane of one chunk at a time; else in a thread of its own,
        which calls ``done`` when it ends (and keeps what ended it, for the lane to raise)."""
        if self.depth == 1:
            work()
            return

        def run() -> None:
            try:
                work()
            except BaseException as exc:  # raised by the lane's loop, in the worker's thread
                self.failure = exc
            finally:
                done()

        thread = threading.Thread(target=run, name=f"wl-chunk-{self.name}", daemon=True)
        self._running.append(thread)
        thread.start()

    def raise_failure(self) -> None:
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure

    def join(self, timeout: float = 120.0) -> None:
        for thread in self._running:
            thread.join(timeout)
        self._running = []
