"""Decomposition that fails part-way, and its re-entry through the sweeper (issue 3)."""

from __future__ import annotations

from typing import Any

import pytest

from workledger import Item, Ledger
from workledger.errors import DecompositionFailed

pytestmark = pytest.mark.integration


def flaky_ledger(url: str, behaviour: dict[str, Any]) -> Ledger:
    ledger = Ledger(url)
    job = ledger.job("flaky", batch_size=5)

    @job.decompose
    def split(payload: dict[str, Any]) -> Any:
        for i in range(payload["n"]):
            if behaviour.get("raise_at") == i:
                raise ValueError(f"upstream hiccup at {i}")
            yield Item(key=f"{behaviour.get('prefix', 'k')}{i}")

    @job.stage("apply", idempotent=True)
    def apply(item: Any, ctx: Any) -> Any:
        return item.key

    return ledger


def test_decomposer_raising_part_way_keeps_rows_and_dispatches_nothing(db_url: str) -> None:
    behaviour: dict[str, Any] = {"raise_at": 12}
    ledger = flaky_ledger(db_url, behaviour)
    with pytest.raises(DecompositionFailed, match="upstream hiccup at 12"):
        ledger.job_named("flaky").submit({"n": 20}, key="d1")
    (run,) = ledger.runs()
    assert (run.state, run.next) == ("accepted", "sweeper")
    assert "upstream hiccup" in (run.error or "")
    assert sum(run.counts["apply"].values()) == 12  # every row it yielded before raising
    assert ledger.work(concurrency=1, until_idle=True).claimed == 0
    again = ledger.job_named("flaky").submit({"n": 20}, key="d1")
    assert (again.created, again.state) == (False, "accepted")
    behaviour.clear()
    report = ledger.sweep(grace=0.0)
    assert report.redecomposed == 1
    status = ledger.status(run.run_id)
    assert (status.state, status.total, status.error) == ("running", 20, None)
    ledger.work(concurrency=1, until_idle=True)
    assert ledger.status(run.run_id).state == "completed"


def test_sweeper_waits_for_a_live_decomposition(db_url: str) -> None:
    behaviour: dict[str, Any] = {"raise_at": 3}
    ledger = flaky_ledger(db_url, behaviour)
    with pytest.raises(DecompositionFailed):
        ledger.job_named("flaky").submit({"n": 8}, key="d2")
    behaviour.clear()
    assert ledger.sweep(grace=60.0).redecomposed == 0  # recent progress: leave it alone


def test_changed_decomposer_output_is_detected_not_mixed(db_url: str) -> None:
    behaviour: dict[str, Any] = {"raise_at": 7}
    ledger = flaky_ledger(db_url, behaviour)
    with pytest.raises(DecompositionFailed):
        ledger.job_named("flaky").submit({"n": 10}, key="d3")
    behaviour.clear()
    behaviour["prefix"] = "other-"
    report = ledger.sweep(grace=0.0)
    assert report.decomposition_errors == 1
    (run,) = ledger.runs()
    assert run.state == "failed"
    assert "output changed" in (run.error or "") and "seq 0" in (run.error or "")
    assert sum(run.counts["apply"].values()) == 7  # nothing added on top of the kept rows
    finding = [f for f in ledger.audit() if f.kind == "not_decomposed"]
    assert finding and finding[0].needs_person
