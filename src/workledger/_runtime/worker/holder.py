"""What a claimed chunk needs from the worker that holds it: its options, its report, and the
handful of attributes :class:`~workledger._runtime.worker.chunk.Chunk` reads. A protocol here,
so the chunk does not import the worker that imports it."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from workledger.core.states import ItemState
from workledger.storage.port import Store


@dataclass(frozen=True)
class WorkerOptions:
    concurrency: int = 4
    chunk: int = 100
    lease: float = 30.0  # seconds
    until_idle: bool = False
    poll: float = 0.5  # seconds between claims when idle, where nothing wakes other processes
    idle_poll: float = 5.0  # the same where the store wakes idle workers (PostgreSQL NOTIFY)
    flush_every: float = 1.0  # write finished outcomes at least this often within a chunk
    reclaim_every: float | None = None  # the sweeper's period; default min(lease / 2, 10 s)
    timeout: float | None = None  # a handler's time limit where its stage sets none
    log_every: float = 30.0  # seconds between the summaries the worker logs
    processes: int = 1  # child processes for handlers (1: the worker's own threads only)
    app: str | None = None  # module:attribute the child processes import

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.chunk < 1:
            raise ValueError("concurrency and chunk must be at least 1")
        if self.lease <= 0:
            raise ValueError("lease must be positive")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError("timeout must be positive")
        if self.processes < 1:
            raise ValueError("processes must be at least 1")
        if self.processes > 1 and not self.app:
            raise ValueError("handler processes need the app they import (module:attribute)")


@dataclass
class WorkReport:
    claimed: int = 0
    processed: int = 0
    failed: int = 0
    skipped: int = 0
    retried: int = 0
    stale: int = 0
    released: int = 0
    reclaimed: int = 0
    chunks: int = 0
    abandoned: int = 0  # handlers abandoned past their time limit
    lost_processes: int = 0  # items whose handler process died while running them
    stuck: bool = False  # stopped because more handlers were stuck than it has threads
    by_state: dict[str, int] = field(default_factory=dict)

    def add_outcomes(self, states: Mapping[str, int]) -> None:
        """Count applied finishes, ``{state written: n}``: a pending one was retried."""
        for state, n in states.items():
            self.by_state[state] = self.by_state.get(state, 0) + n
            if state == ItemState.PENDING:
                self.retried += n
            elif state == ItemState.PROCESSED:
                self.processed += n
            elif state == ItemState.FAILED:
                self.failed += n
            elif state == ItemState.SKIPPED:
                self.skipped += n


class Late(Protocol):
    """Where a handler abandoned past its time limit is left, its items held, until it ends
    (``_runtime/worker/chunk.py``, ``LateResults``)."""

    def add(self, holder: Holder, overrun: Any) -> None: ...


class Holder(Protocol):
    """The worker, as a chunk sees it."""

    store: Store
    options: WorkerOptions
    report: WorkReport
    worker_id: str
    rng: random.Random
    clock: Callable[[], float]
    count_lock: threading.Lock  # held while the report is moved: chunks run side by side
    @property
    def late(self) -> Late: ...
    def nudge(self) -> None: ...  # items became claimable: idle lanes of the worker look
    @property
    def stopping(self) -> bool: ...
