"""What a reader gets back: a run's status derived from the ledger, and a submission."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class RunStatus:
    """A run's state derived from its items (never from its stored counters alone)."""

    run_id: int
    job: str
    key: str
    state: str
    total: int
    complete: bool
    counts: dict[str, dict[str, int]]
    processed: int
    failed: int
    skipped: int
    next: str
    created_at: str
    decomposed_at: str | None
    completed_at: str | None
    error: str | None
    priority: int = 0  # -1000..1000: higher runs are claimed first
    tenant: str | None = None  # None: the default tenant ("default")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TenantStatus:
    """A tenant as ``workledger tenant NAME`` shows it: its weight (1 unless set), who set
    it last and why, and how many of its runs are open."""

    name: str
    weight: int
    open_runs: int
    updated_at: str | None = None
    updated_by: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Submission:
    run_id: int
    created: bool
    status: RunStatus
    resumed: bool = False  # an existing run whose decomposition, cut short, was carried on

    @property
    def state(self) -> str:
        return self.status.state

    @property
    def next(self) -> str:
        return self.status.next


@dataclass(frozen=True)
class ScheduleStatus:
    """A schedule as ``workledger schedules`` shows it: its declaration (where the loaded app
    declares it) and what the ledger recorded (``wl_schedules``, ``wl_firings``). Times are
    ISO 8601 in UTC."""

    name: str
    job: str
    spec: str
    tz: str
    catch_up: str | None  # None: the loaded app does not declare it
    overlap: str | None
    declared: bool  # the loaded app declares it (only then does a sweeper fire it)
    recorded: bool  # a sweeper has recorded it (wl_schedules)
    paused: bool
    paused_at: str | None
    paused_by: str | None
    next_fire_at: str | None
    last_fire_at: str | None
    last_run_id: int | None
    last_run_state: str | None
    waiting_fire_at: str | None
    missed: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
