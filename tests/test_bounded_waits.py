"""Every wait has a limit (issue 12): PostgreSQL sessions carry bounded waits unless the URL
says otherwise, and verify and closing hooks are held to their time limit."""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import quote

from workledger import Item, Ledger
from workledger.storage.port import ClaimParams, LeaseParams


def _settings(url: str) -> dict[str, str]:
    ledger = Ledger(url)
    try:
        with ledger.store._tx() as conn:  # type: ignore[attr-defined]
            shown = {name: str(next(iter(conn.execute(f"SHOW {name}").fetchone().values())))
                     for name in ("statement_timeout", "lock_timeout",
                                  "idle_in_transaction_session_timeout", "jit")}
            dsn = conn.info.get_parameters()
        shown.update({k: v for k, v in dsn.items() if k.startswith(("keepalives", "tcp_"))})
        return shown
    finally:
        ledger.close()


def test_postgres_sessions_have_bounded_waits_by_default(pg_url: str) -> None:
    got = _settings(pg_url)
    assert (got["statement_timeout"], got["lock_timeout"],
            got["idle_in_transaction_session_timeout"], got["jit"]) == ("1min", "30s", "1min",
                                                                        "off")
    assert got["keepalives_idle"] == "30" and got["tcp_user_timeout"] == "30000"


def test_a_url_overrides_one_session_default_and_keeps_the_others(pg_url: str) -> None:
    sep = "&" if "?" in pg_url else "?"
    if "options=" in pg_url:  # the test URL names its schema in options: add to them
        url = pg_url.replace("options=", "options=" + quote("-c statement_timeout=5min ",
                                                            safe=""), 1)
    else:
        url = f"{pg_url}{sep}options={quote('-c statement_timeout=5min', safe='')}"
    got = _settings(url)
    assert got["statement_timeout"] == "5min"
    assert got["lock_timeout"] == "30s"


def _unknown_awaiting_verify(ledger: Ledger, run_id: int) -> None:
    """Its worker vanished mid-handler: the sweeper will ask the stage's verify hook."""
    claimed = ledger.store.items_claim(ClaimParams(run_id, 10, 0.05))
    ledger.store.items_mark_started(LeaseParams(run_id, [c.id for c in claimed],
                                                claimed[0].lease_token))
    time.sleep(0.1)


def test_a_verify_hook_past_its_time_limit_leaves_the_item_to_a_person(db_url: str) -> None:
    release = threading.Event()
    ledger = Ledger(db_url)
    job = ledger.job("slow-verify")
    job.decompose(lambda p: [Item(key="a")])

    def verify(item: Any, ctx: Any) -> str:
        release.wait(30)  # a downstream that never answers
        return "done"

    job.stage("send", verify=verify, timeout=0.3)(lambda item, ctx: None)
    run_id = job.submit({}).run_id
    _unknown_awaiting_verify(ledger, run_id)
    try:
        ledger.sweep(grace=0)
        (item,) = ledger.items(run_id)
        assert item.state == "unknown"
        assert "the verify hook was still running after 0.3s" in (item.error or "")
    finally:
        release.set()
        ledger.close()


def test_a_closing_hook_past_its_time_limit_is_a_failed_attempt_tried_again(
    db_url: str,
) -> None:
    calls: list[float] = []
    release = threading.Event()
    ledger = Ledger(db_url)
    job = ledger.job("slow-close")
    job.decompose(lambda p: [Item(key="a")])
    job.stage("work", idempotent=True)(lambda item, ctx: None)

    @job.on_complete(timeout=0.3, base_delay=0.0)
    def close(status: Any) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            release.wait(30)  # the first attempt hangs

    run_id = job.submit({}).run_id
    ledger.work(until_idle=True, concurrency=1)
    try:
        if not calls:
            ledger.sweep(grace=0)
        assert len(calls) >= 1
        events = [e for e in ledger.events(run_id) if e.kind in ("retry_scheduled", "closed")]
        assert events and events[0].kind == "retry_scheduled"
        assert "still running after 0.3s" in str(events[0].detail)
        for _ in range(20):  # the next pass runs it again, and this time it returns
            if any(e.kind == "closed" for e in ledger.events(run_id)):
                break
            ledger.sweep(grace=0)
            time.sleep(0.05)
        assert len(calls) == 2
        assert ledger.status(run_id).state == "completed"
    finally:
        release.set()
        ledger.close()

