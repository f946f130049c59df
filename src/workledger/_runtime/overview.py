"""What an operator's view reads besides a run's status: the ledger's metrics at a glance.

:func:`metrics_snapshot` is what ``/metrics`` reports at each scrape. It is built to stay cheap
however many items the ledger holds: complete runs are counted in a few groups by SQL, open
runs are derived one by one from their counters (a few rows each), the age of waiting work
reads the pending items among ``window`` ids from each open run's first pending item (one
step down the claim index, then a bounded id range), and the ledger-wide counts
walk only the partial indexes of claimed, failed and unknown items.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from workledger._runtime.status import status_of
from workledger.core import limits
from workledger.core.status import finished_state as finished_state_of
from workledger.jobs import Job
from workledger.storage.port import Attention, FinishedRuns, Store

# How many ids from a run's first pending item (the next claimed) are looked at for ages.
HEAD_WINDOW = 1000
# Tenants /metrics labels by name, the busiest (most units left in open runs); the rest are
# one label, "other", so the series stay bounded however many customers there are.
TENANT_LABELS = 50


@dataclass(frozen=True)
class MetricsSnapshot:
    runs: dict[tuple[str, str], int]  # (job, derived state): runs
    items: list[tuple[str, str, str, int]]  # (job, stage, state, n) over runs not complete
    oldest_pending: dict[tuple[str, str], float]  # (job, stage): seconds
    attention: Attention = field(default_factory=lambda: Attention(0, 0, 0))
    # open runs by (tenant, derived state), and their units left by tenant: the busiest
    # TENANT_LABELS tenants by name ("default": the runs without one), the rest as "other"
    tenant_runs: dict[tuple[str, str], int] = field(default_factory=dict)
    tenant_left: dict[str, int] = field(default_factory=dict)


def finished_state(group: FinishedRuns, job: Job | None) -> str:
    """The derived state of a group of complete runs (``core/status.py:finished_state``), under
    the tolerance they were submitted with (their job's, before migration 0003)."""
    tolerate = group.tolerate if group.tolerate is not None else (job.tolerate if job else 0)
    return finished_state_of(group.cancelled, group.failed, group.total, tolerate).value


def metrics_snapshot(store: Store, jobs: Mapping[str, Job],
                     window: int = HEAD_WINDOW) -> MetricsSnapshot:
    runs: Counter[tuple[str, str]] = Counter()
    oldest: dict[tuple[str, str], float] = {}
    by_tenant: Counter[tuple[str, str]] = Counter()
    left: Counter[str] = Counter()
    for run in store.runs_open():
        state = status_of(store, run, jobs.get(run.job)).state
        runs[(run.job, state)] += 1
        tenant = run.tenant or limits.DEFAULT_TENANT
        by_tenant[(tenant, state)] += 1
        left[tenant] += max(0, run.total - run.processed - run.failed - run.skipped)
        for stage, age in store.pending_heads(run.id, window).items():
            key = (run.job, stage)
            oldest[key] = max(age, oldest.get(key, 0.0))
    for group in store.runs_finished_summary():
        runs[(group.job, finished_state(group, jobs.get(group.job)))] += group.n
    named = _busiest(left, {t for t, _ in by_tenant})
    tenant_runs: Counter[tuple[str, str]] = Counter()
    for (tenant, state), n in by_tenant.items():
        tenant_runs[(tenant if tenant in named else limits.OTHER_TENANTS, state)] += n
    tenant_left: Counter[str] = Counter()
    for tenant in {t for t, _ in by_tenant}:
        tenant_left[tenant if tenant in named else limits.OTHER_TENANTS] += left[tenant]
    return MetricsSnapshot(runs=dict(runs), items=store.counts_open(), oldest_pending=oldest,
                           attention=store.attention_totals(), tenant_runs=dict(tenant_runs),
                           tenant_left=dict(tenant_left))


def _busiest(left: Counter[str], tenants: set[str]) -> set[str]:
    """The TENANT_LABELS tenants with the most units left (ties by name)."""
    return set(sorted(tenants, key=lambda t: (-left[t], t))[:TENANT_LABELS])
