"""``prune`` never deletes a run whose closing hook has not run, with or without the app.

The defect (issue 21, item 5): a worker killed right after the commit that completed a run
leaves it complete with no closing entry yet; ``workledger prune``, which does not load the
app, could not tell that the job has a closing hook and deleted the run, so its hook never
ran. A run now records at submit whether its job declared one (migration 0012), and the
statement that deletes a run refuses one whose closing entry is not terminal. On both
backends, with real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_prune import age, rows_of, sql
from web_support import cli_env, wl

from workledger import Ledger
from workledger.core.status import CLOSE_STAGE

pytestmark = pytest.mark.integration

APP = "closing_app:ledger"


def worker(url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workledger.cli", "--db", url, "--app", APP,
                           "worker", "--until-idle", "--concurrency", "1"],
                          env=cli_env(**env), capture_output=True, text=True, timeout=120)


def submit(url: str, key: str, n: int = 2) -> int:
    done = wl(url, "submit", "closing", "--payload", json.dumps({"n": n}), "--key", key,
              "--json", app=APP)
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["run_id"])


def closing_states(url: str, run_id: int) -> list[str]:
    return [str(r[0]) for r in sql(url, "SELECT state FROM wl_items WHERE run_id = %s AND "
                                        "stage = %s", run_id, CLOSE_STAGE)]


def test_a_run_completed_by_a_killed_worker_keeps_its_closing_hook_through_prune(
        db_url: str, tmp_path: Path) -> None:
    run_id = submit(db_url, "crashed")
    # the last chunk's outcomes commit, then the process dies before any sweeper pass
    died = worker(db_url, WORKLEDGER_FAILPOINTS="complete.after_commit:1:exit")
    assert died.returncode == 137, died.stderr
    assert sql(db_url, "SELECT completed_at IS NOT NULL FROM wl_runs WHERE id = %s",
               run_id)[0][0]
    assert closing_states(db_url, run_id) == []  # the hook has not run: no entry yet
    age(db_url, run_id)

    for app in (None, APP):  # the command line without the app, and with it
        dry = wl(db_url, "prune", "--finished-before", "30d", "--dry-run", "--json", app=app)
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout)["runs"] == [] and json.loads(dry.stdout)["closing"] == [
            run_id]
        kept = wl(db_url, "prune", "--finished-before", "30d", app=app, cwd=tmp_path)
        assert kept.returncode == 0, kept.stderr
        assert kept.stdout.splitlines() == [
            "pruned 0 runs (0 items, 0 events)",
            f"kept 1 run(s) whose closing hook has not run yet: {run_id}"]
        assert rows_of(db_url, run_id)[0] == 2

    swept = wl(db_url, "sweep", "--grace", "0", app=APP)  # the hook runs now
    assert swept.returncode == 0, swept.stderr
    assert closing_states(db_url, run_id) == ["processed"]
    age(db_url, run_id)
    done = wl(db_url, "prune", "--finished-before", "30d", "--json", app=None)
    assert json.loads(done.stdout)["runs"] == [run_id]
    assert rows_of(db_url, run_id) == (0, 0, 0)


def test_a_closing_hook_waiting_for_its_retry_is_named_as_the_reason(db_url: str,
                                                                      tmp_path: Path) -> None:
    run_id = submit(db_url, "retrying")
    failing = worker(db_url, CLOSING_APP_FAIL="1")  # the hook raises: its entry waits, pending
    assert failing.returncode == 0, failing.stderr
    assert closing_states(db_url, run_id) == ["pending"]
    age(db_url, run_id)
    kept = wl(db_url, "prune", "--finished-before", "30d", app=None, cwd=tmp_path)
    assert kept.stdout.splitlines()[-1] == (
        f"kept 1 run(s) whose closing hook has not run yet: {run_id}"), kept.stdout
    assert rows_of(db_url, run_id)[0] == 3


def test_the_store_refuses_to_delete_a_run_recorded_with_a_closing_hook(db_url: str) -> None:
    """The last line of defence is the delete statement itself, whoever calls it."""
    sys.path.insert(0, str(Path(__file__).parent / "apps"))
    try:
        from closing_app import ledger as app
    finally:
        sys.path.pop(0)
    app.use(db_url)
    try:
        run_id = app.job_named("closing").submit({"n": 1}, key="store").run_id
        w = app.worker(concurrency=1, until_idle=True)
        w.sweeper = None  # complete, the hook left for later
        w.run()
        age(db_url, run_id)
        reader = Ledger(db_url)  # no job declared
        assert not reader.store.run_prune(run_id, 86400.0, with_events=False)
        assert reader.prune(86400.0).closing == [run_id]
        app.sweep(grace=0)
        assert reader.store.run_prune(run_id, 0.0, with_events=False)
        reader.close()
    finally:
        app.close()
