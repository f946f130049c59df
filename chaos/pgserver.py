"""A private PostgreSQL server for the campaign, so that a restart never touches a shared one.

``initdb`` and ``pg_ctl`` of the machine's PostgreSQL (``/usr/lib/postgresql/*/bin`` or the
``PATH``) create a cluster in a temporary folder and run it on a free port on 127.0.0.1. As
root, every command runs as the ``postgres`` user (``initdb`` refuses root) and the folder is
given to it. ``fsync`` and ``synchronous_commit`` stay on: the durability the ledger assumes.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg

SERVER_OPTIONS = ("-c max_connections=200 -c shared_buffers=32MB -c fsync=on "
                  "-c synchronous_commit=on")


class ServerUnavailable(RuntimeError):
    """No private server can be started here (no initdb, or no postgres user as root)."""


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    path = found[0] if found else shutil.which(name)
    if not path:
        raise ServerUnavailable(f"{name} not found (install the PostgreSQL server binaries)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """One cluster in a temporary folder: start, restart (fast or as a crash), stop, remove."""

    def __init__(self, also_listen: str | None = None, trust: str | None = None) -> None:
        """``also_listen``: an address besides 127.0.0.1 (a partition's veth, netns.py), and
        ``trust`` the network its clients come from."""
        self.initdb, self.pg_ctl = _bin("initdb"), _bin("pg_ctl")
        self.listen = ",".join(filter(None, ["127.0.0.1", also_listen]))
        self.trust = trust
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError as exc:
                raise ServerUnavailable("running as root without a postgres user") from exc
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.base = Path(tempfile.mkdtemp(prefix="wl-chaos-pg-"))
        self.data = self.base / "data"
        self.port = free_port()
        self.log = self.base / "server.log"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*self.as_user, *argv], capture_output=True, text=True,
                              timeout=120)
        if check and done.returncode != 0:
            raise ServerUnavailable(f"{Path(argv[0]).name} failed: "
                                    f"{(done.stderr or done.stdout).strip()[-500:]}")
        return done

    def create(self) -> None:
        if self.as_user:
            shutil.chown(self.base, "postgres", "postgres")
        self._run(self.initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "-E", "UTF8", "--no-sync")
        if self.trust:
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {self.trust} trust\n")
        self.start()

    def start(self) -> None:
        options = f"-p {self.port} -k {self.base} -c listen_addresses={self.listen} " \
            f"{SERVER_OPTIONS}"
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120",
                  "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop",
                  check=False)

    def running(self) -> bool:
        done = self._run(self.pg_ctl, "-D", str(self.data), "status", check=False)
        return done.returncode == 0

    def url(self, database: str = "postgres", host: str = "127.0.0.1") -> str:
        return f"postgresql://postgres@{host}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def remove(self) -> None:
        if self.data.exists():
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text().splitlines()[-lines:])
        except OSError:
            return ""
