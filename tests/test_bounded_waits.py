"""Every wait has a limit (issue 12): PostgreSQL sessions carry bounded waits unless the URL
says otherwise, and verify and closing hooks are held to their time limit."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any
from urllib.parse import quote

import pytest

from workledger import Item, Ledger
from workledger.storage.port import ClaimParams, LeaseParams

pytestmark = pytest.mark.integration


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


def test_a_closing_hook_past_its_time_limit_keeps_its_entry_until_it_ends(
    db_url: str,
) -> None:
    """A hook past its limit is not written off and run again while it may still act (issue
    21): its entry stays held, a sweep meanwhile finds nothing to run, and what the hook did
    is written when it ends."""
    calls: list[float] = []
    release = threading.Event()
    ledger = Ledger(db_url)
    job = ledger.job("slow-close")
    job.decompose(lambda p: [Item(key="a")])
    job.stage("work", idempotent=True)(lambda item, ctx: None)

    @job.on_complete(timeout=0.3, base_delay=0.0)
    def close(status: Any) -> None:
        calls.append(time.monotonic())
        release.wait(30)  # past its limit until the test lets it go

    def meanwhile() -> None:
        while not calls:
            time.sleep(0.05)
        time.sleep(0.8)  # past its limit
        ledger.sweep(grace=0)  # the entry is held: nothing runs the hook again
        release.set()

    run_id = job.submit({}).run_id
    other = threading.Thread(target=meanwhile)
    other.start()
    try:
        ledger.work(until_idle=True, concurrency=1)  # its sweeper waits for the hook to end
        other.join(30)
        assert len(calls) == 1
        kinds = [e.kind for e in ledger.events(run_id) if e.kind in ("retry_scheduled", "closed")]
        assert kinds == ["closed"]
        (entry,) = ledger.items(run_id, stage="@close", limit=10)
        assert entry.state == "processed"
        assert ledger.status(run_id).state == "completed"
    finally:
        release.set()
        ledger.close()


def test_items_waiting_their_turn_in_a_timed_stage_keep_their_lease(db_url: str) -> None:
    """A stage with a time limit runs one item per task; the items of the chunk still waiting
    for a thread have their leases renewed too, so none is taken back and run twice."""
    runs: Counter[str] = Counter()
    lock = threading.Lock()
    ledger = Ledger(db_url)
    job = ledger.job("timed")
    job.decompose(lambda p: (Item(key=f"k{i}") for i in range(24)))

    @job.stage("s", idempotent=True, timeout=30)
    def s(item: Any, ctx: Any) -> None:
        with lock:
            runs[str(item.key)] += 1
        time.sleep(0.25)

    run_id = job.submit({}).run_id
    report = ledger.work(concurrency=2, chunk=24, lease=2.0, until_idle=True)
    try:
        assert (report.processed, report.stale, report.reclaimed) == (24, 0, 0)
        assert set(runs.values()) == {1} and len(runs) == 24
        assert ledger.status(run_id).state == "completed"
    finally:
        ledger.close()


def _with_options(pg_url: str, extra: str) -> str:
    if "options=" in pg_url:  # the test URL names its schema in options: add to them
        return pg_url.replace("options=", "options=" + quote(extra + " ", safe=""), 1)
    sep = "&" if "?" in pg_url else "?"
    return f"{pg_url}{sep}options={quote(extra, safe='')}"


def test_a_lock_held_past_lock_timeout_is_waited_out_not_fatal(pg_url: str) -> None:
    """A worker whose write waits past lock_timeout (an operator's long transaction holding
    the run row) tries it again, rolled back whole, instead of exiting."""
    import psycopg

    url = _with_options(pg_url, "-c lock_timeout=500ms")
    ledger = Ledger(url)
    job = ledger.job("locked")
    job.decompose(lambda p: (Item(key=str(i)) for i in range(30)))
    job.stage("s", idempotent=True)(lambda item, ctx: time.sleep(0.05))
    run_id = job.submit({}).run_id
    held = threading.Event()

    def hold() -> None:
        with psycopg.connect(pg_url) as conn:
            conn.execute("SELECT 1 FROM wl_runs WHERE id = %s FOR UPDATE", (run_id,))
            held.set()
            time.sleep(1.5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        report = ledger.work(concurrency=2, chunk=10, lease=10, until_idle=True)
        assert report.processed == 30
        assert ledger.status(run_id).state == "completed"
    finally:
        holder.join()
        ledger.close()


def test_pgoptions_applies_when_the_url_sets_no_options(pg_url: str, monkeypatch: Any) -> None:
    import psycopg

    base = pg_url.split("?")[0]
    schema = f"wl_pgoptions_{int(time.time() * 1000) % 10**9}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        monkeypatch.setenv("PGOPTIONS", f"-c search_path={schema}")
        ledger = Ledger(base)
        try:
            ledger.init()
        finally:
            ledger.close()
        with psycopg.connect(base, autocommit=True) as conn:
            row = conn.execute("SELECT table_schema FROM information_schema.tables "
                               "WHERE table_name = 'wl_runs' AND table_schema = %s",
                               (schema,)).fetchone()
        assert row is not None  # the ledger went where PGOPTIONS said, not to public
        assert _settings(base)["lock_timeout"] == "30s"  # and kept its bounded waits
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
