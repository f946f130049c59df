"""The small things a new user met in the first hour (issue 24, item 6): each says what it is
or does, where the user looks first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import workledger
from workledger import Item, Ledger
from workledger.cli import cli
from workledger.errors import PayloadMismatch, UnknownRun

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def cli_run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKLEDGER_")}
    return subprocess.run([sys.executable, "-m", "workledger.cli", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


def test_runs_on_an_empty_ledger_says_no_runs_yet(tmp_path: Path, db_url: str) -> None:
    assert cli_run(tmp_path, "--db", db_url, "init").returncode == 0
    empty = cli_run(tmp_path, "--db", db_url, "runs")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.strip() == "no runs yet"
    assert cli_run(tmp_path, "--db", db_url, "runs", "--json").stdout.strip() == "[]"
    below = cli_run(tmp_path, "--db", db_url, "runs", "--before", "1")
    assert below.stdout.strip() == "no runs before run 1"


def test_the_errors_a_submitter_catches_come_from_workledger() -> None:
    assert workledger.PayloadMismatch is PayloadMismatch
    assert workledger.UnknownRun is UnknownRun
    assert {"PayloadMismatch", "UnknownRun", "WorkledgerError"} <= set(workledger.__all__)
    assert issubclass(PayloadMismatch, workledger.WorkledgerError)


def test_the_top_level_help_names_serve_among_the_commands_that_run_the_app() -> None:
    epilog = " ".join((cli.epilog or "").split())
    assert "submit, worker, sweep, serve and resolve --as processed" in epilog
    assert "submit, worker, sweep, serve and resolve --as processed" in " ".join(
        (ROOT / "docs" / "cli.md").read_text().split())


def test_every_option_of_the_payroll_module_says_what_it_is() -> None:
    from workledger.demos.payroll.worker import make_parser

    parser = make_parser()
    undescribed = [a.option_strings or a.dest for a in parser._actions if not a.help]
    assert not undescribed
    shown = subprocess.run([sys.executable, "-m", "workledger.demos.payroll", "--help"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "the ledger's URL" in shown.stdout


def test_the_sweeper_lock_files_beside_a_sqlite_ledger_are_ignored_by_git() -> None:
    for path in ("examples/celery_payroll/payroll.db.sweeper-3f2a9c1d",
                 "payroll.db.sweeper", "workledger.db.sweeper-0123abcd"):
        found = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT)
        assert found.returncode == 0, f"{path} is not ignored"


def test_a_run_id_is_never_reused_though_a_refused_submission_may_use_one_up(
        db_url: str) -> None:
    """What the `submit` help and design.md say: ids increase and are never given twice,
    but they need not be consecutive (on PostgreSQL a repeated or refused submission takes a
    value from the sequence), so poll the id a submission returned, never the next number."""
    ledger = Ledger(db_url)
    job = ledger.job("j")

    @job.decompose
    def split(payload: Any) -> Any:
        yield Item(key="only")

    @job.stage("s", idempotent=True)
    def handle(item: Any, ctx: Any) -> None:
        return None

    first = job.submit({"a": 1}, key="k").run_id
    assert job.submit({"a": 1}, key="k").run_id == first  # the same run, not a new one
    with pytest.raises(PayloadMismatch):
        job.submit({"a": 2}, key="k")
    second = job.submit({"a": 1}, key="k2").run_id
    assert second > first
    if db_url.startswith("postgresql"):
        assert second == first + 3  # the two repeats each used up an id
    ledger.close()
    text = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    assert "need not be consecutive" in text
