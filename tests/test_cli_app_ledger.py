"""One rule for every command: when ``--app`` names a Ledger, its URL is the ledger (issue 24).

The app module lives in the test's folder and its ``Ledger`` names the test's own database
(a SQLite file, or a schema of a throwaway PostgreSQL database): no ``--db`` is given, and no
command may fall back to ``./workledger.db``. A ``--db`` or ``WORKLEDGER_DB`` naming another
ledger is one error line naming both, passwords masked, and nothing is created. The commands
that read the ledger alone import the module to learn the URL and call none of its code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workledger import Ledger

pytestmark = pytest.mark.integration

SECRET = "hunter2-not-shown"

APP = '''
from pathlib import Path
from workledger import Item, Ledger, Permanent

HERE = Path(__file__).parent
ledger = Ledger({url!r})
send = ledger.job("send", tolerate=1)


def mark(what):
    with open(HERE / "calls.txt", "a") as f:
        f.write(what + "\\n")


@send.decompose
def split(payload):
    mark("decompose")
    for i in range(payload.get("n", 3)):
        yield Item(key=f"k{{i}}", data={{"fail": i == 0}})


@send.stage("deliver", idempotent=True)
def deliver(item, ctx):
    mark("deliver")
    if item.data["fail"]:
        raise Permanent("mailbox refused")
    return {{"sent": ctx.idempotency_key}}


@send.on_complete
def closed(status):
    mark("close")
'''


def with_password(url: str) -> str:
    """The same PostgreSQL URL with a password (the local server trusts, so it is ignored)."""
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@", 1)


@pytest.fixture
def app_url(db_url: str) -> str:
    return with_password(db_url) if db_url.startswith("postgresql") else db_url


@pytest.fixture
def folder(tmp_path: Path, app_url: str) -> Path:
    (tmp_path / "svc.py").write_text(APP.format(url=app_url))
    return tmp_path


def run(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WORKLEDGER_")}
    return subprocess.run([sys.executable, "-m", "workledger.cli", *args], cwd=folder,
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


def app(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run(folder, "--app", "svc:ledger", *args, **env)


def calls(folder: Path) -> list[str]:
    path = folder / "calls.txt"
    return path.read_text().split() if path.exists() else []


def one_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert SECRET not in done.stderr + done.stdout
    return lines[0]


def test_every_command_uses_the_ledger_the_app_names(folder: Path, db_url: str) -> None:
    ok(app(folder, "init"))
    sub = json.loads(ok(app(folder, "submit", "send", "--payload", '{"n": 3}', "--json")))
    assert sub["run_id"] == 1 and sub["total"] == 3
    ok(app(folder, "worker", "--until-idle"))
    ok(app(folder, "sweep"))
    status: dict[str, Any] = json.loads(ok(app(folder, "status", "1", "--json")))
    assert (status["processed"], status["failed"]) == (2, 1)
    assert [r["run_id"] for r in json.loads(ok(app(folder, "runs", "--json")))] == [1]
    assert len(json.loads(ok(app(folder, "items", "1", "--json")))) == 4  # 3 and the closing
    assert "failed" in ok(app(folder, "history", "1", "--stage", "deliver", "--item", "0"))
    assert "counters agree" in ok(app(folder, "reconcile", "1"))
    assert "acknowledged 1" in ok(app(folder, "ack", "1", "--note", "seen"))
    assert app(folder, "audit").returncode == 0
    assert "would prune 0 runs" in ok(app(folder, "prune", "--finished-before", "30d",
                                          "--dry-run"))
    assert "redrove 1" in ok(app(folder, "retry", "1"))
    assert not (folder / "workledger.db").exists()  # no command fell back to the default
    with Ledger(db_url) as direct:  # and all of it happened in the ledger the app names
        assert direct.status(1).total == 3 and direct.items(1, state="pending")


def test_readers_import_the_app_only_to_learn_its_ledger(folder: Path) -> None:
    ok(app(folder, "submit", "send", "--payload", '{"n": 2}'))
    before = calls(folder)
    assert before == ["decompose"]
    for args in [("status", "1"), ("runs",), ("items", "1"), ("reconcile", "--all"),
                 ("history", "1", "--stage", "deliver", "--item", "1"), ("pause", "1"),
                 ("resume", "1"), ("audit",), ("init",)]:
        ok(app(folder, *args))
    assert calls(folder) == before  # no decomposer, handler or closing hook was called
    broken = run(folder, "--app", "no_such_module:ledger", "status", "1")
    assert "cannot load app 'no_such_module:ledger'" in one_error(broken, 1)
    assert not (folder / "workledger.db").exists()


def test_a_db_naming_another_ledger_is_an_error_naming_both(folder: Path, app_url: str) -> None:
    other = f"postgresql://someone:{SECRET}@127.0.0.1:1/elsewhere"
    for args, env, source in [
        (("--db", "sqlite:///other.db"), {}, "--db sqlite:///other.db"),
        ((), {"WORKLEDGER_DB": "sqlite:///other.db"}, "WORKLEDGER_DB sqlite:///other.db"),
        (("--db", other), {}, "--db postgresql://someone:***@127.0.0.1:1/elsewhere"),
    ]:
        for command in (("worker", "--until-idle"), ("status", "1"), ("init",),
                        ("submit", "send")):
            done = run(folder, *args, "--app", "svc:ledger", *command, **env)
            line = one_error(done, 2)
            assert source in line, line
            shown = app_url.replace(SECRET, "***")
            assert f"svc:ledger names {shown}" in line, line
            assert not (folder / "other.db").exists()
            assert not (folder / "workledger.db").exists()
    assert calls(folder) == []


def test_a_db_naming_the_same_ledger_is_no_conflict(folder: Path, db_url: str) -> None:
    # the same file by a relative path; the same PostgreSQL database without the password
    same = "sqlite:///ledger.db" if db_url.startswith("sqlite") else db_url
    sub = json.loads(ok(run(folder, "--db", same, "--app", "svc:ledger", "submit", "send",
                            "--json")))
    assert sub["created"] is True
    st = json.loads(ok(app(folder, "status", "1", "--json", WORKLEDGER_DB=same)))
    assert st["total"] == 3


def test_an_app_whose_ledger_names_no_url_takes_the_db(tmp_path: Path, db_url: str) -> None:
    (tmp_path / "plain.py").write_text(APP.format(url=None))
    sub = json.loads(ok(run(tmp_path, "--db", db_url, "--app", "plain:ledger", "submit", "send",
                            "--json")))
    assert sub["total"] == 3
    assert "state" in ok(run(tmp_path, "--app", "plain:ledger", "status", "1",
                             WORKLEDGER_DB=db_url))
    assert not (tmp_path / "workledger.db").exists()
