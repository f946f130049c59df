"""What the HTTP tests share: the test app's ledger, a client, the CLI as a subprocess, and a
way to leave an item ``unknown`` as a vanished worker would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from workledger import Ledger
from workledger.http import Tokens, create_app
from workledger.storage.port import ClaimParams, LeaseParams

APPS = Path(__file__).parent / "apps"
if str(APPS) not in sys.path:
    sys.path.insert(0, str(APPS))

import web_app  # noqa: E402

WEB_APP = "web_app:ledger"


def build(url: str) -> Ledger:
    return web_app.build(url)


@contextmanager
def client_for(url: str, tokens: Tokens | None = None, **kwargs: Any
               ) -> Iterator[tuple[TestClient, Ledger]]:
    ledger = build(url)
    try:
        with TestClient(create_app(ledger, tokens), **kwargs) as client:
            yield client, ledger
    finally:
        ledger.close()


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKLEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(APPS), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def wl(url: str, *args: str, app: str | None = WEB_APP, cwd: Path | None = None,
       env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    top = ["--db", url] + (["--app", app] if app else [])
    return subprocess.run([sys.executable, "-m", "workledger.cli", *top, *args], cwd=cwd,
                          env=env or cli_env(), capture_output=True, text=True, timeout=120)


def cli_json(url: str, *args: str, app: str | None = WEB_APP) -> Any:
    done = wl(url, *args, app=app)
    assert done.returncode in (0, 1), done.stderr  # audit exits 1 when a person is needed
    return json.loads(done.stdout)


def wait_for(check: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def make_unknown(ledger: Ledger, run_id: int) -> int:
    """Claim one item of a ``sends`` run, start it, let its lease run out, sweep: the item is
    ``unknown`` as if its worker had vanished mid-send. Returns its seq."""
    store = ledger.store
    [item] = store.items_claim(ClaimParams(run_id, 1, 0.05))
    store.items_mark_started(LeaseParams(run_id, [item.id], item.lease_token), charge=1)
    wait_for(lambda: any(i.id == item.id for i in store.leases_expired()), what="lease expiry")
    ledger.sweep(grace=0)
    assert ledger.item(run_id, item.stage, item.seq).state == "unknown"  # type: ignore[union-attr]
    return item.seq
