"""Who may do what over HTTP: tokens, the sign-in cookie, read-only tokens, the token file,
same-origin POSTs, and a server that refuses to listen beyond loopback without a token."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from web_support import WEB_APP, cli_env, client_for, wait_for, wl

from workledger.errors import BadInput, UsageError
from workledger.http import Tokens, load_tokens
from workledger.http.auth import Principal, is_loopback
from workledger.http.server import check_bind

pytestmark = pytest.mark.integration

TOKENS = Tokens((("s3cret", Principal("alice", True)), ("peek", Principal("viewer", False))))
ALICE = {"Authorization": "Bearer s3cret"}


def test_every_route_but_healthz_needs_a_known_token(sqlite_url: str) -> None:
    with client_for(sqlite_url, TOKENS) as (client, _ledger):
        assert client.get("/healthz").status_code == 200
        for path in ("/api/runs", "/metrics", "/openapi.json", "/api/audit"):
            got = client.get(path)
            assert got.status_code == 401 and list(got.json()) == ["error"], path
            assert client.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
            assert client.get(path, headers=ALICE).status_code == 200, path
        page = client.get("/")
        assert page.status_code == 401 and 'name="token"' in page.text  # the sign-in form
        assert client.post("/api/runs/1/pause").status_code == 401


def test_sign_in_sets_an_http_only_strict_cookie_that_opens_the_dashboard(sqlite_url: str
                                                                          ) -> None:
    with client_for(sqlite_url, TOKENS) as (client, _ledger):
        wrong = client.post("/signin", data={"token": "guess"}, follow_redirects=False)
        assert wrong.status_code == 401 and "not known" in wrong.text
        signed = client.post("/signin", data={"token": "s3cret"}, follow_redirects=False)
        assert signed.status_code == 303
        cookie = signed.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert client.get("/").status_code == 200  # the client keeps the cookie
        assert client.get("/api/runs").status_code == 200
        client.post("/signout")
        assert client.get("/").status_code == 401


def test_a_read_token_may_read_but_not_act(sqlite_url: str) -> None:
    with client_for(sqlite_url, TOKENS) as (client, ledger):
        client.post("/api/jobs/numbers/runs", json={"n": 1}, headers=ALICE)
        viewer = {"Authorization": "Bearer peek"}
        assert client.get("/api/runs/1", headers=viewer).status_code == 200
        refused = client.post("/api/runs/1/pause", headers=viewer)
        assert refused.status_code == 403 and "may only read" in refused.json()["error"]
        assert client.post("/api/jobs/numbers/runs", json={"n": 2}, headers=viewer
                           ).status_code == 403
        assert len(ledger.runs()) == 1 and ledger.status(1).state != "paused"


def test_the_token_name_is_the_actor_of_its_actions(sqlite_url: str) -> None:
    with client_for(sqlite_url, TOKENS) as (client, ledger):
        client.post("/api/jobs/numbers/runs", json={"n": 1}, headers=ALICE)
        client.post("/api/runs/1/pause", json={"note": "lunch"}, headers=ALICE)
        paused = [e for e in ledger.events(1) if e.kind == "paused"]
        assert [(e.actor, e.detail["note"]) for e in paused] == [("alice", "lunch")]


def test_a_post_from_another_origin_is_refused_and_changes_nothing(sqlite_url: str) -> None:
    with client_for(sqlite_url) as (client, ledger):
        client.post("/api/jobs/numbers/runs", json={"n": 1})
        for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                        {"Origin": "null"}):
            got = client.post("/runs/1/do/pause", data={"back": "/"}, headers=headers,
                              follow_redirects=False)
            assert got.status_code == 403, headers
        assert ledger.status(1).state == "running"
        same = client.post("/runs/1/do/pause", data={"back": "/runs/1"}, follow_redirects=False,
                           headers={"Origin": "http://testserver",
                                    "Sec-Fetch-Site": "same-origin"})
        assert same.status_code == 303 and same.headers["location"] == "/runs/1"
        assert ledger.status(1).state == "paused"


def test_tokens_come_from_the_environment_and_the_token_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKLEDGER_TOKEN", "t-env")
    monkeypatch.setenv("WORKLEDGER_READ_TOKEN", "r-env")
    file = tmp_path / "tokens"
    file.write_text("# operators\nbob:t-bob\n\nci:t-ci:read\n")
    tokens = load_tokens(str(file))
    assert tokens.who("t-env") == Principal("api", True)
    assert tokens.who("r-env") == Principal("read", False)
    assert tokens.who("t-bob") == Principal("bob", True)
    assert tokens.who("t-ci") == Principal("ci", False)
    assert tokens.who("t-") is None and tokens.who("") is None
    file.write_text("bob\n")
    with pytest.raises(BadInput, match="line 1"):
        load_tokens(str(file))
    with pytest.raises(BadInput, match="cannot read token file"):
        load_tokens(str(tmp_path / "missing"))


def test_without_a_token_only_loopback_is_allowed() -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert is_loopback(host)
        check_bind(host, Tokens())
    for host in ("0.0.0.0", "192.0.2.10", "::", "example.org"):
        assert not is_loopback(host)
        with pytest.raises(UsageError, match="WORKLEDGER_TOKEN"):
            check_bind(host, Tokens())
        check_bind(host, TOKENS)


def test_serve_refuses_to_listen_beyond_loopback_without_a_token(sqlite_url: str) -> None:
    done = wl(sqlite_url, "serve", "--host", "0.0.0.0", "--port", "0")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: refusing to listen on 0.0.0.0") and "token" in line


def test_serve_prints_its_address_answers_and_stops_on_sigterm(db_url: str,
                                                               tmp_path: Path) -> None:
    env = cli_env(WORKLEDGER_TOKEN="t0")
    proc = subprocess.Popen([sys.executable, "-m", "workledger.cli", "--db", db_url, "--app",
                             WEB_APP, "serve", "--port", "0"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("workledger serve: http://127.0.0.1:"), line
        url = line.split()[2]
        wait_for(lambda: _answers(url + "healthz"), what="the server")
        got = httpx.post(url + "api/jobs/numbers/runs", json={"n": 3},
                         headers={"Authorization": "Bearer t0"})
        assert got.status_code == 201 and got.json()["total"] == 3
        assert httpx.get(url + "api/runs").status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
