"""What the broker tests share: reaching the real brokers, starting and killing real broker
worker processes (``celery worker``, ``rq worker``) on the app ``tests/apps/dispatch_app.py``,
and the oracle of docs/reliability.md checked against the append-only effects sink.

Each test gets its own queue (and, on Redis, its own key prefix for Celery or its own database
number for RQ), so tests running at once never share a message. Under ``CI=true`` a broker that
cannot be reached fails the test; locally it skips it.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
APPS = ROOT / "tests" / "apps"
sys.path.insert(0, str(APPS))

import dispatch_app  # noqa: E402 - the app lives beside the tests, not in a package

RABBIT = os.environ.get("WORKLEDGER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


def reachable(host: str, port: int, what: str) -> None:
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{what} is required in CI but unreachable at {host}:{port}: {exc}")
        pytest.skip(f"{what} unreachable at {host}:{port}: {exc}")


@dataclass
class Setup:
    """One test's broker, queue, ledger and sink, as the environment of its processes."""

    kind: str  # celery-amqp | celery-redis | rq
    db_url: str
    tmp: Path
    env: dict[str, str] = field(default_factory=dict)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        tag = uuid.uuid4().hex[:10]
        self.sink = str(self.tmp / "sink.db")
        dispatch_app.create_sink(self.sink)
        self.queue = f"wl-test-{tag}"
        self.redis_db = 1 + int(tag, 16) % 15
        url = {"celery-amqp": RABBIT,
               "celery-redis": f"redis://{REDIS_HOST}:{REDIS_PORT}/{self.redis_db}",
               "rq": f"redis://{REDIS_HOST}:{REDIS_PORT}/{self.redis_db}"}[self.kind]
        self.env = {"WL_DB": self.db_url, "WL_SINK": self.sink, "WL_BROKER": self.kind,
                    "WL_BROKER_URL": url, "WL_QUEUE": self.queue, "WL_PREFIX": f"{tag}:",
                    "WL_LEASE": "2", "WL_AFTER": "3", "WL_CHUNK": "50"}

    @property
    def task_died(self) -> str:
        """What the broker worker logs when a task process dies under it."""
        return "terminated unexpectedly" if self.kind == "rq" else "WorkerLostError"

    def deliveries(self) -> int:
        """Messages the broker workers ran, from their logs."""
        marker = "Job OK" if self.kind == "rq" else "succeeded in"
        return logs_of(self.tmp, tail=None).count(marker)

    def ledger(self, **extra: str) -> Any:
        """The test's own ledger: the app as a submitter builds it."""
        return dispatch_app.build({**self.env, **extra})

    def process_env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "WORKLEDGER_FAILPOINTS"}
        env.update(self.env)
        env.update(extra)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(APPS), str(ROOT / "src"),
                                                          env.get("PYTHONPATH")]))
        return env

    def start_worker(self, log: Path, **extra: str) -> subprocess.Popen[bytes]:
        """A real broker worker, in a session of its own (so a kill takes its children too)."""
        bin_dir = Path(sys.executable).parent
        if self.kind == "rq":
            cmd = [str(bin_dir / "rq"), "worker", "-w", "workledger.contrib.rq.Worker",
                   "--url", self.env["WL_BROKER_URL"], "--logging_level", "INFO",
                   "-n", f"{self.queue}-{len(self.workers)}", self.queue]
        else:
            cmd = [str(bin_dir / "celery"), "-A", "dispatch_app", "worker", "-P", "prefork",
                   "-c", "2", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
                   "--without-heartbeat", "-n", f"{self.queue}-{len(self.workers)}@%h"]
        out = open(log, "ab")  # noqa: SIM115 - the worker's log, kept for a failure message
        proc = subprocess.Popen(cmd, env=self.process_env(**extra), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=str(self.tmp))
        self.workers.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker and every process of its session, as a machine that dies."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in _in_session(proc.pid):  # RQ's work horse moves to a group of its own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                self.kill(proc)

    def run_python(self, code: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code], env=self.process_env(**extra),
                              capture_output=True, text=True, timeout=120, cwd=str(self.tmp))

    def waiting(self) -> int:
        """Messages waiting in the test's queue, as the broker counts them."""
        if self.kind == "rq":
            from redis import Redis
            from rq import Queue

            return int(Queue(self.queue, connection=Redis.from_url(self.env["WL_BROKER_URL"]))
                       .count)
        from kombu import Connection

        options = ({"global_keyprefix": self.env["WL_PREFIX"]}
                   if self.kind == "celery-redis" else {})
        with Connection(self.env["WL_BROKER_URL"], transport_options=options) as conn:
            from amqp.exceptions import ChannelError

            queue = conn.SimpleQueue(self.queue)
            try:
                return int(queue.qsize())
            except ChannelError:  # Redis: a queue nothing was published to does not exist
                return 0
            finally:
                queue.close()

    def purge(self, ledger: Any) -> None:
        """Drop every message waiting in the queue: what a broker may lose."""
        ledger.dispatch.purge()

    def cleanup(self) -> None:
        """Remove what the test left on the broker."""
        if self.kind == "rq":
            from redis import Redis

            conn = Redis.from_url(self.env["WL_BROKER_URL"])
            keys = [k for k in conn.scan_iter(f"*{self.queue}*")]
            keys += [k for k in conn.scan_iter("rq:job:*")  # the jobs of this queue only
                     if conn.type(k) == b"hash" and conn.hget(k, "origin") == self.queue.encode()]
            if keys:
                conn.delete(*keys)
        elif self.kind == "celery-redis":
            from redis import Redis

            conn = Redis.from_url(self.env["WL_BROKER_URL"])
            keys = list(conn.scan_iter(f"{self.env['WL_PREFIX']}*"))
            if keys:
                conn.delete(*keys)
        else:
            from kombu import Connection

            with Connection(RABBIT) as conn:
                try:
                    conn.default_channel.queue_delete(self.queue)
                except Exception:  # noqa: BLE001 - never declared: nothing to delete
                    pass


def _in_session(sid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def setup_for(kind: str, db_url: str, tmp: Path) -> Iterator[Setup]:
    if kind == "celery-amqp":
        reachable("127.0.0.1", 5672, "RabbitMQ")
    else:
        reachable(REDIS_HOST, REDIS_PORT, "Redis")
    setup = Setup(kind, db_url, tmp)
    try:
        yield setup
    finally:
        setup.stop_all()
        setup.cleanup()


def logs_of(tmp: Path, tail: int | None = 3000) -> str:
    """The broker workers' logs (the last ``tail`` characters of each; None: all)."""
    return "\n".join(p.read_text(errors="replace")[-(tail or 0):]
                     for p in sorted(tmp.glob("*.log")))


def settled(ledger: Any, run_id: int) -> Any:
    st = ledger.status(run_id)
    return st if st.complete or st.state == "awaiting_repair" and not _moving(st) else None


def _moving(st: Any) -> bool:
    return any(c.get("pending") or c.get("claimed") for c in st.counts.values())


def wait_settled(setup: Setup, ledger: Any, run_id: int, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = settled(ledger, run_id)
        if st is not None:
            return st
        time.sleep(0.2)
    pytest.fail(f"run {run_id} did not settle in {timeout:g} s: "
                f"{ledger.status(run_id).counts}\n{logs_of(setup.tmp)}")


def check_oracle(setup: Setup, ledger: Any, run_id: int, units: int) -> dict[str, int]:
    """docs/reliability.md's oracle, from the sink (what really ran) and the ledger."""
    st = ledger.status(run_id)
    # L: nothing lost, nothing left claimed; every unit is a row
    assert st.total == units, st
    items = {(i.stage, i.seq): i for i in _all_items(ledger, run_id)}
    assert len([k for k in items if k[0] == "prepare"]) == units
    assert not [i for i in items.values() if i.state in ("pending", "claimed")], st.counts
    conn = sqlite3.connect(setup.sink)
    mine = f"{run_id}/%"  # the sink may hold other runs' effects too
    runs = dict(conn.execute("SELECT key, count(*) FROM executions WHERE kind = 'apply' "
                             "AND key LIKE ? GROUP BY key", (mine,)).fetchall())
    effects = {k for (k,) in conn.execute("SELECT key FROM effects WHERE key LIKE ?", (mine,))}
    raw_prepare = conn.execute("SELECT count(*) FROM executions WHERE kind = 'prepare' "
                               "AND key LIKE ?", (mine,)).fetchone()[0]
    conn.close()
    # D: one deduplicated effect per item of the idempotent stage ...
    assert effects == {f"{run_id}/prepare/{s}" for s in range(units)}
    assert all(i.state == "processed" for k, i in items.items() if k[0] == "prepare")
    # ... and no effect of the stage that is not idempotent ran twice; what ran once without
    # a recorded outcome is unknown, never run again
    assert max(runs.values(), default=0) <= 1, {k: n for k, n in runs.items() if n > 1}
    applied = {k: i for k, i in items.items() if k[0] == "apply"}
    assert len(applied) == units
    for (_stage, seq), item in applied.items():
        key = f"{run_id}/apply/{seq}"
        if item.state == "processed":
            assert runs.get(key) == 1, (key, item)
        else:
            assert item.state == "unknown", (key, item)
    # R: the counters reconcile
    check = ledger.reconcile(run_id, dry_run=True)
    assert check.stored == check.derived
    unknown = sum(1 for i in applied.values() if i.state == "unknown")
    # V: settled, and only unknown items wait for a person
    expected = "completed" if unknown == 0 else "awaiting_repair"
    assert st.state == expected, st
    return {"unknown": unknown, "prepare_runs": raw_prepare, "apply_runs": sum(runs.values())}


def _all_items(ledger: Any, run_id: int) -> list[Any]:
    found: list[Any] = []
    after = 0
    while page := ledger.items(run_id, limit=1000, after_id=after):
        found += page
        after = page[-1].id
    return found
