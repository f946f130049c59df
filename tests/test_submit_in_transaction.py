"""Submitting inside the caller's transaction (``submit(..., conn=...)``, docs/design.md): the
run exists if and only if the caller commits, and a committed one is decomposed at once by a
worker or the sweeper, without the grace that protects a slow original submitter."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import replace
from typing import Any
from urllib.parse import quote, unquote

import psycopg
import pytest

from workledger import Item, Ledger
from workledger._runtime.worker.worker import Worker
from workledger.errors import BadInput, PayloadMismatch, UsageError

pytestmark = pytest.mark.integration

DEADLINE = 15.0  # seconds: well under the sweeper's 30 s grace, far above what it takes


def make_ledger(url: str) -> Ledger:
    ledger = Ledger(url)
    job = ledger.job("fulfil")

    @job.decompose
    def split(payload: dict[str, Any]) -> Iterator[Item]:
        for n in range(payload["units"]):
            yield Item(key=f"u{n}")

    job.stage("ship", idempotent=True)(lambda item, ctx: {"shipped": item.key})
    ledger.init()
    return ledger


def connect(url: str) -> Any:
    """The caller's own connection to the ledger's database, with a table of its own."""
    conn: Any
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(unquote(url[len("sqlite:///"):]))
    else:
        conn = psycopg.connect(url)
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id integer PRIMARY KEY, note text)")
    conn.commit()
    return conn


@pytest.fixture
def ledger(db_url: str) -> Iterator[Ledger]:
    with make_ledger(db_url) as ledger:
        yield ledger


@pytest.fixture
def caller(db_url: str) -> Iterator[Any]:
    conn = connect(db_url)
    try:
        yield conn
    finally:
        conn.close()


def count(url: str, sql: str) -> int:
    """A count read on a connection of its own: what is committed."""
    with closing(connect(url)) as conn:
        return int(conn.execute(sql).fetchone()[0])


@contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)


def wait_for(check: Any, deadline: float = DEADLINE) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < deadline, "not done before the deadline"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_rolled_back_transaction_leaves_no_run_and_no_event(
        db_url: str, ledger: Ledger, caller: Any) -> None:
    caller.execute("INSERT INTO orders (id, note) VALUES (7, 'seven')")
    sub = ledger.submit("fulfil", {"units": 3}, key="order-7", conn=caller)
    assert (sub.created, sub.state) == (True, "accepted")
    # inside the transaction the caller sees its run; nobody else does
    assert caller.execute("SELECT count(*) FROM wl_runs").fetchone()[0] == 1
    assert count(db_url, "SELECT count(*) FROM wl_runs") == 0
    caller.rollback()
    assert ledger.runs() == []
    assert count(db_url, "SELECT count(*) FROM wl_events") == 0
    assert count(db_url, "SELECT count(*) FROM orders") == 0


def test_a_committed_run_is_decomposed_and_completed_by_a_worker_without_the_grace(
        db_url: str, ledger: Ledger, caller: Any) -> None:
    worker = ledger.worker(lease=30.0)  # its sweeper's grace: 30 s
    # its sweeper passes once, as it starts, and not again: the claim loop must take the run
    worker.options = replace(worker.options, reclaim_every=3600.0)
    with running(worker):
        time.sleep(0.6)  # the worker is idle, waiting for work, when the caller commits
        caller.execute("INSERT INTO orders (id, note) VALUES (1, 'one')")
        sub = ledger.submit("fulfil", {"units": 40}, key="order-1", conn=caller)
        caller.commit()
        took = wait_for(lambda: ledger.status(sub.run_id).complete)
    status = ledger.status(sub.run_id)
    assert (status.state, status.total, status.processed) == ("completed", 40, 40)
    assert took < DEADLINE  # not after the 30 s grace: a worker took it at once
    assert count(db_url, "SELECT count(*) FROM orders") == 1
    kinds = [e.kind for e in ledger.events(sub.run_id)]
    assert kinds[:2] == ["submitted", "decomposed"]
    assert ledger.events(sub.run_id)[0].detail == {"key": "order-1", "deferred": True}


def test_only_the_run_row_is_written_in_the_callers_transaction(
        ledger: Ledger, caller: Any) -> None:
    sub = ledger.submit("fulfil", {"units": 20_000}, key="big", conn=caller)
    assert caller.execute("SELECT count(*) FROM wl_items").fetchone()[0] == 0
    assert caller.execute("SELECT count(*) FROM wl_events").fetchone()[0] == 1
    caller.commit()
    assert ledger.work().processed == 20_000  # decomposed after the commit, by the worker
    assert ledger.status(sub.run_id).state == "completed"


def test_the_same_key_twice_returns_the_run_and_its_real_state(
        ledger: Ledger, caller: Any) -> None:
    first = ledger.submit("fulfil", {"units": 2}, key="k", conn=caller)
    again = ledger.submit("fulfil", {"units": 2}, key="k", conn=caller)  # same transaction
    assert (again.created, again.run_id, again.state) == (False, first.run_id, "accepted")
    caller.commit()
    ledger.work()
    later = ledger.job_named("fulfil").submit({"units": 2}, key="k", conn=caller)
    caller.rollback()
    assert (later.created, later.run_id, later.state) == (False, first.run_id, "completed")
    assert later.status.processed == 2
    plain = ledger.submit("fulfil", {"units": 2}, key="k")  # and without a connection
    assert (plain.created, plain.run_id, plain.state) == (False, first.run_id, "completed")


def test_the_same_key_with_another_payload_is_refused_and_writes_nothing(
        db_url: str, ledger: Ledger, caller: Any) -> None:
    first = ledger.submit("fulfil", {"units": 2}, key="k", conn=caller)
    caller.commit()
    events = count(db_url, "SELECT count(*) FROM wl_events")
    caller.execute("INSERT INTO orders (id, note) VALUES (2, 'two')")
    with pytest.raises(PayloadMismatch, match="different payload") as refused:
        ledger.submit("fulfil", {"units": 3}, key="k", conn=caller)
    assert refused.value.run_id == first.run_id
    caller.commit()  # the caller's transaction is intact: its own row commits
    assert count(db_url, "SELECT count(*) FROM orders") == 1
    assert count(db_url, "SELECT count(*) FROM wl_runs") == 1
    assert count(db_url, "SELECT count(*) FROM wl_events") == events


HOSTILE = [
    ({"x": float("nan")}, None),
    ({"x": "a\x00b"}, None),
    ({"x": object()}, None),
    ({"x": "lone \udcff surrogate"}, None),
    ({"ok": 1}, "nul\x00key"),
    ({"ok": 1}, "k" * 1001),
]


@pytest.mark.parametrize(("payload", "key"), HOSTILE)
def test_hostile_input_gets_the_same_refusal_and_writes_nothing(
        db_url: str, ledger: Ledger, caller: Any, payload: Any, key: str | None) -> None:
    with pytest.raises(BadInput) as plain:
        ledger.submit("fulfil", payload, key=key)
    with pytest.raises(BadInput) as inside:
        ledger.submit("fulfil", payload, key=key, conn=caller)
    assert str(inside.value) == str(plain.value)
    caller.commit()
    assert count(db_url, "SELECT count(*) FROM wl_runs") == 0


def test_a_connection_to_another_sqlite_file_is_refused(sqlite_url: str, tmp_path: Any) -> None:
    with make_ledger(sqlite_url) as ledger, \
            closing(sqlite3.connect(tmp_path / "other.db")) as other, \
            closing(sqlite3.connect(":memory:")) as memory:
        with pytest.raises(UsageError, match="not on this ledger's database: it is on the file"):
            ledger.submit("fulfil", {"units": 1}, conn=other)
        with pytest.raises(UsageError, match="in-memory or temporary"):
            ledger.submit("fulfil", {"units": 1}, conn=memory)
        assert not other.in_transaction  # nothing begun, nothing written there
        with pytest.raises(UsageError, match="pass a sqlite3 connection"):
            ledger.submit("fulfil", {"units": 1}, conn=object())
        assert ledger.runs() == []


def test_a_connection_to_another_postgres_schema_or_database_is_refused(
        pg_url: str, pg_database: str) -> None:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_database, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    elsewhere = f"{pg_database}?options={quote(f'-csearch_path={schema}')}"
    with make_ledger(elsewhere):  # a ledger there too: the same table name, another table
        pass
    other_db = pg_database.rsplit("/", 1)[0] + "/test" + pg_url[pg_url.index("?"):]
    with make_ledger(pg_url) as ledger:
        for url in (elsewhere, other_db, pg_database):
            with psycopg.connect(url) as conn:
                with pytest.raises(UsageError, match="not on this ledger's database"):
                    ledger.submit("fulfil", {"units": 1}, conn=conn)
                # the caller's transaction is not aborted by the refusal
                assert conn.execute("SELECT 1").fetchone() == (1,)
        with closing(sqlite3.connect(":memory:")) as lite:
            with pytest.raises(UsageError, match="psycopg"):
                ledger.submit("fulfil", {"units": 1}, conn=lite)
        assert ledger.runs() == []


def test_a_connection_outside_any_transaction_is_refused(db_url: str, ledger: Ledger) -> None:
    """In autocommit mode each statement would commit alone: the run could not follow the
    caller's commit, so it is refused before anything is written."""
    conn: Any
    if db_url.startswith("sqlite:///"):
        conn = sqlite3.connect(unquote(db_url[len("sqlite:///"):]), isolation_level=None)
    else:
        conn = psycopg.connect(db_url, autocommit=True)
    with closing(conn):
        with pytest.raises(UsageError, match="autocommit"):
            ledger.submit("fulfil", {"units": 1}, conn=conn)
        conn.execute("BEGIN")  # inside an explicit transaction it is accepted
        sub = ledger.submit("fulfil", {"units": 1}, key="explicit", conn=conn)
        conn.execute("COMMIT")
    assert ledger.status(sub.run_id).state == "accepted"
    assert ledger.work().processed == 1


def test_the_sweeper_takes_a_deferred_run_at_once_and_only_one_taker_wins(
        ledger: Ledger, caller: Any) -> None:
    sub = ledger.submit("fulfil", {"units": 3}, key="k", conn=caller)
    caller.commit()
    assert [r.id for r in ledger.store.runs_deferred(["fulfil"])] == [sub.run_id]
    assert ledger.store.runs_undecomposed(0.0) == []  # not the grace path's
    report = ledger.sweep(grace=3600.0)  # a grace no deferred run waits for
    assert (report.deferred, report.redecomposed) == (1, 0)
    assert ledger.status(sub.run_id).total == 3
    assert ledger.store.run_take_deferred(sub.run_id) is None  # taken once only
    assert ledger.store.runs_deferred(None) == []


def test_a_taker_that_died_leaves_the_run_to_the_sweepers_grace(
        ledger: Ledger, caller: Any) -> None:
    sub = ledger.submit("fulfil", {"units": 3}, key="k", conn=caller)
    caller.commit()
    assert [f.kind for f in ledger.audit()] == ["not_decomposed"]
    assert not ledger.audit()[0].needs_person
    taken = ledger.store.run_take_deferred(sub.run_id)  # then the taker dies
    assert taken is not None and taken.payload == {"units": 3}
    assert ledger.sweep(grace=3600.0).redecomposed == 0  # it may still be decomposing
    assert ledger.sweep(grace=0.0).redecomposed == 1  # after the grace, the sweeper does
    assert ledger.work().processed == 3


def test_the_wake_is_sent_only_when_the_caller_commits(pg_url: str) -> None:
    """On PostgreSQL the submit's pg_notify is delivered on commit, and a rollback sends none:
    idle workers on every machine wake for a committed run only."""
    with make_ledger(pg_url) as ledger, closing(connect(pg_url)) as caller, \
            psycopg.connect(pg_url, autocommit=True) as listener:
        schema = listener.execute("SELECT current_schema()").fetchone()
        listener.execute("LISTEN wl_work")
        ledger.submit("fulfil", {"units": 1}, key="gone", conn=caller)
        caller.rollback()
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        ledger.submit("fulfil", {"units": 1}, key="kept", conn=caller)
        caller.commit()
        woke = list(listener.notifies(timeout=5.0, stop_after=1))
        assert [n.payload for n in woke] == [schema[0] if schema else None]
