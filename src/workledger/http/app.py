"""The FastAPI application: the JSON API, the dashboard, ``/metrics`` and ``/healthz``.

Everything goes through one :class:`~workledger.api.Ledger` (the facade), as the CLI does.
A middleware (``guard.py``) checks the Host, the origin, who is asking (``auth.py``,
``sessions.py``) and the body's size before any route runs.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from workledger.api import Ledger
from workledger.errors import WorkledgerError
from workledger.http import errors, pages
from workledger.http.api_routes import router as api_router
from workledger.http.auth import Hosts, Tokens
from workledger.http.guard import Guard
from workledger.http.metrics import registry_for
from workledger.http.sessions import Sessions, SignInCodes, Throttle

HERE = Path(__file__).parent


def create_app(ledger: Ledger, tokens: Tokens | None = None,
               export_dir: Path | None = None, hosts: Hosts | None = None) -> FastAPI:
    """The application over ``ledger``; ``tokens``: who may use it (none: anyone, for a
    server on loopback only); ``export_dir``: where ``POST /api/prune`` may write exports;
    ``hosts``: the names requests may give in Host and Origin (none: any Host, for a server
    that checks it before this application)."""
    app = FastAPI(title="workledger", version="0.1.0",
                  description="A run's truth from the ledger: runs, items, audit, metrics.",
                  docs_url=None, redoc_url=None)
    app.state.ledger = ledger
    app.state.tokens = tokens or Tokens()
    app.state.export_dir = export_dir
    app.state.hosts = hosts or Hosts(anywhere=True)
    app.state.sessions = Sessions()
    app.state.throttle = Throttle()
    app.state.codes = SignInCodes()
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
