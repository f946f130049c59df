"""A private PostgreSQL primary and its streaming standby, for failover tests.

Never the shared server: ``initdb`` and ``pg_ctl`` in a temporary folder, on free ports of
127.0.0.1, run as the ``postgres`` user (initdb refuses root), the folder owned by it. The
standby is made with ``pg_basebackup -R`` (``standby.signal`` and ``primary_conninfo``) and
streams asynchronously: the primary's commits never wait for it. Without the binaries the
test is skipped with the reason, and fails under ``CI=true``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import pytest

USER = "postgres"


def bin_dir() -> Path | None:
    """The newest /usr/lib/postgresql/*/bin that has initdb."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"a private PostgreSQL primary and standby are required in CI: {reason}")
    pytest.skip(f"no private PostgreSQL primary and standby: {reason}")
    raise AssertionError(reason)  # not reached: skip raises


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.data = cluster.root / name
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.run(["pg_ctl", "-D", str(self.data), "-l",
                                 str(self.cluster.root / f"{self.name}.log"), *args], check=check)

    def start(self) -> None:
        self.ctl("-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self.ctl("-w", "-t", "60", "-m", mode, "stop", check=False)

    def promote(self) -> None:
        self.ctl("-w", "-t", "60", "promote")

    def sql(self, query: str) -> str:
        done = self.cluster.run(["psql", "-X", "-A", "-t", "-h", "127.0.0.1", "-p",
                                 str(self.port), "-U", USER, "-d", "postgres", "-c", query])
        return done.stdout.strip()

    def log(self) -> str:
        path = self.cluster.root / f"{self.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


class Cluster:
    """``primary`` and ``standby``; ``close()`` stops both and removes the folder."""

    def __init__(self) -> None:
        found = bin_dir()
        if found is None:
            unavailable("no initdb under /usr/lib/postgresql/*/bin")
        assert found is not None
        self.bin = found
        try:
            self.owner = pwd.getpwnam(USER)
        except KeyError:
            unavailable(f"no {USER!r} user to run the server as")
        if os.geteuid() != 0 and os.geteuid() != self.owner.pw_uid:
            unavailable(f"neither root nor {USER!r}: cannot run the server as {USER!r}")
        self.root = Path(tempfile.mkdtemp(prefix="wl_failover_"))
        os.chown(self.root, self.owner.pw_uid, self.owner.pw_gid)
        self.primary = Node(self, "primary")
        self.standby = Node(self, "standby")

    def run(self, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", USER, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=self.root, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: "
                                 f"{done.stderr.strip() or done.stdout.strip()}")
        return done

    def start(self) -> None:
        primary, standby = self.primary, self.standby
        self.run(["initdb", "-D", str(primary.data), "-U", USER, "--auth=trust", "-E", "UTF8",
                  "--no-sync"])
        self._configure(primary, wal_level="replica", max_wal_senders="4")
        primary.start()
        self.run(["pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", USER,
                  "-D", str(standby.data), "-R", "-X", "stream", "-c", "fast"])
        self._configure(standby)
        standby.start()
        self.wait_streaming()

    def _configure(self, node: Node, **extra: str) -> None:
        settings = {"port": str(node.port), "listen_addresses": "'127.0.0.1'",
                    "unix_socket_directories": f"'{self.root}'", "fsync": "off",
                    "hot_standby": "on", **extra}
        with open(node.data / "postgresql.conf", "a") as conf:
            conf.write("".join(f"\n{k} = {v}" for k, v in settings.items()) + "\n")

    def wait_streaming(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.primary.sql("SELECT count(*) FROM pg_stat_replication "
                                "WHERE state = 'streaming'") == "1":
                return
            time.sleep(0.1)
        raise AssertionError(f"the standby never streamed:\n{self.standby.log()[-2000:]}")

    def wait_replayed(self, timeout: float = 30.0) -> None:
        """Every commit of the primary so far is replayed on the standby."""
        target = self.primary.sql("SELECT pg_current_wal_lsn()")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            caught = self.standby.sql(
                f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn")
            if caught == "t":
                return
            time.sleep(0.05)
        raise AssertionError(f"the standby did not replay up to {target}")

    def close(self) -> None:
        for node in (self.standby, self.primary):
            if (node.data / "postmaster.pid").exists():
                node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
