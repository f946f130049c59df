"""Signing in to a real ``workledger serve`` on loopback: the one-time code serve prints, a
web page that tries to sign its visitor in or out of the server (login CSRF, locking the
operator out with wrong tokens), and wrong tokens, which are slowed down while a right one is
never refused, whoever else shares the client's address."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from serve_support import Served, raw, served
from web_support import cli_env

from workledger.http.sessions import FAILURES_ALLOWED, PAUSE

pytestmark = pytest.mark.integration
RIGHT = "right-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"
# what a browser sends for an <img> or a navigation that a page of another site starts
CROSS_SITE = ({"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors",
               "Sec-Fetch-Dest": "image"},
              {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate",
               "Sec-Fetch-Dest": "document"},
              {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate"})
TYPED = {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}


def _signed_in(server: Served, cookies: httpx.Cookies) -> bool:
    return httpx.get(server.url, cookies=cookies, timeout=10).status_code == 200


def test_a_server_without_a_token_prints_a_one_time_sign_in_code_apart_from_its_token(
        sqlite_url: str, tmp_path: Path) -> None:
    with served(sqlite_url, cwd=tmp_path) as server:
        assert server.token and len(server.token) >= 24 and server.code
        assert server.token not in server.sign_in  # the address goes to the browser's history
        assert server.get("api/runs").status_code == 401  # another user of this machine
        assert server.get("api/runs", headers=server.bearer()).status_code == 200
        with httpx.Client() as browser:
            signed = browser.get(server.sign_in, headers=TYPED, follow_redirects=False)
            assert signed.status_code == 303, signed.text
            cookie = signed.headers["set-cookie"]
            assert server.token not in cookie and server.code not in cookie
            assert browser.get(server.url).status_code == 200
        again = server.get(f"signin?code={server.code}", headers=TYPED, follow_redirects=False)
        assert again.status_code == 401 and "set-cookie" not in again.headers  # once only
        assert "token" in again.text
        # a token in a sign-in address signs no one in: the form is shown instead
        url_token = server.get(f"signin?token={server.token}", headers=TYPED,
                               follow_redirects=False)
        assert url_token.status_code == 200 and "set-cookie" not in url_token.headers
        assert 'name="token"' in url_token.text
    with served(sqlite_url, "--no-token", cwd=tmp_path) as open_server:  # the old way, asked for
        assert open_server.token is None and open_server.code is None
        assert open_server.get("api/runs").status_code == 200


def test_a_cross_site_sign_in_attempt_neither_counts_nor_signs_in(
        sqlite_url: str, tmp_path: Path) -> None:
    """A page of another site can make the browser fetch /signin?... (an <img>, a
    navigation) but cannot set headers: with Sec-Fetch-Site other than none or same-origin,
    the form is shown, nothing is counted, no session starts and no code is spent."""
    with served(sqlite_url, cwd=tmp_path) as server:
        assert server.code is not None
        for n in range(3 * FAILURES_ALLOWED):
            for headers in CROSS_SITE:
                lure = server.get(f"signin?token=wrong-{n}", headers=headers,
                                  follow_redirects=False)
                assert lure.status_code == 200 and "set-cookie" not in lure.headers, n
        for headers in CROSS_SITE:  # a visitor signed into a session the page chose
            fixed = server.get(f"signin?code={server.code}", headers=headers,
                               follow_redirects=False)
            assert fixed.status_code == 200 and "set-cookie" not in fixed.headers
        assert server.get("api/runs", headers=server.bearer()).status_code == 200
        signed = httpx.get(server.sign_in, headers=TYPED, follow_redirects=False, timeout=10)
        assert signed.status_code == 303  # the code is still the operator's
    env = cli_env(WORKLEDGER_TOKEN=RIGHT, WORKLEDGER_READ_TOKEN=READ)
    with served(sqlite_url, cwd=tmp_path, env=env) as server:
        for headers in CROSS_SITE:  # login CSRF with a token the page's author holds
            csrf = server.get(f"signin?token={READ}", headers=headers, follow_redirects=False)
            assert csrf.status_code == 200 and "set-cookie" not in csrf.headers
            posted = server.post("signin", data={"token": READ}, follow_redirects=False,
                                 headers={**headers, "Origin": "http://evil.example"})
            assert posted.status_code == 403 and "set-cookie" not in posted.headers


def test_wrong_tokens_are_slowed_down_and_a_right_token_is_never_refused(
        sqlite_url: str, tmp_path: Path) -> None:
    """On loopback every client is 127.0.0.1: anyone on the machine can send wrong tokens
    from the operator's address. Past the allowance each wrong one is answered 429 after a
    pause; the right bearer, the form with the right token and the printed code still work."""
    with served(sqlite_url, cwd=tmp_path) as server:
        answers = [server.get("api/runs", headers=server.bearer(f"guess-{n}")).status_code
                   for n in range(FAILURES_ALLOWED)]
        assert answers == [401] * FAILURES_ALLOWED
        started = time.monotonic()
        for n in range(3):
            slowed = server.get("api/runs", headers=server.bearer(f"more-{n}"))
            assert slowed.status_code == 429 and int(slowed.headers["retry-after"]) >= 1
        assert time.monotonic() - started >= 3 * PAUSE  # each answered after its pause
        form = server.post("signin", data={"token": "wrong"}, follow_redirects=False)
        assert form.status_code == 429  # the form counts with the bearer
        assert server.get("api/runs", headers=server.bearer()).status_code == 200
        signed = server.post("signin", data={"token": server.token}, follow_redirects=False)
        assert signed.status_code == 303 and "set-cookie" in signed.headers
        by_code = httpx.get(server.sign_in, headers=TYPED, follow_redirects=False, timeout=10)
        assert by_code.status_code == 303
        spoofed = server.get("api/runs", headers={**server.bearer("wrong"),
                                                  "X-Forwarded-For": "192.0.2.99"})
        assert spoofed.status_code == 429  # no proxy is trusted: the header changes nothing
        other = raw(server, b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                    b"Authorization: Bearer wrong\r\nConnection: close\r\n\r\n"
                    % server.port, source="127.0.0.2")
        assert other.startswith(b"HTTP/1.1 401"), other[:80]  # counted per client address
