"""Every error over HTTP is ``{"error": "<one line>"}`` with a status that says whose it is.

``UnknownRun``/``UnknownJob``/``UnknownSchedule`` 404, ``PayloadMismatch`` 422, ``BadInput``, a
malformed request and a Host that is not the server's 400, a body over its route's limit 413,
too many wrong tokens 429, any other ``UsageError`` (a refusal) 409, ``DatabaseUnavailable``
503; anything else 500 with a generic message, never a traceback or a database URL.
"""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from workledger.errors import (
    BadInput,
    DatabaseUnavailable,
    PayloadMismatch,
    UnknownJob,
    UnknownRun,
    UnknownSchedule,
    UsageError,
    WorkledgerError,
)

log = logging.getLogger("workledger.http")

INTERNAL = "internal error: the server's log has the details"
UNAVAILABLE = "the database does not answer: the server's log has the details"
STATUS_OF: tuple[tuple[type[WorkledgerError], int], ...] = (
    (UnknownRun, 404), (UnknownJob, 404), (UnknownSchedule, 404), (PayloadMismatch, 422),
    (BadInput, 400), (UsageError, 409), (DatabaseUnavailable, 503))


class ErrorBody(BaseModel):
    """Every error response: one line saying what went wrong."""

    error: str


def one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def status_of(exc: WorkledgerError) -> int:
    for cls, code in STATUS_OF:
        if isinstance(exc, cls):
            return code
    return 500


def message_of(request: Request, exc: WorkledgerError) -> str:
    """The error's line without the ledger's URL (masked or not, it is not the client's)."""
    if status_of(exc) == 500:
        return INTERNAL
    if status_of(exc) == 503:  # where the database is, and why, is for the server's log
        return UNAVAILABLE
    where = getattr(request.app.state, "where", "")
    text = one_line(str(exc) or type(exc).__name__)
    return text.replace(f" in {where}", "") if where else text


def error_json(code: int, message: str) -> JSONResponse:
    return JSONResponse({"error": one_line(message)}, status_code=code)


def validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "malformed request"
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "the body is not valid JSON"
    if tuple(first.get("loc", ())) == ("body",) and first.get("type") == "dict_type":
        return "the body must be a JSON object"
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "request"
    return f"{where}: {first.get('msg', 'invalid')}"


async def on_workledger_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, WorkledgerError)
    code = status_of(exc)
    if code in (500, 503):
        log.error("request %s %s failed: %s", request.method, request.url.path, exc,
                  exc_info=exc if code == 500 else None)
    return error_json(code, message_of(request, exc))


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_json(400, validation_message(exc))


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": one_line(str(exc.detail))}, status_code=exc.status_code,
                        headers=exc.headers)


async def on_any_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("request %s %s failed", request.method, request.url.path, exc_info=exc)
    return error_json(500, INTERNAL)


ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorBody, "description": text} for code, text in (
        (400, "bad input: an unknown filter, a negative limit, malformed JSON; a Host that "
              "is not this server's"),
        (401, "no token, or an unknown one"), (403, "a read-only token, or another origin"),
        (404, "no such run, job, item or schedule"), (409, "refused in the run's present state"),
        (413, "the body is over the route's limit"),
        (422, "the idempotency key names a run with another payload"),
        (429, "a wrong token from a client that sent too many: answered after a pause; "
              "Retry-After says when they are answered at once again"),
        (500, "an internal error"), (503, "the database does not answer"))}
