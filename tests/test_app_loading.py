"""``--app`` finds the app's module in the current directory, and nothing else there: a file
lying beside it (a ``websockets.py``) never replaces a module imported later in the process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from serve_support import WORKLEDGER, served
from web_support import cli_env

from workledger import Ledger
from workledger.api import import_app

pytestmark = pytest.mark.integration

APP = """
from workledger import Item, Ledger

ledger = Ledger()
job = ledger.job("planted_test_job")


@job.decompose
def split(payload):
    yield Item(key="one", data={})


@job.stage("only", idempotent=True)
def only(item, ctx):
    return None
"""
PLANTED = """
from pathlib import Path

Path(__file__).with_name("PLANTED-RAN").write_text("imported from the working directory")
raise ImportError("a planted module")
"""


def test_the_current_directory_is_off_the_import_path_once_the_app_is_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "loading_app_beside.py").write_text(APP)
    (tmp_path / "loading_planted_later.py").write_text(PLANTED)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    ledger = import_app("loading_app_beside:ledger")
    assert "planted_test_job" in ledger.jobs
    assert str(tmp_path) not in sys.path
    with pytest.raises(ModuleNotFoundError):
        __import__("loading_planted_later")
    assert not (tmp_path / "PLANTED-RAN").exists()


def test_serve_with_an_app_from_the_working_directory_imports_nothing_else_from_it(
        sqlite_url: str, tmp_path: Path) -> None:
    (tmp_path / "myjobs.py").write_text(APP)
    for name in ("websockets", "wsproto", "h2", "uvloop_planted"):
        (tmp_path / f"{name}.py").write_text(PLANTED)
    env = cli_env(WORKLEDGER_TOKEN="t0")
    with served(sqlite_url, cwd=tmp_path, env=env, app="myjobs:ledger") as server:
        made = server.post("api/jobs/planted_test_job/runs", json={}, headers=server.bearer("t0"))
        assert made.status_code == 201, made.text
        upgrade = server.get("healthz", headers={"Connection": "Upgrade",
                                                 "Upgrade": "websocket"})
        assert upgrade.status_code == 200
        err = server.stop()
    assert not (tmp_path / "PLANTED-RAN").exists()
    assert "WebSocket" not in err and "upgrade" not in err  # no log line per such request


PROCESS_APP = """
import os
import sys

from workledger import Item, Ledger

ledger = Ledger()
job = ledger.job("planted_process_job")


@job.decompose
def split(payload):
    for n in range(4):
        yield Item(key=f"k{n}", data={})


@job.stage("child", idempotent=True)
def child(item, ctx):
    return {"pid": os.getpid(), "safe_path": os.environ.get("PYTHONSAFEPATH"),
            "beside": os.getcwd() in sys.path}
"""
# pickle imports it, and carries on without it, while a spawned child starts: a file of that
# name in the working directory would run unseen in every handler process
PLANTED_STDLIB = {"org.py": PLANTED}


def test_handler_processes_import_nothing_from_the_working_directory_as_they_start(
        sqlite_url: str, tmp_path: Path) -> None:
    """``spawn`` starts each child with ``python -c``, which puts the working directory first
    on sys.path while multiprocessing boots: children start with PYTHONSAFEPATH=1, and the app
    module is still found there (import_app looks for it itself)."""
    (tmp_path / "planted_procs.py").write_text(PROCESS_APP)
    for name, text in PLANTED_STDLIB.items():
        (tmp_path / name).write_text(text)
    command = [str(WORKLEDGER), "--db", sqlite_url, "--app", "planted_procs:ledger"]
    env = cli_env()
    submitted = subprocess.run([*command, "submit", "planted_process_job", "--json"],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    worked = subprocess.run([*command, "worker", "--until-idle", "--processes", "2", "--json"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert worked.returncode == 0, worked.stderr
    assert json.loads(worked.stdout)["processed"] == 4
    assert not (tmp_path / "PLANTED-RAN").exists(), (tmp_path / "PLANTED-RAN").read_text()
    ledger = Ledger(sqlite_url)
    try:
        results = [item.result for item in ledger.items(1)]
    finally:
        ledger.close()
    # the handlers see the environment the worker was given, not the child's start-up guard
    assert {r["safe_path"] for r in results} == {None}
    assert {r["beside"] for r in results} == {False}
