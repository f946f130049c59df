"""Slow clients against a real ``workledger serve`` on loopback: a request that never ends,
half-open heads and bodies still arriving under a low descriptor limit (a slowloris). Each
costs the attacker next to nothing; none may keep /healthz from answering."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest
from serve_support import Served, served
from waiting import poll
from web_support import build, cli_env

pytestmark = pytest.mark.integration


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_client_too_slow_to_send_its_request_is_disconnected(sqlite_url: str,
                                                                tmp_path: Path) -> None:
    env = cli_env(WORKLEDGER_TOKEN="t0")
    with served(sqlite_url, "--read-timeout", "1", cwd=tmp_path, env=env) as server:
        head = server.connect()
        head.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the end
        body = server.connect()
        body.sendall(b"POST /api/runs/1/pause HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                     b"Authorization: Bearer t0\r\nContent-Length: 100\r\n\r\n{"
                     % server.port)
        started = time.monotonic()
        assert _closed_by_server(head, 20) and _closed_by_server(body, 20)
        assert time.monotonic() - started < 15
        head.close()
        body.close()
        assert server.get("healthz").status_code == 200


def test_half_open_connections_under_a_low_descriptor_limit_leave_healthz_answering(
        sqlite_url: str, tmp_path: Path) -> None:
    with served(sqlite_url, cwd=tmp_path, nofile=256) as server:
        held = []
        try:
            for _ in range(300):
                sock = server.connect()
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                held.append(sock)
            # well before the read timeout (10 s) would close the half-open ones
            health = poll(lambda: _healthy(server), "/healthz with 300 half-open requests",
                          timeout=7)
            assert health
        finally:
            for sock in held:
                sock.close()


def _healthy(server: Served) -> bool:
    try:
        return httpx.get(server.url + "healthz", timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


def _slow_bodies(server: Served, count: int, request: bytes) -> list[socket.socket]:
    """``count`` connections that each send a head announcing 4,000 bytes and one byte."""
    held = []
    for _ in range(count):
        sock = server.connect()
        sock.sendall(request % server.port)
        held.append(sock)
    return held


SLOW_BODIES = {
    "a sign-in, before any credential": b"POST /signin HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
    b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 4000\r\n\r\nt",
    "an action, with a good token": b"POST /runs/1/do/pause HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
    b"Authorization: Bearer t0-slow-clients-token\r\nContent-Length: 4000\r\n\r\nn",
}


@pytest.mark.parametrize("kind", list(SLOW_BODIES))
def test_bodies_still_arriving_cannot_keep_healthz_from_answering(
        sqlite_url: str, tmp_path: Path, kind: str) -> None:
    """A connection whose body is still arriving is evictable like an idle one: past the
    connection limit (192 under ``ulimit -n 256``) a new connection closes the oldest of
    them, so a health check gets through long before the read timeout (30 s here)."""
    build(sqlite_url).submit("numbers", {"n": 1}, key="k")
    env = cli_env(WORKLEDGER_TOKEN="t0-slow-clients-token")
    with served(sqlite_url, "--read-timeout", "30", cwd=tmp_path, env=env,
                nofile=256) as server:
        held = _slow_bodies(server, 300, SLOW_BODIES[kind])
        try:
            assert poll(lambda: _healthy(server), f"/healthz past 300 slow bodies ({kind})",
                        timeout=10)
        finally:
            for sock in held:
                sock.close()


def test_a_sign_in_body_has_two_seconds_to_arrive(sqlite_url: str, tmp_path: Path) -> None:
    """The sign-in form is a few bytes and the one body read before any credential: it gets
    a deadline of its own, far shorter than --read-timeout."""
    with served(sqlite_url, "--read-timeout", "60", cwd=tmp_path) as server:
        [sock] = _slow_bodies(server, 1, SLOW_BODIES["a sign-in, before any credential"])
        with sock:
            started = time.monotonic()
            sock.settimeout(30)
            answer = b""
            while chunk := sock.recv(4096):  # until the server closes the connection
                answer += chunk
            assert time.monotonic() - started < 30  # the read timeout would take 60 s
            assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
        assert server.get("healthz").status_code == 200
