"""``/metrics``: a Prometheus collector that reads the ledger at scrape time.

Labels are jobs, stages, states and tenants only, never a run or an item, so the number of
series stays small however many runs there are: the tenants by name are the 50 busiest, the
rest one ``other``. What it reads is bounded (``_runtime/overview.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from workledger.api import Ledger


class LedgerCollector(Collector):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[Metric]:
        snap = self.ledger.metrics()
        runs = GaugeMetricFamily("workledger_runs", "Runs by job and derived state.",
                                 labels=["job", "state"])
        for (job, state), n in sorted(snap.runs.items()):
            runs.add_metric([job, state], n)
        items = GaugeMetricFamily("workledger_items",
                                  "Items of runs not complete, by job, stage and state.",
                                  labels=["job", "stage", "state"])
        for job, stage, state, n in snap.items:
            items.add_metric([job, stage, state], n)
        oldest = GaugeMetricFamily(
            "workledger_oldest_pending_seconds",
            "Age of the oldest of the pending items workers claim next, by job and stage.",
            labels=["job", "stage"])
        for (job, stage), age in sorted(snap.oldest_pending.items()):
            oldest.add_metric([job, stage], age)
        yield from (runs, items, oldest)
        by_tenant = GaugeMetricFamily(
            "workledger_tenant_runs",
            "Runs not complete by tenant (the 50 busiest; the rest as other) and derived "
            "state.", labels=["tenant", "state"])
        for (tenant, state), n in sorted(snap.tenant_runs.items()):
            by_tenant.add_metric([tenant, state], n)
        left = GaugeMetricFamily(
            "workledger_tenant_units_left",
            "Units not yet done in the runs not complete, by tenant (the 50 busiest; the rest "
            "as other).", labels=["tenant"])
        for tenant, n in sorted(snap.tenant_left.items()):
            left.add_metric([tenant], n)
        yield from (by_tenant, left)
        a = snap.attention
        yield GaugeMetricFamily("workledger_expired_leases",
                                "Claimed items whose lease has expired.", value=a.expired_leases)
        yield GaugeMetricFamily("workledger_unknown_items",
                                "Items whose outcome is unknown.", value=a.unknown)
        yield GaugeMetricFamily("workledger_failed_items", "Failed items.", value=a.failed)
        yield from self._deadlines()

    def _deadlines(self) -> Iterator[Metric]:
        now, rows = self.ledger.deadlines()
        past = GaugeMetricFamily("workledger_runs_past_deadline",
                                 "Runs not complete past their deadline, by job.", labels=["job"])
        near = GaugeMetricFamily("workledger_runs_near_deadline",
                                 "Runs not complete inside their deadline's warning, by job.",
                                 labels=["job"])
        counts: dict[tuple[bool, str], int] = {}
        for d in rows:
            late = d.deadline_at <= now
            counts[(late, d.job)] = counts.get((late, d.job), 0) + 1
        for (late, job), n in sorted(counts.items()):
            (past if late else near).add_metric([job], n)
        yield from (past, near)


def registry_for(ledger: Ledger) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(ledger))
    return registry
