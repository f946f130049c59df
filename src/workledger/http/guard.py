"""What every request passes before any route: its Host, its origin, its credential, the size
of its body; and the security headers every response carries.

A plain ASGI middleware (cheaper per request than starlette's BaseHTTPMiddleware, which
matters under many clients). The body is read here, up to its route's limit, before the route
sees it, and only once the credential is known good (the sign-in form's few KiB excepted): a
client without a token can never make the server hold more than that.
"""

from __future__ import annotations

import asyncio
import re

from fastapi import Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workledger.api import limits
from workledger.http import errors, pages
from workledger.http.auth import OPEN_ACTOR, Principal, Tokens, same_origin
from workledger.http.sessions import Sessions, session_of, wrong_token

OPEN = Principal(OPEN_ACTOR, can_write=True)
NO_TOKEN_NEEDED = ("/healthz", "/signin", "/signout")
KIB = 1024
SIGN_IN_SECONDS = 2.0  # to send the few bytes of a sign-in form: the one body read before a
# credential, so the one a client without a token could trickle to hold a connection
SUBMISSION = re.compile(r"/api/jobs/[^/]+/runs")
ENVELOPE = 64 * KIB  # JSON escapes and whitespace around a payload at its limit
HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
     b"img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; "
     b"frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


SIGN_IN = ("/signin", "/signout")


def body_limit(path: str) -> int:
    """The most a request to ``path`` may send: a token, an action's form, a submission."""
    if path in SIGN_IN:
        return 4 * KIB
    if SUBMISSION.fullmatch(path):
        return limits.DOCUMENT_BYTES + ENVELOPE
    return 64 * KIB


def wants_html(path: str) -> bool:
    return not path.startswith(("/api/", "/api", "/metrics", "/openapi.json", "/docs"))


def bearer_of(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def principal_of(request: Request) -> Principal | Response | None:
    """Who is asking: a bearer token, else a session cookie; None for neither. A wrong token
    counts against the client, and past its allowance is answered (429) after a pause."""
    tokens: Tokens = request.app.state.tokens
    if not tokens.required:
        return OPEN
    token = bearer_of(request)
    if token is None:
        sessions: Sessions = request.app.state.sessions
        return sessions.who(session_of(request))
    principal = tokens.who(token)
    if principal is None:
        return await wrong_token(request)
    return principal


def route_path(scope: Scope) -> str:
    """The path the router routes: the scope's own, less the root path a mount gives it (as
    starlette's router takes it). Never ``request.url``, which starlette before 1.0.1 rebuilt
    from the Host header."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("", "/"):
        return path[len(root):]
    return path


async def refusal(request: Request) -> Response | None:
    """The Host, then same origin for a browser's POST, then a known credential (unless none
    is configured), then write access for anything but a read: the response that refuses, or
    None."""
    hosts = request.app.state.hosts
    host = request.headers.get("host")
    if not hosts.allows(host):
        return errors.error_json(400, f"refused: Host {host!r} is not an address of this "
                                      "server (serve --allowed-host NAME adds one)")
    path = route_path(request.scope)
    server = request.scope.get("server")
    if request.method not in ("GET", "HEAD", "OPTIONS") and not same_origin(
            request.headers.get("origin"), request.headers.get("sec-fetch-site"), hosts, host,
            server[0] if server else None):
        return errors.error_json(403, "refused: a POST from another origin")
    if path in NO_TOKEN_NEEDED or path.startswith("/static/"):
        return None
    principal = await principal_of(request)
    if isinstance(principal, Response):
        return principal
    if principal is None:
        if wants_html(path):
            return pages.signin_page(request, status_code=401)
        return errors.error_json(401, "a token is needed: send Authorization: Bearer <token>")
    if request.method not in ("GET", "HEAD") and not principal.can_write:
        return errors.error_json(403, f"token {principal.name!r} may only read")
    request.state.principal = principal
    return None


class TooLarge(Exception):
    pass


async def read_body(receive: Receive, limit: int, declared: int | None) -> bytes | None:
    """The whole body, at most ``limit`` bytes (TooLarge past it, before reading on when the
    client declared its length); None when the client hung up first."""
    if declared is not None and declared > limit:
        raise TooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the route the body already read, then waits as the server's."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def declared_length(request: Request) -> int | None:
    text = request.headers.get("content-length")
    if text is None:
        return None
    return int(text) if text.isdigit() and len(text) < 20 else 1 << 62


class Guard:
    """Checks every HTTP request before any route, and adds the security headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = with_headers(send)
        request = Request(scope)
        refused = await refusal(request)
        if refused is not None:
            await refused(scope, receive, send)
            return
        if request.method in ("POST", "PUT", "PATCH", "DELETE"):
            path = route_path(scope)
            limit = body_limit(path)
            try:
                async with asyncio.timeout(SIGN_IN_SECONDS if path in SIGN_IN else None):
                    body = await read_body(receive, limit, declared_length(request))
            except TooLarge:
                await closing(errors.error_json(413, f"the body is over {limit:,} bytes"),
                              scope, receive, send)
                return
            except TimeoutError:
                await closing(errors.error_json(408, f"the body did not arrive within "
                                                     f"{SIGN_IN_SECONDS:g} s"),
                              scope, receive, send)
                return
            if body is None:  # the client hung up: nobody to answer, nothing to log
                return
            receive = replay(body, receive)
        await self.app(scope, receive, send)


async def closing(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer and close: the rest of the body is not read."""
    response.headers["connection"] = "close"
    await response(scope, receive, send)


def with_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *HEADERS]}
        await send(message)

    return sending

