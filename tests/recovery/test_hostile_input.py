"""Hostile input is refused or recorded with a reason, the same way on both backends."""

from __future__ import annotations

from typing import Any

import pytest

from workledger import Item, Ledger, Permanent, Skip
from workledger.errors import BadInput

pytestmark = pytest.mark.integration


def hostile_ledger(url: str) -> Ledger:
    ledger = Ledger(url)
    job = ledger.job("hostile")

    @job.decompose
    def split(payload: dict[str, Any]) -> Any:
        yield Item(key="nul\x00key")
        yield Item(key="nul-data", data={"x": "a\x00b"})
        yield Item(key="nan-data", data={"x": float("nan")})
        yield Item(key="surrogate\udcff")
        yield Skip(key="bad", reason="reason with \x00 inside")
        yield "not an item"
        yield Item(key="nul-result")
        yield Item(key="nul-error")
        yield Item(key="big", data={"blob": "x" * 200_000})
        yield Item(key="fine")

    @job.stage("apply", idempotent=True, max_attempts=1)
    def apply(item: Any, ctx: Any) -> Any:
        if item.key == "nul-result":
            return {"text": "a\x00b"}
        if item.key == "nul-error":
            raise Permanent("broken \x00 here")
        return {"len": len(str(item.data))}

    return ledger


def test_hostile_units_become_reasons_not_crashes(db_url: str) -> None:
    ledger = hostile_ledger(db_url)
    sub = ledger.job_named("hostile").submit({"n": 1}, key="h")
    ledger.work(concurrency=2, until_idle=True)
    items = {i.seq: i for i in ledger.items(sub.run_id)}
    assert items[0].state == "skipped" and items[0].key == "nul\\x00key"
    assert items[1].state == "skipped" and "NUL" in (items[1].error or "")
    assert items[2].state == "skipped" and "JSON" in (items[2].error or "")
    assert items[3].state == "skipped" and "invalid" in (items[3].error or "")
    assert items[4].error == "reason with \\x00 inside"
    assert items[5].state == "skipped" and "not Item or Skip" in (items[5].error or "")
    assert items[6].state == "failed" and "cannot be stored" in (items[6].error or "")
    assert items[7].state == "failed" and items[7].error == "broken \\x00 here"
    assert items[8].state == "processed" and items[8].result == {"len": len(str(items[8].data))}
    assert items[9].state == "processed"
    st = ledger.status(sub.run_id)
    assert (st.total, st.processed, st.failed, st.skipped) == (10, 2, 2, 6)
    assert not ledger.reconcile(sub.run_id, dry_run=True).repaired


@pytest.mark.parametrize("payload", [{"x": float("nan")}, {"x": "a\x00b"}, {"x": object()}])
def test_unstorable_payload_is_refused_and_nothing_is_written(db_url: str, payload: Any) -> None:
    ledger = hostile_ledger(db_url)
    with pytest.raises(BadInput, match="payload"):
        ledger.job_named("hostile").submit(payload, key="bad")
    assert ledger.runs() == []


def test_zero_units_complete_at_once(db_url: str) -> None:
    ledger = Ledger(db_url)
    job = ledger.job("empty")
    job.decompose(lambda payload: iter(()))
    job.stage("apply")(lambda item, ctx: None)
    sub = job.submit({}, key="z")
    assert (sub.state, sub.status.total, sub.status.complete) == ("completed", 0, True)
