"""The short tier of the fault campaign (chaos/campaign.py, chaos/README.md): about 60 faults
per backend, from a fixed seed, on real processes; every round checked by the oracle of
docs/reliability.md. Also: the oracle itself fails on a ledger that breaks the promise, so a
clean campaign means something."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.concurrency

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ROOT / "chaos" / "campaign.py"
SEED = int(os.environ.get("WORKLEDGER_CHAOS_SEED", "20261201"))


def campaign(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CAMPAIGN), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sixty_faults_break_no_promise(backend: str, tmp_path: Path) -> None:
    if backend == "postgres":
        pytest.importorskip("psycopg")
    done = campaign("--backend", backend, "--kills", "60", "--faults-per-round", "15",
                    "--seed", str(SEED), "--json", "--workdir", str(tmp_path))
    assert done.stdout.splitlines(), done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["violations"] == [], done.stdout[-6000:]
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary["seed"] == SEED and summary["kills"] >= 60
    assert summary["faults"].get("kill", 0) > 0 and summary["items"] > 0
    assert summary["effects"] > 0 and summary["recovery_p99"] is not None


def test_the_oracle_finds_a_ledger_that_broke_the_promise(tmp_path: Path) -> None:
    """One round, then the ledger is damaged behind the campaign's back the ways a bug would:
    a processed item back to pending, a counter off by one, an effect that ran twice."""
    sys.path.insert(0, str(CAMPAIGN.parent))
    try:
        import oracle
        import sink
        from backend import Db
        from plan import kinds_for, plan_round
        from rounds import Round
    finally:
        sys.path.remove(str(CAMPAIGN.parent))
    from backend import SqliteBackend

    plan = plan_round(SEED, 1, kinds_for("sqlite", False), faults=4)
    result = Round(plan, SqliteBackend(tmp_path), tmp_path, 1.0).run()
    assert result.violations == [], result.violations
    db_path = tmp_path / "round-1" / "ledger.db"
    with sqlite3.connect(db_path) as conn:
        item_id, run_id, stage, seq = conn.execute(
            "SELECT id, run_id, stage, seq FROM wl_items WHERE state = 'processed'"
            " AND stage IN ('deliver', 'charge') AND id NOT IN (SELECT item_id FROM wl_events"
            " WHERE kind IN ('unknown', 'verified', 'resolved') AND item_id IS NOT NULL)"
            " ORDER BY id LIMIT 1").fetchone()
        conn.execute("UPDATE wl_items SET state = 'pending' WHERE id = ?", (item_id,))
        conn.execute("UPDATE wl_runs SET failed = failed + 1 WHERE id = ?", (run_id,))
    view_path = str(tmp_path / "round-1" / "sink.db")
    sink.Sink(view_path).effect(f"{run_id}/{stage}/{seq}", 0, 0)
    db = Db(f"sqlite:///{db_path}")
    facts = oracle.read_facts(db)
    found = {v.check for v in oracle.check(facts, sink.read(view_path), plan, [])}
    assert {"L", "D", "R"} <= found, found
    assert oracle.unsettled(db), "a pending item in an open run is not settled"
    db.close()
