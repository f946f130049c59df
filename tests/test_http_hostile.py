"""A real ``workledger serve`` on loopback against what an attacker on the same machine, or a
web page its operator visits, can send: rebound names in Host and Origin, guessed tokens,
stolen cookies after sign-out, oversize bodies and headers, slow and half-open clients under a
low descriptor limit. Memory is read from /proc; every request is a real one."""

from __future__ import annotations

import asyncio
import json
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_support import WORKLEDGER, Served, raw, served
from web_support import build, cli_env

from workledger.http import Tokens, create_app
from workledger.http.auth import Principal

pytestmark = pytest.mark.integration
EVIL = "rebind.evil.example"
LONG_TOKEN = "t0-hostile-0123456789abcdef"
MIB = 1024 * 1024


def forged(server: Served, name: str = EVIL) -> dict[str, str]:
    """What a browser sends from a page whose name was rebound to 127.0.0.1."""
    origin = f"http://{name}:{server.port}"
    return {"Host": f"{name}:{server.port}", "Origin": origin, "Sec-Fetch-Site": "same-origin"}


def test_a_rebound_name_can_neither_read_nor_act_on_a_server_started_without_a_token(
        sqlite_url: str, tmp_path: Path) -> None:
    ledger = build(sqlite_url)
    run = ledger.submit("numbers", {"n": 3}, key="k").run_id
    with served(sqlite_url, cwd=tmp_path) as server:
        cancel = server.post(f"runs/{run}/do/cancel", data={"note": "x"}, headers=forged(server),
                             follow_redirects=False)
        assert cancel.status_code == 400 and "Host" in cancel.json()["error"]
        submit = server.post("api/jobs/numbers/runs", json={"n": 1}, headers=forged(server))
        assert submit.status_code == 400
        page = server.get("", headers=forged(server))
        assert page.status_code == 400 and "run-card" not in page.text
    assert ledger.status(run).state == "running" and len(ledger.runs()) == 1
    ledger.close()


def test_host_and_origin_must_name_this_server_or_an_allowed_host(
        sqlite_url: str, tmp_path: Path) -> None:
    build(sqlite_url).submit("numbers", {"n": 1}, key="k")
    env = cli_env(WORKLEDGER_TOKEN="t0")
    with served(sqlite_url, "--allowed-host", "wl.example", cwd=tmp_path, env=env) as server:
        auth = server.bearer("t0")
        for host in ("127.0.0.1", "localhost", "127.0.0.1"):
            assert server.get("api/runs", headers={**auth, "Host": f"{host}:{server.port}"}
                              ).status_code == 200, host
        assert server.get("api/runs", headers={**auth, "Host": "wl.example"}).status_code == 200
        for host in (f"{EVIL}:{server.port}", f"localhost:{server.port + 1}", "", "a b",
                     f"127.0.0.1.{EVIL}:{server.port}"):
            assert server.get("api/runs", headers={**auth, "Host": host}).status_code == 400, host
        # Origin against the server's own origins, not against the Host the page chose
        behind_proxy = {**auth, "Origin": "https://wl.example", "Sec-Fetch-Site": "same-origin"}
        assert server.post("runs/1/do/pause", data={}, headers=behind_proxy,
                           follow_redirects=False).status_code == 303
        other = {**auth, "Origin": f"http://{EVIL}:{server.port}"}
        assert server.post("runs/1/do/resume", data={}, headers=other).status_code == 403


# Starlette before 1.0.1 rebuilt request.url from Host: with ``Host: 127.0.0.1:P/healthz?`` a
# request for /api/runs looked like one for /healthz, which needs no token
PATH_IN_HOST = ("/healthz?", "/healthz#", "/healthz", "/signin?", "/static/x?", "?/healthz",
                "#/healthz", "\\healthz", "@evil.example", "/healthz?x=", " /healthz")


def test_a_host_that_carries_a_path_is_refused_and_opens_nothing(
        sqlite_url: str, tmp_path: Path) -> None:
    ledger = build(sqlite_url)
    run = ledger.submit("numbers", {"n": 3}, key="k").run_id
    with served(sqlite_url, cwd=tmp_path) as server:
        for tail in PATH_IN_HOST:
            for host in (f"127.0.0.1:{server.port}{tail}", f"localhost{tail}",
                         f"user@127.0.0.1:{server.port}"):
                line = f"Host: {host}\r\nConnection: close\r\n".encode()
                read = raw(server, b"GET /api/runs HTTP/1.1\r\n" + line + b"\r\n")
                assert read.startswith(b"HTTP/1.1 400"), (host, read[:120])
                assert b'"runs"' not in read, host
                act = raw(server, b"POST /api/runs/%d/cancel HTTP/1.1\r\n" % run + line
                          + b"Content-Length: 0\r\n\r\n")
                assert act.startswith(b"HTTP/1.1 400"), (host, act[:120])
        assert server.get("healthz").status_code == 200  # a plain Host still answers
    assert ledger.status(run).state == "running"
    ledger.close()


def _asgi_status(app: Any, path: str, host: str, root_path: str = "") -> int:
    """One GET through the application itself, with the scope a server would build."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": root_path, "query_string": b"", "headers": [(b"host", host.encode())],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8080)}
    started: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            started.append(message["status"])

    asyncio.run(app(scope, receive, send))
    return started[0]


def test_the_guard_judges_the_path_the_router_routes_whatever_the_host_says(
        sqlite_url: str) -> None:
    """The guard takes the path from the ASGI scope, less the root path a mount gives it,
    as the router does: never from request.url, which a Host header could rewrite, and never
    a path the router would route elsewhere (mounted under /static, /static/api/runs is
    /api/runs to the router)."""
    ledger = build(sqlite_url)
    app = create_app(ledger, Tokens((("t-" + "x" * 30, Principal("api", True)),)))
    try:
        assert _asgi_status(app, "/healthz", "127.0.0.1:8080") == 200
        assert _asgi_status(app, "/api/runs", "127.0.0.1:8080/healthz?") == 401
        assert _asgi_status(app, "/static/api/runs", "127.0.0.1:8080", root_path="/static"
                            ) == 401
        assert _asgi_status(app, "/wl/healthz", "127.0.0.1:8080", root_path="/wl") == 200
    finally:
        ledger.close()


def _own_address() -> str:
    """This machine's address toward the documentation network (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))
        return str(probe.getsockname()[0])


def test_on_every_address_an_origin_must_still_be_one_of_the_servers_own(
        sqlite_url: str, tmp_path: Path) -> None:
    """Listening on 0.0.0.0, any address literal is a fine Host (nothing to rebind), but a
    page of another machine served on the same port (Origin http://6.6.6.6:P) is not one of
    the server's own pages: only loopback, the address the request arrived at and the
    --allowed-host names are."""
    build(sqlite_url).submit("numbers", {"n": 1}, key="k")
    env = cli_env(WORKLEDGER_TOKEN=LONG_TOKEN)
    with served(sqlite_url, "--host", "0.0.0.0", cwd=tmp_path, env=env) as server:
        auth, port = server.bearer(LONG_TOKEN), server.port
        for origin in (f"http://6.6.6.6:{port}", f"http://10.9.8.7:{port}",
                       f"https://6.6.6.6:{port}", f"http://[2001:db8::1]:{port}"):
            other = httpx.post(f"http://127.0.0.1:{port}/runs/1/do/pause", timeout=10,
                               headers={**auth, "Origin": origin})
            assert other.status_code == 403, origin
        own = _own_address()
        mine = httpx.post(f"http://{own}:{port}/runs/1/do/pause", timeout=10,
                          headers={**auth, "Origin": f"http://{own}:{port}"})
        assert mine.status_code == 303, mine.text
        looped = httpx.post(f"http://127.0.0.1:{port}/runs/1/do/resume", timeout=10,
                            headers={**auth, "Origin": f"http://localhost:{port}"})
        assert looped.status_code == 303, looped.text


def test_every_response_carries_the_security_headers(sqlite_url: str, tmp_path: Path) -> None:
    with served(sqlite_url, cwd=tmp_path) as server:
        for path in ("", "signin", "api/runs", "static/style.css", "healthz", "nowhere"):
            headers = server.get(path).headers
            csp = headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, path
            assert "unsafe-eval" not in csp and "'unsafe-inline'" not in csp.split(
                "script-src")[1].split(";")[0]
            assert headers["x-frame-options"] == "DENY", path
            assert headers["x-content-type-options"] == "nosniff", path
            assert headers["referrer-policy"] == "same-origin", path


def test_the_sign_in_cookie_is_a_session_that_sign_out_ends(sqlite_url: str,
                                                             tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:t-alice\nviewer:t-view:read\n")
    tokens.chmod(0o600)
    with served(sqlite_url, "--token-file", str(tokens), cwd=tmp_path) as server:
        for token in ("t-alice", "t-view"):
            with httpx.Client(base_url=server.url) as browser:
                signed = browser.post("signin", data={"token": token}, follow_redirects=False)
                cookie = signed.headers["set-cookie"]
                assert token not in cookie and "HttpOnly" in cookie and "Max-Age=" in cookie
                stolen = dict(browser.cookies)
                assert browser.get("/").status_code == 200
                out = browser.post("signout", follow_redirects=False)  # a reader too
                assert out.status_code == 303, token
                again = httpx.get(server.url, cookies=stolen)
                assert again.status_code == 401 and 'name="token"' in again.text, token


def test_behind_a_trusted_tls_proxy_the_session_cookie_is_host_prefixed_and_secure(
        sqlite_url: str, tmp_path: Path) -> None:
    env = cli_env(WORKLEDGER_TOKEN="t0")
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "192.0.2.7"}
    with served(sqlite_url, "--forwarded-allow-ips", "127.0.0.1", cwd=tmp_path,
                env=env) as server:
        cookie = server.post("signin", data={"token": "t0"}, headers=https,
                             follow_redirects=False).headers["set-cookie"]
        assert cookie.startswith("__Host-workledger_session=") and "Secure" in cookie
        assert "Path=/" in cookie and "Domain" not in cookie
    with served(sqlite_url, cwd=tmp_path, env=env) as server:  # no proxy trusted
        cookie = server.post("signin", data={"token": "t0"}, headers=https,
                             follow_redirects=False).headers["set-cookie"]
        assert cookie.startswith("workledger_session=") and "Secure" not in cookie


def test_believing_every_client_s_forwarded_for_is_warned_about_and_not_offered(
        sqlite_url: str, tmp_path: Path) -> None:
    """With --forwarded-allow-ips '*' a client names its own address in X-Forwarded-For:
    it can dodge the throttle or have a chosen address counted. Safe only behind a proxy that
    overwrites the header; serve says so, and its help no longer offers '*'."""
    shown = subprocess.run([str(WORKLEDGER), "serve", "--help"], capture_output=True,
                           text=True, timeout=60, env=cli_env())
    assert "--forwarded-allow-ips" in shown.stdout and "*" not in shown.stdout.split(
        "--forwarded-allow-ips", 1)[1].split("--read-timeout", 1)[0]
    env = cli_env(WORKLEDGER_TOKEN=LONG_TOKEN)
    with served(sqlite_url, "--forwarded-allow-ips", "*", cwd=tmp_path, env=env) as server:
        err = server.stop()
    assert "X-Forwarded-For" in err and "overwrites" in err, err
    with served(sqlite_url, "--forwarded-allow-ips", "127.0.0.1", cwd=tmp_path,
                env=env) as server:
        err = server.stop()
    assert "X-Forwarded-For" not in err, err


def _peak_mib(server: Served) -> float:
    return server.status("VmHWM") / 1024


def test_an_oversize_body_is_refused_before_it_is_read(sqlite_url: str, tmp_path: Path
                                                       ) -> None:
    env = cli_env(WORKLEDGER_TOKEN="t0")
    with served(sqlite_url, cwd=tmp_path, env=env) as server:
        before = _peak_mib(server)
        head = (b"POST /signin HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %d\r\n"
                b"Content-Type: application/x-www-form-urlencoded\r\n\r\n")
        with server.connect() as sock:
            sock.sendall(head % (server.port, 100 * MIB))
            sent = 0
            try:
                while sent < 100 * MIB:
                    sock.sendall(b"t" * MIB)
                    sent += MIB
            except (BrokenPipeError, ConnectionResetError):
                pass
            sock.settimeout(10)
            try:
                answer = sock.recv(4096)
            except ConnectionResetError:
                answer = b""
        assert sent < 100 * MIB or answer.startswith(b"HTTP/1.1 413"), answer[:80]
        chunked = raw(server, b"POST /signin HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n" % server.port
                      + b"100000\r\n" + b"t" * 0x100000 + b"\r\n0\r\n\r\n")
        assert chunked.startswith(b"HTTP/1.1 413"), chunked[:80]
        action = server.post("runs/1/do/pause", content=b"note=" + b"x" * MIB,
                             headers=server.bearer("t0"))
        assert action.status_code == 413 and "body" in action.json()["error"]
        assert _peak_mib(server) - before < 16, (before, _peak_mib(server))


def test_an_oversize_header_is_a_400_and_costs_no_memory(sqlite_url: str, tmp_path: Path
                                                         ) -> None:
    with served(sqlite_url, cwd=tmp_path) as server:
        before = _peak_mib(server)
        for _ in range(4):
            with server.connect() as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
                answer, sent = b"", 0
                try:
                    while sent < 50 * MIB:
                        sock.sendall(b"a" * MIB)
                        sent += MIB
                except (BrokenPipeError, ConnectionResetError):
                    pass
                sock.settimeout(5)
                try:
                    answer = sock.recv(4096)
                except (ConnectionResetError, TimeoutError):
                    pass
            assert sent < 50 * MIB, "the server read a 50 MiB header"
            assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:80]
        assert _peak_mib(server) - before < 16, (before, _peak_mib(server))
        assert server.get("healthz").status_code == 200


def test_bad_input_is_a_400_and_a_client_hanging_up_writes_no_log(
        sqlite_url: str, tmp_path: Path) -> None:
    exports = tmp_path / "exports"
    exports.mkdir()
    with served(sqlite_url, "--export-dir", str(exports), cwd=tmp_path) as server:
        auth = server.bearer()
        since = server.get("api/audit?since=1000000d", headers=auth)
        assert since.status_code == 400 and "year" in since.json()["error"]
        prune = server.post("api/prune", headers=auth,
                            json={"finished_before": "1d", "export": "x" * 300})
        assert prune.status_code == 400 and list(prune.json()) == ["error"]
        for _ in range(10):
            with server.connect() as sock:
                sock.sendall(b"POST /signin HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                             b"Content-Length: 1000\r\n\r\ntoken=abc")
        assert server.get("healthz").status_code == 200
        err = server.stop()
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) <= 2, err[-3000:]


def test_dates_out_of_range_and_nul_in_names_are_400s_on_both_backends(
        db_url: str, tmp_path: Path) -> None:
    """PostgreSQL refuses NUL in text (a StorageError, 500, before), SQLite would look for it;
    a time that moves past year 9999 or before year 1 in UTC overflowed (500). Each is a
    one-line 400 now, and the log holds neither a traceback nor a raw control character."""
    ledger = build(db_url)
    ledger.submit("numbers", {"n": 1}, key="k")
    ledger.close()
    with served(db_url, cwd=tmp_path) as server:
        auth = server.bearer()
        for since in ("9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00%2B01:00"):
            answer = server.get(f"api/audit?since={since}", headers=auth)
            assert answer.status_code == 400, (since, answer.text)
            assert "9999" in answer.json()["error"]
        for path in ("api/runs/1/items/%00/0", "api/audit?job=%00", "api/runs/1/items?stage=%00",
                     "api/runs?job=%00"):
            answer = server.get(path, headers=auth)
            assert answer.status_code == 400 and "NUL" in answer.json()["error"], path
        page = server.get("runs/1/items/%00/0", headers=auth)
        assert page.status_code == 400, page.text[:200]
        resolve = server.post("api/runs/1/items/%00/0/resolve", headers=auth,
                              json={"as": "processed"})
        assert resolve.status_code == 400 and "NUL" in resolve.json()["error"]
        err = server.stop()
    assert "Traceback" not in err and "\x00" not in err, err[-3000:]


def test_uvicorns_own_log_lines_pass_through_the_masking_formatter(
        pg_url: str, tmp_path: Path) -> None:
    secret = "hunter2-secret"
    env = cli_env(WORKLEDGER_DB=pg_url.replace("postgres@", f"postgres:{secret}@"))
    with served(None, "--log-format", "json", cwd=tmp_path, env=env, app=None) as server:
        answer = raw(server, b"GARBAGE\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400")
        err = server.stop()
    assert secret not in err
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert any(line["logger"].startswith("uvicorn") for line in lines), err


def test_a_flood_of_malformed_requests_writes_a_line_now_and_then_not_one_each(
        sqlite_url: str, tmp_path: Path) -> None:
    """uvicorn logs a line per malformed request: any client could fill the disk or drown
    the log. The same line is written at most once in ten seconds, saying how many it
    stands for."""
    with served(sqlite_url, cwd=tmp_path) as server:
        for _ in range(50):
            assert raw(server, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
        assert server.get("healthz").status_code == 200
        err = server.stop()
    said = [line for line in err.splitlines() if "Invalid HTTP request" in line]
    assert 1 <= len(said) <= 2, err[-2000:]


def test_the_ledger_and_its_exports_are_created_readable_by_their_owner_only(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    exports = tmp_path / "exports"
    exports.mkdir()
    ledger_path = tmp_path / "fresh.db"
    with served(url, "--export-dir", str(exports), cwd=tmp_path) as server:
        auth = server.bearer()
        assert server.post("api/jobs/numbers/runs", json={"n": 2}, headers=auth
                           ).status_code == 201
        assert server.post("api/prune", headers=auth, json={
            "finished_before": "0s", "export": "old.jsonl"}).status_code == 200
        files = [ledger_path, Path(f"{ledger_path}-wal"), Path(f"{ledger_path}-shm"),
                 exports / "old.jsonl"]
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_token_file_others_can_read_is_warned_about(sqlite_url: str, tmp_path: Path
                                                      ) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:t-alice\n")
    tokens.chmod(0o644)
    with served(sqlite_url, "--token-file", str(tokens), cwd=tmp_path) as server:
        err = server.stop()
    assert "token file" in err and "chmod 600" in err and "t-alice" not in err


@pytest.mark.parametrize("given", ["wl.example.com:abc", "http://wl.example.com", "*",
                                   "wl.example.com:99999", "wl.example.com/", "a b", ""])
def test_an_allowed_host_that_could_match_nothing_is_refused_at_start(
        sqlite_url: str, tmp_path: Path, given: str) -> None:
    done = subprocess.run([str(WORKLEDGER), "--db", sqlite_url, "serve", "--port", "0",
                           "--allowed-host", given], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "--allowed-host" in done.stderr, done.stderr
    assert done.stdout == ""  # it never listened


def test_a_short_token_is_warned_about_without_showing_it(sqlite_url: str,
                                                           tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:abc123\nbob:" + "b" * 32 + "\n")
    tokens.chmod(0o600)
    env = cli_env(WORKLEDGER_TOKEN="s3cr", WORKLEDGER_READ_TOKEN="r" * 32)
    with served(sqlite_url, "--token-file", str(tokens), cwd=tmp_path, env=env) as server:
        assert server.get("api/runs", headers=server.bearer("s3cr")).status_code == 200
        err = server.stop()
    warnings = [line for line in err.splitlines() if "characters" in line]
    assert len(warnings) == 2, err
    assert "WORKLEDGER_TOKEN" in warnings[0] and "line 1" in warnings[1], warnings
    assert "s3cr" not in err and "abc123" not in err


def test_a_password_in_db_on_serves_command_line_is_warned_about(pg_url: str,
                                                                   tmp_path: Path) -> None:
    with_password = pg_url.replace("postgres@", "postgres:s3cret@")
    with served(with_password, cwd=tmp_path, app=None) as server:
        shown = server.stop()
    assert "WORKLEDGER_DB" in shown and "(ps)" in shown and "s3cret" not in shown
    with served(None, cwd=tmp_path, app=None, env=cli_env(WORKLEDGER_DB=with_password)
                ) as server:
        hidden = server.stop()
    assert "warning" not in hidden and "s3cret" not in hidden
