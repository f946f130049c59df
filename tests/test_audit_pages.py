"""Audit's filters in the queries and its findings a page at a time, on both backends: the
pages of a filter add up to exactly what the whole audit lists for it, and ``/api/audit``
pages the same way with ``limit`` and ``after``."""

from __future__ import annotations

from typing import Any

import pytest
from web_support import build, client_for, make_unknown

from workledger import Ledger
from workledger.api import since_time
from workledger.errors import BadInput
from workledger.storage.port import AuditItems

pytestmark = pytest.mark.contract


def seeded(url: str) -> tuple[Ledger, int, int, int]:
    ledger = build(url)
    first = ledger.submit("numbers", {"n": 5, "fail": [1, 3]}, key="a").run_id
    ledger.work(until_idle=True, jobs=["numbers"])
    sends = ledger.submit("sends", {"n": 2}, key="s").run_id
    make_unknown(ledger, sends)
    last = ledger.submit("numbers", {"n": 2, "fail": [0]}, key="c").run_id
    ledger.work(until_idle=True, jobs=["numbers"])
    return ledger, first, sends, last


def key(finding: Any) -> tuple[Any, ...]:
    return (finding.kind, finding.run_id, finding.stage, finding.seq)


def all_pages(ledger: Ledger, limit: int, **where: Any) -> list[Any]:
    found, after = [], None
    while True:
        page = ledger.audit_page(limit=limit, after=after, **where)
        assert len(page.findings) <= limit
        found += page.findings
        if page.next is None:
            return found
        after = page.next


def test_pages_of_any_size_add_up_to_the_whole_audit(db_url: str) -> None:
    ledger, first, sends, last = seeded(db_url)
    try:
        whole = [key(f) for f in ledger.audit()]
        assert len(whole) == 4  # three failed, one unknown
        for limit in (1, 2, 3, 1000):
            assert [key(f) for f in all_pages(ledger, limit)] == whole, limit
        for where in ({"run_id": first}, {"run_id": sends}, {"job": "sends"},
                      {"job": "numbers"}, {"run_id": 999}, {"job": "nothing"}):
            expected = [key(f) for f in ledger.audit(**where)]
            assert [key(f) for f in all_pages(ledger, 1, **where)] == expected, where
            assert all(k[1] == where.get("run_id", k[1]) for k in expected)
        assert {k[1] for k in whole if k[0] == "failed"} == {first, last}
        assert [k[1] for k in [key(f) for f in ledger.audit(job="sends")]] == [sends]
        assert ledger.audit(run_id=999) == []
        assert ledger.audit(since=since_time("2999-01-01")) == []
        with pytest.raises(BadInput, match="next of the previous page"):
            ledger.audit_page(after="x.1")
    finally:
        ledger.close()


def test_the_item_queries_filter_by_run_job_and_time_and_go_on_after_an_id(db_url: str
                                                                         ) -> None:
    ledger, first, sends, last = seeded(db_url)
    store = ledger.store
    try:
        every = store.items_audit(AuditItems("attention"))
        assert [i.run_id for i in every] == [first, first, sends, last]
        assert [i.seq for i in store.items_audit(AuditItems("attention", run_id=first))] \
            == [1, 3]
        assert [i.run_id for i in store.items_audit(AuditItems("attention", job="sends"))] \
            == [sends]
        after = store.items_audit(AuditItems("attention", after_id=every[1].id, limit=1))
        assert [i.id for i in after] == [every[2].id]
        assert store.items_audit(AuditItems("attention", since=since_time("2999-01-01"))) == []
        assert len(store.items_audit(AuditItems("attention", since=since_time("1h")))) == 4
        assert store.items_audit(AuditItems("expired")) == []
    finally:
        ledger.close()


def test_api_audit_pages_with_limit_and_after(db_url: str) -> None:
    ledger, first, _sends, _last = seeded(db_url)
    ledger.close()
    with client_for(db_url) as (client, _ledger):
        whole = client.get("/api/audit").json()
        assert whole["next"] is None and len(whole["findings"]) == 4
        found, after = [], None
        while True:
            page = client.get("/api/audit", params={"limit": 1, **(
                {"after": after} if after else {})}).json()
            found += page["findings"]
            if page["next"] is None:
                break
            after = page["next"]
        assert found == whole["findings"]
        one_run = client.get("/api/audit", params={"run": first}).json()["findings"]
        assert {f["run_id"] for f in one_run} == {first}
        assert client.get("/api/audit", params={"after": "nonsense"}).status_code == 400
        html = client.get("/audit").text
        assert "Next page" not in html and "audit" in html
