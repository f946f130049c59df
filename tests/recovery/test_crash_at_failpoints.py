"""Crash a real process at each named failpoint, recover, and check the oracle
(docs/reliability.md): nothing lost, nothing done twice, terminal one-way, counters reconcile,
and the run settles."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from workledger.failpoints import POINTS

from .crash_app import UNITS, build

pytestmark = pytest.mark.concurrency

APP = str(Path(__file__).with_name("crash_app.py"))

# Each case: the failpoint specs of successive crashing phases, then a clean recovery.
CASES = {
    "submit.after_commit": ["submit.after_commit:1:exit"],
    "decompose.after_batch": ["decompose.after_batch:2:exit"],
    "decompose.before_mark": ["decompose.before_mark:1:exit"],
    "decompose.after_mark": ["decompose.after_mark:1:exit"],
    "claim.after_commit": ["claim.after_commit:3:exit"],
    "complete.before_commit": ["complete.before_commit:2:exit"],
    "handoff.before_commit": ["handoff.before_commit:1:exit"],
    "complete.after_commit": ["complete.after_commit:4:exit"],
    "reclaim.before_commit": ["claim.after_commit:2:exit", "reclaim.before_commit:1:exit"],
    "reclaim.after_commit": ["claim.after_commit:2:exit", "reclaim.after_commit:1:exit"],
    "closing.after_hook": ["closing.after_hook:1:exit"],
}


# Failpoints whose crash case needs more than a ledger, and the test that crashes there.
ELSEWHERE = {
    "reconcile.before_commit":
        "test_crash_inside_reconcile_leaves_the_old_counters_then_a_rerun_repairs",  # below
    "dispatch.before_publish":  # needs a broker: tests/test_dispatch_brokers.py
        "test_a_submitter_killed_between_commit_and_publish_leaves_items_the_sweeper_"
        "dispatches",
}


def test_every_failpoint_has_a_crash_case() -> None:
    assert set(CASES) | set(ELSEWHERE) == set(POINTS)
    tests = Path(__file__).resolve().parents[1]
    sources = "".join(p.read_text() for p in [Path(__file__),
                                              tests / "test_dispatch_brokers.py"])
    for name in ELSEWHERE.values():
        assert f"def {name}(" in sources, name


def _run(url: str, sink: str, cmd: str, failpoints: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "WORKLEDGER_FAILPOINTS"}
    if failpoints:
        env["WORKLEDGER_FAILPOINTS"] = failpoints
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, APP, url, sink, cmd], env=env, timeout=120,
                          capture_output=True, text=True)
    assert proc.returncode in (0, 137), proc.stderr[-2000:]
    return proc.returncode


@pytest.mark.parametrize("case", sorted(CASES))
def test_crash_at_failpoint_then_recovery_keeps_the_ledger_whole(
    case: str, db_url: str, tmp_path: Path
) -> None:
    sink = str(tmp_path / "sink.db")
    codes = [_run(db_url, sink, "run" if i == 0 else "recover", spec)
             for i, spec in enumerate(CASES[case])]
    assert 137 in codes, f"failpoint {case} was never reached"
    assert _run(db_url, sink, "recover", None) == 0
    _check_oracle(db_url, sink)


def _check_oracle(url: str, sink: str) -> None:
    ledger = build(url, sink)
    (run,) = ledger.runs()
    # L: nothing lost, nothing left claimed
    assert run.total == UNITS and run.complete and run.state == "completed"
    assert run.counts["prepare"] == {"processed": UNITS}
    assert run.counts["apply"] == {"processed": UNITS}
    # D: one deduplicated effect per item and stage; the closing hook's effect once
    conn = sqlite3.connect(sink)
    effects = dict(conn.execute("SELECT kind, count(*) FROM effects GROUP BY kind").fetchall())
    assert effects == {"prepare": UNITS, "apply": UNITS, "close": 1}
    # T: results come from applied completions only; stale ones were discarded
    items = ledger.items(run.run_id, limit=10_000)
    assert all(i.result and i.state == "processed" for i in items if i.stage != "@close")
    # R: counters reconcile
    check = ledger.reconcile(run.run_id, dry_run=True)
    assert check.stored == check.derived
    # V: nothing needs a person
    assert [f for f in ledger.audit() if f.needs_person] == []
    ledger.close()


def test_crash_inside_reconcile_leaves_the_old_counters_then_a_rerun_repairs(
    db_url: str, tmp_path: Path
) -> None:
    from workledger.storage.port import Projection

    sink = str(tmp_path / "sink.db")
    assert _run(db_url, sink, "run", None) == 0
    ledger = build(db_url, sink)
    (run,) = ledger.runs()
    wrong = Projection(total=99, processed=1, failed=0, skipped=0, complete=False)
    ledger.store.run_reconcile(run.run_id, lambda r, c: wrong, True, "test")
    assert _run(db_url, sink, "reconcile", "reconcile.before_commit:1:exit") == 137
    stored = ledger.reconcile(run.run_id, dry_run=True).stored
    assert stored == wrong  # rolled back whole: nothing half-written
    assert _run(db_url, sink, "reconcile", None) == 0
    _check_oracle(db_url, sink)
    ledger.close()
