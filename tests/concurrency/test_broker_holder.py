"""A broker task stopped past its lease keeps its items, as a worker does (issue 21, item 4; the
campaign's ``broker_dup``/``broker_delay`` rounds, seed 9 round 2, found it on SQLite).

A ``workledger worker`` holds a holder (storage/holders.py: on SQLite a locked file, on
PostgreSQL a session's advisory lock) for as long as it lives, so a lease that ran out while
its worker was SIGSTOPped is not taken back: the worker is alive, only slow. A broker task
claimed with no holder, so its leases were judged by the clock alone: an ``rq worker`` whose
work horse was stopped for longer than the lease lost its item to the sweeper, which asked the
verify hook (or, without one, ran the item again) while the handler still ran. A non-idempotent
effect then happened twice. Real ``rq worker`` processes on the real Redis, real SIGSTOP.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_support import Setup, _in_session, logs_of, setup_for, wait_settled
from waiting import poll

pytestmark = pytest.mark.concurrency

SLOW = 3.0  # seconds each `apply` handler takes: longer than the lease (WL_LEASE=2)
STOPPED = 5.0  # seconds the worker and its work horse stay stopped


@pytest.fixture(params=["sqlite", "postgres"])
def rq_setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    yield from setup_for("rq", url, tmp_path)


def _apply_runs(setup: Setup) -> list[str]:
    conn = sqlite3.connect(setup.sink)
    try:
        return [k for (k,) in conn.execute("SELECT key FROM executions WHERE kind = 'apply'")]
    finally:
        conn.close()


def _signal_session(leader: int, sig: signal.Signals) -> None:
    for pid in [leader, *_in_session(leader)]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def test_a_broker_task_stopped_past_its_lease_keeps_its_items(rq_setup: Setup) -> None:
    setup = rq_setup
    ledger = setup.ledger(WL_SLOW=str(SLOW))
    worker = setup.start_worker(setup.tmp / "worker.log", WL_SLOW=str(SLOW))
    run_id = ledger.job_named("batch").submit({"units": 1}, key="stopped").run_id

    def apply_claimed() -> bool:
        return any(i.stage == "apply" and i.state == "claimed" for i in ledger.items(run_id))

    poll(apply_claimed, "the apply item to be claimed by the work horse", timeout=60)
    time.sleep(0.3)  # the handler is inside its 3 s sleep
    _signal_session(worker.pid, signal.SIGSTOP)
    try:
        time.sleep(STOPPED / 2)  # the lease (2 s) has run out by the clock
        swept = ledger.sweep(grace=0.5, lease=2.0)
        time.sleep(STOPPED / 2)
        again = ledger.sweep(grace=0.5, lease=2.0)
    finally:
        _signal_session(worker.pid, signal.SIGCONT)
    taken = [e for e in ledger.events(run_id) if e.kind in ("lease_expired", "unknown")]
    assert taken == [], f"a stopped, living task's item was taken back: {taken} " \
                        f"(sweeps: {swept}, {again})"
    st = wait_settled(setup, ledger, run_id, timeout=60)
    assert st.state == "completed", (st.counts, logs_of(setup.tmp))
    assert _apply_runs(setup) == [f"{run_id}/apply/0"], "the item's effect ran again"
    ledger.close()
