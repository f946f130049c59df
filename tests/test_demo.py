"""``workledger demo events``: a worker SIGKILLed part-way, a second one finishing, nothing twice.

The numbers are checked against the ledger and the demo's sink, not against what it prints.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from workledger import Ledger

pytestmark = [pytest.mark.integration, pytest.mark.concurrency]

EVENTS = 200
INVALID = EVENTS // 50  # every 50th event has no timestamp


def run_demo(cwd: Path, db: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKLEDGER_")}
    env["WORKLEDGER_DEMO_DELAY_MS"] = "10"  # slow enough that the kill lands mid-chunk
    top = ["--db", db] if db else []
    return subprocess.run(
        [sys.executable, "-m", "workledger.cli", *top, "demo", "events", "--events", str(EVENTS)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def sink_numbers(sink: Path, run_id: int) -> tuple[int, int, int]:
    with sqlite3.connect(sink) as conn:
        effects = conn.execute("SELECT count(*) FROM effects WHERE run_id = ?", (run_id,))
        executions = conn.execute("SELECT count(*) FROM executions WHERE run_id = ?", (run_id,))
        twice = conn.execute(
            "SELECT count(*) FROM (SELECT idempotency_key FROM executions WHERE run_id = ?"
            " GROUP BY idempotency_key HAVING sum(applied) > 1)", (run_id,))
        return effects.fetchone()[0], executions.fetchone()[0], twice.fetchone()[0]


@pytest.fixture(params=["sqlite-default", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str | None, str, Path]:
    """(--db argument, ledger URL, sink path) for the demo's default SQLite file or PostgreSQL."""
    if request.param == "sqlite-default":
        return None, f"sqlite:///{tmp_path / 'workledger.db'}", tmp_path / "workledger-demo-sink.db"
    url = str(request.getfixturevalue("pg_url"))
    return url, url, tmp_path / "workledger-demo-sink.db"


def test_demo_kills_a_worker_and_the_next_finishes_without_doing_anything_twice(
    tmp_path: Path, where: tuple[str | None, str, Path]
) -> None:
    db, url, sink = where
    done = run_demo(tmp_path, db)
    assert done.returncode == 0, done.stdout + done.stderr
    processed = EVENTS - INVALID
    assert f"nothing done twice: {processed} effects for {processed} processed items" in done.stdout
    stranded = re.search(r"claimed (\d+) · pending (\d+)", done.stdout)
    assert stranded, done.stdout
    ledger = Ledger(url)
    try:
        st = ledger.status(1)
        assert st.complete and st.state == "completed"
        assert (st.processed, st.skipped, st.failed) == (processed, INVALID, 0)
        assert st.processed + st.skipped == EVENTS
        skipped = ledger.items(1, state="skipped")
        assert {i.error for i in skipped} == {"invalid timestamp"} and len(skipped) == INVALID
        reclaimed = [e for e in ledger.events(1) if e.kind == "lease_expired"]
        assert len(reclaimed) == int(stranded.group(1)) > 0  # the dead worker's claims came back
    finally:
        ledger.close()
    effects, executions, twice = sink_numbers(sink, 1)
    assert effects == processed and twice == 0
    assert executions >= effects

    again = run_demo(tmp_path, db)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "exists already (created=False): completed" in again.stdout
    assert sink_numbers(sink, 1) == (effects, executions, 0)  # nothing ran again
