"""The FastAPI application: the JSON API, the dashboard, ``/metrics`` and ``/healthz``.

Everything goes through one :class:`~workledger.api.Ledger` (the facade), as the CLI does.
A middleware checks who is asking (``auth.py``) before any route runs.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from workledger.api import Ledger
from workledger.errors import WorkledgerError
from workledger.http import errors, pages
from workledger.http.api_routes import router as api_router
from workledger.http.auth import COOKIE, OPEN_ACTOR, Principal, Tokens, same_origin
from workledger.http.metrics import registry_for

HERE = Path(__file__).parent
OPEN = Principal(OPEN_ACTOR, can_write=True)
NO_TOKEN_NEEDED = ("/healthz", "/signin")


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(COOKIE)


def wants_html(path: str) -> bool:
    return not path.startswith(("/api/", "/api", "/metrics", "/openapi.json", "/docs"))


def refusal(request: Request) -> Response | None:
    """Same origin for a browser's POST, then a known token (unless none is configured),
    then write access for anything but a read: the response that refuses, or None."""
    path = request.url.path
    if request.method not in ("GET", "HEAD", "OPTIONS") and not same_origin(
            request.headers.get("origin"), request.headers.get("sec-fetch-site"),
            request.headers.get("host")):
        return errors.error_json(403, "refused: a POST from another origin")
    if path in NO_TOKEN_NEEDED or path.startswith("/static/"):
        return None
    tokens: Tokens = request.app.state.tokens
    principal = tokens.who(_token(request)) if tokens.required else OPEN
    if principal is None:
        if wants_html(path):
            return pages.signin_page(request, status_code=401)
        return errors.error_json(401, "a token is needed: send Authorization: Bearer <token>")
    if request.method not in ("GET", "HEAD") and not principal.can_write:
        return errors.error_json(403, f"token {principal.name!r} may only read")
    request.state.principal = principal
    return None


class Guard:
    """Checks every HTTP request before any route (a plain ASGI middleware: cheaper per
    request than starlette's BaseHTTPMiddleware, which matters under many clients)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = refusal(Request(scope))
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(ledger: Ledger, tokens: Tokens | None = None,
               export_dir: Path | None = None) -> FastAPI:
    """The application over ``ledger``; ``tokens``: who may use it (none: anyone, for a
    server on loopback only); ``export_dir``: where ``POST /api/prune`` may write exports."""
    app = FastAPI(title="workledger", version="0.1.0",
                  description="A run's truth from the ledger: runs, items, audit, metrics.",
                  docs_url=None, redoc_url=None)
    app.state.ledger = ledger
    app.state.tokens = tokens or Tokens()
    app.state.export_dir = export_dir
    app.state.where = ledger.where
    app.state.registry = registry_for(ledger)
    app.add_middleware(Guard)
    app.add_exception_handler(WorkledgerError, errors.on_workledger_error)
    app.add_exception_handler(RequestValidationError, errors.on_validation_error)
    app.add_exception_handler(HTTPException, errors.on_http_error)
    app.add_exception_handler(Exception, errors.on_any_error)
    app.include_router(api_router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_api_route("/healthz", healthz, methods=["GET"], include_in_schema=True,
                      responses={503: {"model": errors.ErrorBody}})
    app.add_api_route("/metrics", metrics, methods=["GET"], response_class=Response,
                      responses={200: {"content": {"text/plain": {}}},
                                 **errors.ERROR_RESPONSES})
    return app


def healthz(request: Request) -> JSONResponse:
    """200 when the database answers, 503 otherwise (no token needed)."""
    try:
        request.app.state.ledger.ping()
    except WorkledgerError:
        return errors.error_json(503, errors.UNAVAILABLE)
    return JSONResponse({"status": "ok"})


def metrics(request: Request) -> Response:
    """Prometheus text format, read from the ledger at scrape time."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
