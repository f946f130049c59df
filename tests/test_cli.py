"""The CLI as users run it: a subprocess in a temp folder, on a real SQLite file and PostgreSQL.

Every failure must be exactly one line on stderr, with exit code 2 for bad usage or input and
1 for operational failure, and must write nothing.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workledger import Ledger

pytestmark = pytest.mark.integration

APPS = Path(__file__).parent / "apps"
SAMPLE = "sample_app:ledger"
STATUS_KEYS = {"run_id", "job", "key", "state", "total", "complete", "counts", "created_at",
               "decomposed_at", "completed_at", "error", "priority", "tenant"}
STATUS_EXTRA = {"next", "processed", "failed", "skipped"}


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKLEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(APPS), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "workledger.cli", *args]


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def wl(tmp_path: Path, db_url: str) -> Run:
    """``wl("status", "1")`` runs ``workledger --db DB_URL --app sample_app:ledger status 1``."""

    def run(*args: str, app: str | None = SAMPLE, db: str | None = db_url,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        top = (["--db", db] if db else []) + (["--app", app] if app else [])
        return subprocess.run(cli_cmd(*top, *args), cwd=tmp_path, env=env or cli_env(),
                              capture_output=True, text=True, timeout=120)

    return run


@pytest.fixture
def ledger(db_url: str) -> Iterator[Ledger]:
    """The same database, read in-process to check what the CLI really wrote."""
    led = Ledger(db_url)
    yield led
    led.close()


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    return lines[0]


# -- happy paths and JSON shapes -----------------------------------------------------------------


def test_init_applies_migrations_once(wl: Run) -> None:
    first = wl("init", app=None)
    assert first.returncode == 0 and "applied migration" in first.stdout
    again = wl("init", app=None)
    assert again.returncode == 0 and "up to date" in again.stdout


def test_submit_json_reports_the_created_run_and_its_real_state(wl: Run) -> None:
    sub = ok_json(wl("submit", "numbers", "--payload", '{"n": 10, "skip": [3]}', "--key", "k1",
                     "--json"))
    assert {"run_id", "created", "state", "next"} | STATUS_KEYS <= set(sub)
    assert sub["created"] is True and sub["key"] == "k1" and sub["job"] == "numbers"
    assert sub["state"] == "running" and sub["complete"] is False and sub["total"] == 10
    assert sub["counts"] == {"double": {"pending": 9, "skipped": 1}}
    assert sub["decomposed_at"] is not None and sub["error"] is None


def test_submit_again_returns_the_existing_run_not_a_second_copy(wl: Run, ledger: Ledger) -> None:
    payload = '{"n": 6, "fail": [1]}'
    first = ok_json(wl("submit", "numbers", "--payload", payload, "--key", "k", "--json"))
    assert "worker idle, done" in wl("worker", "--until-idle").stdout
    again = ok_json(wl("submit", "numbers", "--payload", payload, "--key", "k", "--json"))
    assert again["run_id"] == first["run_id"] and again["created"] is False
    assert again["state"] == "failed" and again["processed"] == 5 and again["failed"] == 1
    assert len(ledger.runs()) == 1
    human = wl("submit", "numbers", "--payload", payload, "--key", "k")
    assert "already exists" in human.stdout and "nothing new written" in human.stdout


def test_status_runs_and_items_after_a_worker_drained_the_run(wl: Run) -> None:
    sub = ok_json(wl("submit", "numbers", "--payload", '{"n": 5, "skip": [0], "fail": [4]}',
                     "--json"))
    done = ok_json(wl("worker", "--until-idle", "--json", "--concurrency", "2"))
    assert (done["claimed"], done["processed"], done["failed"]) == (4, 3, 1)
    st = ok_json(wl("status", str(sub["run_id"]), "--json"))
    assert STATUS_KEYS <= set(st) <= STATUS_KEYS | STATUS_EXTRA
    assert st["complete"] is True and st["state"] == "failed"  # one failure, tolerance 0
    assert st["counts"] == {"double": {"processed": 3, "failed": 1, "skipped": 1}}
    assert st["completed_at"] is not None
    listed = ok_json(wl("runs", "--json"))
    assert [r["run_id"] for r in listed] == [sub["run_id"]] and listed[0] == st
    items = ok_json(wl("items", str(sub["run_id"]), "--json"))
    by_seq = {i["seq"]: i for i in items}
    assert by_seq[0]["state"] == "skipped" and by_seq[0]["error"] == "unwanted number"
    assert by_seq[4]["state"] == "failed" and by_seq[4]["error"] == "odd one out"
    assert by_seq[2]["result"] == {"double": 4} and by_seq[2]["attempts"] == 1
    assert by_seq[2]["key"] == "n2"
    failed = ok_json(wl("items", str(sub["run_id"]), "--state", "failed", "--json"))
    assert [i["seq"] for i in failed] == [4]
    assert len(ok_json(wl("items", str(sub["run_id"]), "--limit", "2", "--json"))) == 2
    assert ok_json(wl("items", str(sub["run_id"]), "--stage", "nope", "--json")) == []


def test_human_output_names_the_state_and_counts(wl: Run) -> None:
    created = wl("submit", "numbers", "--payload", '{"n": 3}', "--key", "human")
    assert created.returncode == 0 and "run 1 created (key human)" in created.stdout
    wl("worker", "--until-idle")
    status = wl("status", "1")
    assert "state      completed" in status.stdout and "double: processed 3" in status.stdout
    assert "human" in wl("runs").stdout
    assert "n2" in wl("items", "1").stdout


def test_status_watch_returns_once_the_run_is_complete(wl: Run) -> None:
    wl("submit", "numbers", "--payload", '{"n": 3}')
    wl("worker", "--until-idle")
    watched = ok_json(wl("status", "1", "--watch", "--json"))
    assert watched["complete"] is True and watched["processed"] == 3


def test_status_and_items_work_without_an_app(wl: Run) -> None:
    wl("submit", "numbers", "--payload", '{"n": 2}')
    assert ok_json(wl("status", "1", "--json", app=None))["total"] == 2
    assert len(ok_json(wl("items", "1", "--json", app=None))) == 2


def test_payload_file_is_read(wl: Run, tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text('{"n": 4}')
    assert ok_json(wl("submit", "numbers", "--payload-file", "p.json", "--json"))["total"] == 4


# -- bad input: one line, the right exit code, nothing written ----------------------------------

BAD_INPUT = {
    "payload not JSON": (["submit", "numbers", "--payload", "{nope"], {}, 2, "not JSON"),
    "payload not an object": (["submit", "numbers", "--payload", "[1, 2]"], {}, 2, "JSON object"),
    "payload file missing": (["submit", "numbers", "--payload-file", "missing.json"], {}, 2,
                             "cannot read payload file"),
    "two payloads": (["submit", "numbers", "--payload", "{}", "--payload-file", "x"], {}, 2,
                     "not both"),
    "unknown job": (["submit", "nope"], {}, 2, "unknown job 'nope'"),
    "unknown job without app": (["submit", "numbers"], {"app": None}, 2, "no app loaded"),
    "unknown run": (["status", "999"], {}, 2, "no run 999"),
    "unknown run items": (["items", "999"], {}, 2, "no run 999"),
    "unknown scheme": (["submit", "numbers"], {"db": "mysql://u@h/db"}, 2, "unknown database URL"),
    "unreachable postgres": (["submit", "numbers"], {"db": "postgresql://postgres@127.0.0.1:1/x"},
                             1, "cannot connect to PostgreSQL"),
    "app does not import": (["submit", "numbers"], {"app": "no_such_module:ledger"}, 1,
                            "cannot load app 'no_such_module:ledger'"),
    "app raises on import": (["submit", "numbers"], {"app": "broken_app:ledger"}, 1,
                             "configuration is missing"),
    "app attribute missing": (["submit", "numbers"], {"app": "sample_app:nope"}, 1,
                              "cannot load app"),
    "app is not a ledger": (["worker"], {"app": "sample_app:numbers"}, 1, "not a Ledger"),
    "app spec malformed": (["sweep"], {"app": "sample_app"}, 2, "module:attribute"),
    "unknown command": (["frobnicate"], {}, 2, "No such command"),
    "bad option value": (["worker", "--concurrency", "0"], {}, 2, "--concurrency"),
    "unknown job for worker": (["worker", "--job", "nope", "--until-idle"], {}, 2, "unknown job"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line_with_its_exit_code_and_writes_nothing(
    case: str, wl: Run, ledger: Ledger, tmp_path: Path
) -> None:
    args, where, code, text = BAD_INPUT[case]
    assert wl("init", app=None).returncode == 0  # a ledger to refuse into (or not to touch)
    line = one_error_line(wl(*args, **where), code)
    assert text in line
    assert ledger.runs() == []
    assert not (tmp_path / "workledger.db").exists()  # nothing fell back to the default ledger


def test_same_key_with_another_payload_is_refused_and_the_first_run_untouched(
    wl: Run, ledger: Ledger
) -> None:
    first = ok_json(wl("submit", "numbers", "--payload", '{"n": 3}', "--key", "k", "--json"))
    line = one_error_line(wl("submit", "numbers", "--payload", '{"n": 4}', "--key", "k"), 2)
    assert "'k'" in line and "different payload" in line
    [run] = ledger.store.runs_list()
    assert run.id == first["run_id"] and ledger.store.run_payload(run.id) == {"n": 3}
    assert ledger.status(run.id).counts == {"double": {"pending": 3}}


def test_decomposer_raising_part_way_leaves_the_run_accepted_with_nothing_dispatched(
    wl: Run, ledger: Ledger
) -> None:
    good = 5003  # more than one insert batch, so some rows are committed before the raise
    line = one_error_line(wl("submit", "explodes", "--payload", f'{{"good": {good}}}'), 1)
    assert "run 1 stays accepted" in line and f"ValueError: event {good} is malformed" in line
    st = ok_json(wl("status", "1", "--json"))
    assert st["state"] == "accepted" and st["decomposed_at"] is None
    assert f"event {good} is malformed" in st["error"]
    assert list(st["counts"]) == ["work"] and list(st["counts"]["work"]) == ["pending"]
    kept = st["counts"]["work"]["pending"]
    assert 0 < kept <= good  # the rows written so far are kept
    report = ok_json(wl("worker", "--until-idle", "--json"))
    assert report["claimed"] == 0
    assert ledger.status(1).counts == {"work": {"pending": kept}}
    assert ledger.items(1, limit=kept)[-1].attempts == 0


def test_an_unexpected_error_is_one_line_unless_debugging(wl: Run) -> None:
    wl("init", app=None)
    line = one_error_line(wl("audit", app="sample_app:exploding"), 1)
    assert "unexpected RuntimeError: a bug in the app" in line
    debug = wl("audit", app="sample_app:exploding", env=cli_env(WORKLEDGER_DEBUG="1"))
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_db_and_app_come_from_the_environment(tmp_path: Path, db_url: str) -> None:
    env = cli_env(WORKLEDGER_DB=db_url, WORKLEDGER_APP=SAMPLE)
    done = subprocess.run(cli_cmd("submit", "numbers", "--payload", '{"n": 2}', "--json"),
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ok_json(done)["total"] == 2
    assert not (tmp_path / "workledger.db").exists()


def test_default_ledger_is_workledger_db_in_the_current_folder(tmp_path: Path) -> None:
    done = subprocess.run(cli_cmd("--app", SAMPLE, "submit", "numbers", "--json"), cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=120)
    assert ok_json(done)["total"] == 10
    assert (tmp_path / "workledger.db").exists()


# -- signals -------------------------------------------------------------------------------------


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def start_worker(tmp_path: Path, db_url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(cli_cmd("--db", db_url, "--app", SAMPLE, "worker", *args),
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stderr_lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    stream = proc.stderr
    threading.Thread(target=lambda: [lines.put(ln) for ln in stream], daemon=True).start()
    return lines


def wait_for_line(lines: queue.Queue[str], text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            if text in lines.get(timeout=left):
                return
        except queue.Empty:
            break
    raise AssertionError(f"no stderr line with {text!r}")


@pytest.mark.concurrency
def test_sigterm_stops_the_worker_cleanly_leaving_nothing_claimed(
    wl: Run, ledger: Ledger, tmp_path: Path, db_url: str
) -> None:
    wl("submit", "numbers", "--payload", '{"n": 400, "sleep": 0.02}')
    proc = start_worker(tmp_path, db_url, "--concurrency", "2", "--chunk", "20", "--json")
    try:
        wait_until(lambda: ledger.status(1).processed >= 5, "the worker to process items")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["stopped_by"] == "stopped by SIGTERM"
    counts = ledger.status(1).counts["double"]
    assert "claimed" not in counts, counts  # finished or released, none left held
    assert 0 < counts["processed"] < 400
    assert counts["processed"] + counts["pending"] == 400
    assert report["processed"] == counts["processed"]


@pytest.mark.concurrency
def test_a_second_signal_exits_at_once(wl: Run, ledger: Ledger, tmp_path: Path,
                                       db_url: str) -> None:
    wl("submit", "numbers", "--payload", '{"n": 2, "sleep": 600}')
    proc = start_worker(tmp_path, db_url, "--concurrency", "1", "--chunk", "1")
    try:
        lines = stderr_lines(proc)
        wait_until(lambda: "claimed" in ledger.status(1).counts["double"], "a claimed item")
        proc.send_signal(signal.SIGTERM)
        wait_for_line(lines, "SIGTERM: stopping")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
