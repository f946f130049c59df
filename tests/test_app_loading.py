"""``--app`` finds the app's module in the current directory, and nothing else there: a file
lying beside it (a ``websockets.py``) never replaces a module imported later in the process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from serve_support import served
from web_support import cli_env

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
