"""examples/fastapi_service runs as its README says (issue 24): the service under uvicorn, the
worker, the two requests; and a worker SIGKILLed mid-run is replaced and the run completes with
every notification sent under its own key."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import poll

pytestmark = pytest.mark.concurrency

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "fastapi_service"
README = (EXAMPLE / "README.md").read_text()
COMMANDS = re.search(r"## Run it\n.*?```sh\n(.*?)```", README, flags=re.S)


def readme_commands() -> list[str]:
    assert COMMANDS, "examples/fastapi_service/README.md has no commands under 'Run it'"
    return [line for line in COMMANDS.group(1).splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.sent = tmp / "sent.txt"
        bin_dir = str(Path(sys.executable).parent)
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("WORKLEDGER_")},
                    "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
                    "WORKLEDGER_DB": f"sqlite:///{tmp / 'service.db'}",
                    "NOTIFY_SENT": str(self.sent), "NOTIFY_SLOW": "0.02"}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, command: str, log: str) -> subprocess.Popen[bytes]:
        command = command.replace("--port 8000", f"--port {self.port}")
        proc = subprocess.Popen(shlex.split(command), cwd=EXAMPLE, env=self.env,
                                stdout=open(self.tmp / log, "ab"),  # noqa: SIM115
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def call(self, command: str) -> tuple[int, Any]:
        """A README curl command, run with curl against this test's port."""
        argv = shlex.split(command.replace("localhost:8000", f"127.0.0.1:{self.port}"))
        done = subprocess.run([*argv, "-w", "\n%{http_code}"], capture_output=True, text=True,
                              timeout=60)
        body, _, code = done.stdout.rpartition("\n")
        return int(code), json.loads(body)

    def request(self, method: str, path: str, body: Any = None,
                key: str | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                     method=method,
                                     headers={"Content-Type": "application/json",
                                              **({"Idempotency-Key": key} if key else {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def up(self) -> bool:
        try:
            return self.request("GET", "/notifications/999")[0] == 404
        except OSError:
            return False

    def sent_keys(self) -> Counter[str]:
        if not self.sent.exists():
            return Counter()
        return Counter(line.split()[0] for line in self.sent.read_text().splitlines())

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    pytest.importorskip("fastapi")
    found = Service(tmp_path)
    yield found
    found.stop()


def test_the_readme_gives_the_four_commands() -> None:
    serve, worker, post, get = readme_commands()
    assert serve == "uvicorn service:app --port 8000"
    assert worker.startswith("workledger --app service:ledger worker")
    assert post.startswith("curl -s -X POST localhost:8000/notifications")
    assert get == "curl -s localhost:8000/notifications/1"


def test_the_service_records_sends_and_reports_as_its_readme_says(service: Service) -> None:
    serve, worker, post, get = readme_commands()
    service.start(serve, "uvicorn.log")
    poll(service.up, "the service to answer", timeout=60)
    service.start(worker, "worker.log")
    code, created = service.call(post)
    assert (code, created["run"], created["created"]) == (201, 1, True)
    poll(lambda: service.call(get)[1]["state"] == "completed", "the run to complete",
         timeout=60)
    assert service.call(get) == (200, {"run": 1, "state": "completed", "total": 3,
                                       "processed": 2, "skipped": 1, "failed": 0,
                                       "next": "nobody: complete"})
    again = service.call(post)
    assert again == (200, {"run": 1, "created": False, "state": "completed"})
    other = service.request("POST", "/notifications", {"users": ["eve@example.com"]},
                            key="welcome-1")
    assert other[0] == 409
    assert service.request("GET", "/notifications/999")[0] == 404
    assert sorted(service.sent_keys()) == ["1/send/0", "1/send/1"]


def test_a_worker_killed_mid_run_is_replaced_and_the_run_completes(service: Service) -> None:
    serve, worker, _post, _get = readme_commands()
    service.start(serve, "uvicorn.log")
    poll(service.up, "the service to answer", timeout=60)
    users = [f"user{i}@example.com" for i in range(600)] + ["nobody", "nobody-else"]
    code, created = service.request("POST", "/notifications", {"users": users}, key="big")
    assert code == 201
    first = service.start(f"{worker} --lease 2", "first.log")  # its leases expire soon
    poll(lambda: sum(service.sent_keys().values()) >= 100, "100 notifications", timeout=60)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    assert service.request("GET", f"/notifications/{created['run']}")[1]["state"] != "completed"
    service.start(worker, "second.log")
    poll(lambda: service.request("GET", f"/notifications/{created['run']}")[1]["state"]
         == "completed", "the run to complete after the kill", timeout=120)
    status = service.request("GET", f"/notifications/{created['run']}")[1]
    assert (status["total"], status["processed"], status["skipped"]) == (602, 600, 2)
    # every user's notification was sent, each under its own stable key (the items the dead
    # worker was running may have been sent again: under the same key, which deduplicates)
    assert set(service.sent_keys()) == {f"{created['run']}/send/{seq}" for seq in range(600)}
