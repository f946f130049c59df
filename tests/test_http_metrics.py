"""``/metrics`` on both backends: what the ledger holds, in Prometheus text format, labelled
by job, stage and state only."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from web_support import client_for, make_unknown, wait_for

from workledger.storage.port import ClaimParams

pytestmark = pytest.mark.integration

NAMES = {"workledger_runs", "workledger_items", "workledger_oldest_pending_seconds",
         "workledger_expired_leases", "workledger_unknown_items", "workledger_failed_items"}


def scrape(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            found.setdefault(sample.name, {})[labels] = sample.value
    return found


def test_metrics_report_runs_items_waits_and_what_needs_a_person(db_url: str) -> None:
    with client_for(db_url) as (client, ledger):
        ledger.submit("numbers", {"n": 5, "fail": [1, 2]}, key="done")  # run 1: failed
        ledger.work(until_idle=True, jobs=["numbers"])
        ledger.submit("numbers", {"n": 3, "skip": [0]}, key="open")  # run 2: running
        sends = ledger.submit("sends", {"n": 4}, key="s").run_id  # run 3: unknown + expired
        make_unknown(ledger, sends)
        ledger.store.items_claim(ClaimParams(sends, 1, 0.01))
        wait_for(lambda: ledger.store.leases_expired(), what="an expired lease")
        got = client.get("/metrics")
        assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
        m = scrape(got.text)
    assert NAMES <= set(m)
    assert m["workledger_runs"] == {
        (("job", "numbers"), ("state", "failed")): 1,
        (("job", "numbers"), ("state", "running")): 1,
        (("job", "sends"), ("state", "awaiting_repair")): 1}
    # items of runs not complete only: run 1's are not there
    assert m["workledger_items"] == {
        (("job", "numbers"), ("stage", "double"), ("state", "pending")): 2,
        (("job", "numbers"), ("stage", "double"), ("state", "skipped")): 1,
        (("job", "sends"), ("stage", "send"), ("state", "claimed")): 1,
        (("job", "sends"), ("stage", "send"), ("state", "pending")): 2,
        (("job", "sends"), ("stage", "send"), ("state", "unknown")): 1}
    ages = m["workledger_oldest_pending_seconds"]
    assert set(ages) == {(("job", "numbers"), ("stage", "double")),
                         (("job", "sends"), ("stage", "send"))}
    assert all(0 <= v < 600 for v in ages.values())
    assert m["workledger_expired_leases"] == {(): 1}
    assert m["workledger_unknown_items"] == {(): 1}
    assert m["workledger_failed_items"] == {(): 2}
    labels = {name for series in m.values() for key in series for name, _ in key}
    assert labels <= {"job", "stage", "state", "tenant"}
    assert m["workledger_tenant_runs"] == {(("state", "running"), ("tenant", "default")): 1,
                                           (("state", "awaiting_repair"),
                                            ("tenant", "default")): 1}


def test_tenants_are_labelled_by_name_for_the_fifty_busiest_and_the_rest_as_other(
        db_url: str) -> None:
    with client_for(db_url) as (client, ledger):
        for i in range(53):  # tenant t<i> has one open run of i + 1 units
            ledger.submit("numbers", {"n": i + 1}, key=f"k{i}", tenant=f"t{i:02}")
        m = scrape(client.get("/metrics").text)
    runs = m["workledger_tenant_runs"]
    named = {dict(k)["tenant"] for k in runs}
    assert named == {f"t{i:02}" for i in range(3, 53)} | {"other"}
    assert runs[(("state", "running"), ("tenant", "other"))] == 3
    left = m["workledger_tenant_units_left"]
    assert left[(("tenant", "other"),)] == 1 + 2 + 3
    assert left[(("tenant", "t52"),)] == 53


def test_complete_runs_are_counted_by_their_derived_state(db_url: str) -> None:
    with client_for(db_url) as (client, ledger):
        tolerant = ledger.job("numbers")
        tolerant.tolerate = 1
        ledger.submit("numbers", {"n": 3, "fail": [0]}, key="within")
        ledger.submit("numbers", {"n": 3}, key="clean")
        ledger.work(until_idle=True)
        tolerant.tolerate = 0
        ledger.submit("numbers", {"n": 2, "fail": [0, 1]}, key="over")
        ledger.work(until_idle=True)
        ledger.cancel(ledger.submit("sends", {"n": 2}, key="c").run_id)
        states = {st.run_id: st.state for st in ledger.runs()}
        m = scrape(client.get("/metrics").text)["workledger_runs"]
    assert sorted(states.values()) == ["cancelled", "completed", "completed_with_failures",
                                       "failed"]
    assert m == {(("job", "numbers"), ("state", "completed")): 1,
                 (("job", "numbers"), ("state", "completed_with_failures")): 1,
                 (("job", "numbers"), ("state", "failed")): 1,
                 (("job", "sends"), ("state", "cancelled")): 1}
