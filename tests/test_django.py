"""workledger.contrib.django in a real Django 5.2 project (tests/django_project), on SQLite and
PostgreSQL, through real ``manage.py`` subprocesses: migrate, submission inside
``transaction.atomic()``, and ``manage.py workledger ...`` (docs/django.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from workledger import Ledger

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).parent / "django_project"
PASSWORD = "pw-n0t-pr1nted"  # given in DATABASES; the test server trusts, so it is not used


@dataclass
class Project:
    env: dict[str, str]
    url: str  # the ledger's URL, as the test knows it

    def manage(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert PASSWORD not in done.stdout + done.stderr
        assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
        return done

    def place(self, number: int, *flags: str, code: int = 0) -> dict[str, Any]:
        done = self.manage("place_order", str(number), *flags, code=code)
        return json.loads(done.stdout) if code == 0 else {"error": done.stderr.strip()}

    def status(self, run_id: int) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            self.manage("workledger", "status", str(run_id), "--json").stdout)
        return found

    def orders(self) -> int:
        return int(self.manage("shell", "--no-imports", "-c", "from shop.models import Order; "
                               "print(Order.objects.count())").stdout)


def _environment(db_url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKLEDGER_", "WL_"))}
    env.update(DJANGO_SETTINGS_MODULE="wlsite.settings", PYTHONPATH=str(PROJECT),
               WL_DJANGO_OTHER=str(tmp_path / "other.db"))
    if db_url.startswith("sqlite:///"):
        env.update(WL_DJANGO_ENGINE="sqlite", WL_DJANGO_NAME=unquote(db_url[len("sqlite:///"):]))
        return env
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(db_url)
    env.update(WL_DJANGO_ENGINE="postgres", WL_DJANGO_NAME=str(info["dbname"]),
               WL_DJANGO_USER=str(info["user"]), WL_DJANGO_PASSWORD=PASSWORD,
               WL_DJANGO_HOST=str(info["host"]), WL_DJANGO_PORT=str(info.get("port", 5432)),
               WL_DJANGO_OPTIONS=str(info["options"]))
    return env


@pytest.fixture
def project(db_url: str, tmp_path: Path) -> Iterator[Project]:
    """The project, migrated: its own tables and, through the app, the ledger's."""
    found = Project(_environment(db_url, tmp_path), db_url)
    done = found.manage("migrate", "--noinput")
    assert "workledger: applied ledger migrations 1, 2, 3, 4" in done.stdout
    assert "shop.0001_initial... OK" in done.stdout
    yield found


def test_a_rolled_back_atomic_block_leaves_no_order_and_no_run(project: Project) -> None:
    placed = project.place(1, "--rollback")
    assert (placed["created"], placed["state"]) == (True, "accepted")  # inside the block
    assert project.orders() == 0
    with Ledger(project.url, create=False) as ledger:
        assert ledger.runs() == []
    assert "no run" in project.manage("workledger", "status", str(placed["run"]), code=2).stderr


def test_a_committed_block_is_decomposed_and_completed_by_manage_py_worker(
        project: Project) -> None:
    placed = project.place(2, "--units", "4")
    assert project.orders() == 1
    assert project.status(placed["run"])["state"] == "accepted"
    done = project.manage("workledger", "worker", "--until-idle")
    assert "processed 4" in done.stdout + done.stderr
    status = project.status(placed["run"])
    assert (status["state"], status["total"], status["processed"]) == ("completed", 4, 4)
    with Ledger(project.url, create=False) as ledger:  # the handler read the order via the ORM
        assert {i.result["order"] for i in ledger.items(placed["run"])} == {2}


def test_handler_processes_set_django_up_themselves(project: Project) -> None:
    """Issue 24 item 5: `worker --processes 2` failed with AppRegistryNotReady, its handler
    processes importing the jobs module (which imports a model) before Django was set up."""
    placed = project.place(8, "--units", "6")
    done = project.manage("workledger", "worker", "--until-idle", "--processes", "2")
    assert "processed 6" in done.stdout, done.stdout + done.stderr
    status = project.status(placed["run"])
    assert (status["state"], status["processed"]) == ("completed", 6)
    with Ledger(project.url, create=False) as ledger:
        results = [i.result for i in ledger.items(placed["run"])]
    assert {r["order"] for r in results} == {8}  # read through the ORM, in the children
    assert len({r["pid"] for r in results}) >= 1


def test_a_running_worker_takes_the_committed_run_at_once(project: Project) -> None:
    worker = subprocess.Popen([sys.executable, "manage.py", "workledger", "worker"],
                              cwd=PROJECT, env=project.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        placed = project.place(3)
        with Ledger(project.url, create=False) as ledger:
            deadline = time.monotonic() + 20  # the sweeper's grace would be 30 s
            while not ledger.status(placed["run"]).complete:
                assert time.monotonic() < deadline, "the worker did not take the run"
                time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    assert PASSWORD not in out
    started = next(line for line in out.splitlines() if ": started on " in line)
    if project.url.startswith("postgresql"):  # the URL it uses holds the password: masked
        assert "postgresql://postgres:***@127.0.0.1" in started


def test_the_same_order_again_returns_its_run_and_another_payload_is_refused(
        project: Project) -> None:
    first = project.place(4)
    project.manage("workledger", "worker", "--until-idle")
    # (a second order row with the same number would fail its block: submit alone)
    again = project.manage("shell", "--no-imports", "-c", (
        "from workledger.contrib.django import submit; "
        "s = submit('fulfil', {'order': 4, 'units': 3}, key='order-4'); "
        "print(s.run_id, s.created, s.state)")).stdout.split()
    assert again == [str(first["run"]), "False", "completed"]
    mismatch = project.manage("shell", "--no-imports", "-c", (
        "from workledger.contrib.django import submit; "
        "submit('fulfil', {'order': 4, 'units': 9}, key='order-4')"), code=1)
    assert "PayloadMismatch" in mismatch.stderr and "different payload" in mismatch.stderr


def test_outside_an_atomic_block_the_run_is_committed_on_its_own(project: Project) -> None:
    placed = project.place(6, "--outside")
    assert project.orders() == 1
    assert project.status(placed["run"])["state"] == "accepted"
    project.manage("workledger", "worker", "--until-idle")
    assert project.status(placed["run"])["state"] == "completed"


def test_a_connection_to_another_database_is_refused(project: Project) -> None:
    refused = project.place(7, "--using", "other", code=2)  # a SQLite file of its own
    if project.url.startswith("sqlite"):
        assert "not on this ledger's database: it is on the file" in refused["error"]
    else:
        assert "pass a psycopg (3) connection" in refused["error"]
        assert "not a sqlite3.Connection" in refused["error"]
    assert project.orders() == 0  # the whole block rolled back


def test_manage_py_workledger_runs_the_cli_with_the_projects_settings(project: Project) -> None:
    listed = project.manage("workledger", "--help").stdout
    assert "worker" in listed and "audit" in listed
    assert project.manage("workledger", "audit").returncode == 0
    missing = project.manage("workledger", "status", "999", code=2).stderr
    assert missing.startswith("error: no run 999 in ")
    assert PASSWORD not in missing
