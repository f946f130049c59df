"""A real ``workledger serve`` process on loopback for the tests that attack it: started by
the console script (as an operator runs it, so ``python -m`` puts no folder on sys.path),
with its address, its printed sign-in token, its memory from /proc, and raw sockets."""

from __future__ import annotations

import queue
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from waiting import poll
from web_support import WEB_APP, cli_env

WORKLEDGER = Path(sys.executable).parent / "workledger"


class Served:
    """``made``: the lines serve prints when it makes a token: the sign-in address with its
    one-time code, then the token."""

    def __init__(self, proc: subprocess.Popen[str], first: str, made: list[str]) -> None:
        self.proc = proc
        self.url = first.split()[2]
        self.port = int(self.url.rstrip("/").rsplit(":", 1)[1])
        self.sign_in = self.code = self.token = None
        for line in made:
            if line.startswith("sign in: "):
                self.sign_in = line.split()[2]
                self.code = self.sign_in.partition("code=")[2] or None
            elif line.startswith("token: "):
                self.token = line.split()[1]
        self.stderr = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def status(self, field: str) -> int:
        """A field of /proc/PID/status in KiB (VmRSS now, VmHWM the peak so far)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} in /proc/{self.pid}/status")

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path.lstrip("/"), timeout=10, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.url + path.lstrip("/"), timeout=10, **kwargs)

    def bearer(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10,
                                        source_address=(source, 0))
        return sock

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _out, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _out, err = self.proc.communicate()
        self.stderr = err
        return err


def _limit_files(nofile: int | None) -> Any:
    if nofile is None:
        return None

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return limit


@contextmanager
def served(url: str | None, *args: str, cwd: Path, app: str | None = WEB_APP,
           env: dict[str, str] | None = None, nofile: int | None = None,
           top: tuple[str, ...] = ()) -> Iterator[Served]:
    """``workledger --db URL [--app APP] serve --port 0 ARGS`` until the block ends."""
    command = [str(WORKLEDGER), *(["--db", url] if url else []),
               *(["--app", app] if app else []), *top,
               "serve", "--port", "0", *args]
    proc = subprocess.Popen(command, cwd=cwd, env=env or cli_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_limit_files(nofile))
    server: Served | None = None
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("workledger serve: http://"), (first, proc.stderr and
                                                                proc.stderr.read())
        made = "WORKLEDGER_TOKEN" not in (env or {}) and "--no-token" not in args and \
            "--token-file" not in args
        lines = [_line_within(proc, 10.0) for _ in range(2)] if made else []
        server = Served(proc, first, [line for line in lines if line])
        poll(lambda: _answers(server), "the server to answer /healthz", timeout=30)
        yield server
    finally:
        if server is not None:
            server.stop()
        elif proc.poll() is None:
            proc.kill()
            proc.communicate()


def _line_within(proc: subprocess.Popen[str], seconds: float) -> str | None:
    """The next line of the server's output, or None if it prints none that soon (a reader
    thread: select on the pipe would miss a line already in the reader's buffer)."""
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()),  # type: ignore[union-attr]
                     daemon=True).start()
    try:
        return lines.get(timeout=seconds) or None
    except queue.Empty:
        return None


def _answers(server: Served) -> bool:
    try:
        return server.get("healthz").status_code == 200
    except httpx.HTTPError:
        return False


def raw(server: Served, request: bytes, source: str = "127.0.0.1") -> bytes:
    """Send ``request`` as it is; the whole answer (until the server closes or 10 s pass)."""
    with server.connect(source) as sock:
        sock.sendall(request)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
    return b"".join(chunks)

