"""examples/celery_payroll runs as its README says: the mail sink, Celery's own worker on the
real RabbitMQ, the submit and the status, with the commands of the README (120 employees
instead of 2,000, and a ledger, a queue and a mail port of this test's own)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_support import RABBIT, logs_of, reachable
from waiting import poll

from workledger.demos.payroll import message_prefix
from workledger.demos.smtp_sink import SinkRecords

pytestmark = pytest.mark.concurrency

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "celery_payroll"
README = (EXAMPLE / "README.md").read_text()
COMMANDS = re.search(r"## Run it\n.*?```sh\n(.*?)```", README, flags=re.S)
EMPLOYEES = 120


def readme_commands() -> list[str]:
    assert COMMANDS, "examples/celery_payroll/README.md has no commands under 'Run it'"
    return [line for line in COMMANDS.group(1).splitlines() if line.strip()]


def test_the_readme_gives_the_five_commands() -> None:
    export, sink, worker, submit, watch = readme_commands()
    assert export.startswith("export WORKLEDGER_DB=")
    assert sink == "python -m workledger.demos.payroll sink --employees 2000"
    assert worker.startswith("celery -A payroll_celery worker")
    assert submit.startswith("workledger --app payroll_celery:ledger submit payroll")
    assert watch == "workledger status 1 --watch"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    reachable("127.0.0.1", 5672, "RabbitMQ")
    bin_dir = str(Path(sys.executable).parent)
    queue = f"wl-payroll-{uuid.uuid4().hex[:10]}"
    port = free_port()
    yield {**{k: v for k, v in os.environ.items() if k != "WORKLEDGER_FAILPOINTS"},
           "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
           "WORKLEDGER_DB": f"sqlite:///{tmp_path / 'payroll.db'}",
           "WORKLEDGER_PAYROLL_OUT": str(tmp_path / "payslips"),
           "WORKLEDGER_PAYROLL_SMTP": f"127.0.0.1:{port}", "SINK_PORT": str(port),
           "PAYROLL_QUEUE": queue, "CELERY_BROKER_URL": RABBIT}
    from kombu import Connection

    with Connection(RABBIT) as conn:
        try:
            conn.default_channel.queue_delete(queue)
        except Exception:  # noqa: BLE001 - never declared: nothing to delete
            pass


def started(cmd: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, shell=True, cwd=EXAMPLE, env=env, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def test_the_payroll_run_completes_through_celery_and_sends_nothing_twice(
        env: dict[str, str], tmp_path: Path) -> None:
    _export, sink_cmd, worker_cmd, submit_cmd, _watch = readme_commands()
    count = str(EMPLOYEES)
    procs = [started(sink_cmd.replace("2000", count) + f" --port {env['SINK_PORT']}", env,
                     tmp_path / "sink.log")]
    try:
        poll(lambda: "mail sink on" in logs_of(tmp_path, tail=None), "the mail sink")
        procs.append(started(worker_cmd, env, tmp_path / "worker.log"))
        done = subprocess.run(submit_cmd.replace("2000", count), shell=True, cwd=EXAMPLE,
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "run 1 created" in done.stdout, done.stdout

        def status() -> dict[str, object] | None:
            out = subprocess.run("workledger status 1 --json", shell=True, cwd=EXAMPLE,
                                 env=env, capture_output=True, text=True, timeout=60)
            st: dict[str, object] = json.loads(out.stdout)
            return st if st["complete"] else None

        st = poll(status, "the payroll run to complete", timeout=180, every=0.5)
    finally:
        for proc in procs:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=30)
    assert st["state"] == "completed", st
    counts = st["counts"]
    assert isinstance(counts, dict)
    delivered = counts["deliver"]["processed"]
    assert counts["generate"]["processed"] == delivered == EMPLOYEES - counts["generate"][
        "skipped"]
    records = SinkRecords(tmp_path / "payslips" / "mail-sink.db")
    sent = records.per_message_id(message_prefix(1))
    records.close()
    assert len(sent) == delivered and set(sent.values()) == {1}  # each payslip mailed once
    pdfs = list((tmp_path / "payslips" / "2026-11").glob("*.pdf"))
    assert len(pdfs) == delivered
    assert "sweeping" in (tmp_path / "worker.log").read_text()
