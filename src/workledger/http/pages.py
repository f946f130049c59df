"""The dashboard: server-rendered pages (Jinja2) that htmx refreshes while the tab is visible.

Pages read through the facade like the API. Actions are HTML forms behind a confirmation; each
posts here, runs through the facade with the token's name as the actor, and returns to the page
it came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from workledger.api import ITEM_STATES, RUN_STATES, ItemState, Ledger, RunState, RunStatus
from workledger.errors import BadInput, UsageError, WorkledgerError
from workledger.http import views
from workledger.http.auth import OPEN_ACTOR, Principal, navigated_here
from workledger.http.errors import message_of, status_of
from workledger.http.models import After, RunId, Seq
from workledger.http.sessions import COOKIE, SECURE_COOKIE, cookie_for, session_of, wrong_token

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
templates.env.filters["age"] = views.age
router = APIRouter(include_in_schema=False)
ACTIONS = ("pause", "resume", "cancel", "retry", "resolve", "reconcile")


def _ledger(request: Request) -> Ledger:
    ledger: Ledger = request.app.state.ledger
    return ledger


def _page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    fragment = request.headers.get("hx-request") == "true" and "fragment" in context
    template = context["fragment"] if fragment else name
    context.setdefault("signed", request.app.state.tokens.required)
    return templates.TemplateResponse(request, template, context, status_code=status_code)


def error_page(request: Request, exc: WorkledgerError) -> HTMLResponse:
    return _page(request, "error.html", status_code=status_of(exc),
                 message=message_of(request, exc))


def signin_page(request: Request, status_code: int = 200, message: str = "") -> HTMLResponse:
    return _page(request, "signin.html", status_code=status_code, message=message,
                 signed=False)


@router.get("/", response_class=HTMLResponse)
def runs(request: Request, job: str | None = None, state: str | None = None,
         after: After = None) -> HTMLResponse:
    ledger = _ledger(request)
    try:
        page = ledger.runs_page(job=job or None, state=state or None, limit=50, after=after)
    except WorkledgerError as exc:
        return error_page(request, exc)
    rows = [(st, views.bars(ledger, st)) for st in page.runs]
    return _page(request, "runs.html", fragment="_runs_table.html", rows=rows, next=page.next,
                 job=job or "", state=state or "", states=RUN_STATES, jobs=sorted(ledger.jobs))


def _run_context(ledger: Ledger, st: RunStatus) -> dict[str, Any]:
    expired, waiting = ledger.run_waits(st.run_id)
    return {"st": st, "bars": views.bars(ledger, st), "expired": expired, "waiting": waiting,
            "ages": ledger.pending_ages(st.run_id)}


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run(request: Request, run_id: RunId) -> HTMLResponse:
    ledger = _ledger(request)
    try:
        st = ledger.status(run_id)
        context = _run_context(ledger, st)
        if request.headers.get("hx-request") == "true":
            return _page(request, "_run_live.html", **context)
        context.update(
            unknown=ledger.items_page(run_id, state=ItemState.UNKNOWN, limit=20),
            failed=ledger.items_page(run_id, state=ItemState.FAILED, limit=20),
            failures=ledger.reasons(run_id, ItemState.FAILED),
            skipped=sum(c.get(ItemState.SKIPPED, 0) for c in st.counts.values()),
            paused=st.state == RunState.PAUSED)
    except WorkledgerError as exc:
        return error_page(request, exc)
    return _page(request, "run.html", **context)


@router.get("/runs/{run_id}/skips", response_class=HTMLResponse)
def skips(request: Request, run_id: RunId) -> HTMLResponse:
    """Skips by reason: no index holds skipped items, so this walks the run until it has found
    them; the run page loads it after itself instead of waiting for it."""
    try:
        groups = _ledger(request).reasons(run_id, ItemState.SKIPPED)
    except WorkledgerError as exc:
        return error_page(request, exc)
    return _page(request, "_skips.html", run_id=run_id, skips=groups)


@router.get("/runs/{run_id}/drift", response_class=HTMLResponse)
def drift(request: Request, run_id: RunId) -> HTMLResponse:
    try:
        result = _ledger(request).reconcile(run_id, dry_run=True)
    except WorkledgerError as exc:
        return error_page(request, exc)
    return _page(request, "_drift.html", run_id=run_id, diff=views.differences(result))


@router.get("/runs/{run_id}/items", response_class=HTMLResponse)
def items(request: Request, run_id: RunId, stage: str | None = None, state: str | None = None,
          key: str | None = None, after: After = None) -> HTMLResponse:
    ledger = _ledger(request)
    try:
        st = ledger.status(run_id)
        rows = ledger.items_page(run_id, stage=stage or None, state=state or None,
                                 key=key or None, limit=50, after_id=after or 0)
    except WorkledgerError as exc:
        return error_page(request, exc)
    return _page(request, "items.html", st=st, rows=rows, stage=stage or "", state=state or "",
                 key=key or "", states=ITEM_STATES, stages=list(st.counts),
                 next=rows[-1].id if len(rows) == 50 else None)


@router.get("/runs/{run_id}/items/{stage}/{seq}", response_class=HTMLResponse)
def item(request: Request, run_id: RunId, stage: str, seq: Seq) -> HTMLResponse:
    ledger = _ledger(request)
    try:
        if ledger.item(run_id, stage, seq) is None:
            raise UsageError(f"run {run_id} has no item {seq} in stage {stage!r}")
        story = ledger.history(run_id, stage, seq)
    except WorkledgerError as exc:
        return error_page(request, exc)
    return _page(request, "item.html", run_id=run_id, item=story.item,
                 events=[views.event_row(e) for e in story.events])


@router.get("/schedules", response_class=HTMLResponse)
def schedules(request: Request) -> HTMLResponse:
    """The schedules, and the open runs past or near their deadline (flagged)."""
    ledger = _ledger(request)
    now, rows = ledger.deadlines()
    return _page(request, "schedules.html", schedules=ledger.schedules(),
                 late=[d for d in rows if d.deadline_at <= now],
                 near=[d for d in rows if d.deadline_at > now])


@router.get("/audit", response_class=HTMLResponse)
def audit(request: Request, after: str | None = None) -> HTMLResponse:
    """The findings, 200 a page: the dashboard never builds every finding of a big ledger."""
    try:
        page = _ledger(request).audit_page(limit=200, after=after or None)
    except WorkledgerError as exc:
        return error_page(request, exc)
    return _page(request, "audit.html", findings=page.findings, next=page.next,
                 needs_person=any(f.needs_person for f in page.findings))


async def _form(request: Request) -> dict[str, str]:
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


def _act(ledger: Ledger, run_id: int, action: str, form: dict[str, str], actor: str) -> None:
    note = form.get("note") or None
    stage = form.get("stage") or None
    seq = views.int_or_none(form.get("seq"))
    if action in ("pause", "resume", "cancel"):
        getattr(ledger, action)(run_id, note=note, actor=actor)
    elif action == "retry":
        ledger.retry(run_id, stage=stage, seqs=None if seq is None else [seq], note=note,
                     actor=actor)
    elif action == "reconcile":
        ledger.reconcile(run_id, actor=actor)
    elif stage is None or seq is None:
        raise BadInput("resolve needs the item's stage and seq")
    elif not ledger.resolve(run_id, stage, seq, form.get("as", ""), note=note, actor=actor):
        raise UsageError(f"item {seq} of stage {stage!r} was settled by someone else meanwhile")


@router.post("/runs/{run_id}/do/{action}")
async def act(request: Request, run_id: RunId, action: str) -> Response:
    if action not in ACTIONS:
        return error_page(request, BadInput(f"unknown action {action!r}"))
    form = await _form(request)
    principal = getattr(request.state, "principal", None)
    actor = principal.name if principal is not None else OPEN_ACTOR
    try:
        await run_in_threadpool(_act, _ledger(request), run_id, action, form, actor)
    except WorkledgerError as exc:
        return error_page(request, exc)
    back = form.get("back", "")
    if not back.startswith("/") or back.startswith("//"):
        back = f"/runs/{run_id}"
    return RedirectResponse(back, status_code=303)


@router.get("/signin", response_class=HTMLResponse)
def signin_form(request: Request, code: str | None = None) -> Response:
    """The form; with ``?code=`` (the address ``serve`` prints), a sign-in at once, unless
    another site sent the browser here. A token in the address is never used: the address
    stays in the browser's history, and another site could choose it."""
    if code and navigated_here(request.headers.get("sec-fetch-site")):
        principal = request.app.state.codes.redeem(code)
        if principal is None:
            return signin_page(request, status_code=401, message=(
                "That sign-in address was used already or has expired: sign in with the "
                "token serve printed."))
        return start_session(request, principal)
    return signin_page(request)


@router.post("/signin")
async def signin(request: Request) -> Response:
    """A session for a known token; a wrong one counts against the client, and past its
    allowance is answered after a pause."""
    principal = request.app.state.tokens.who((await _form(request)).get("token", ""))
    if principal is not None:
        return start_session(request, principal)
    slowed = await wrong_token(request)
    if slowed is None:
        return signin_page(request, status_code=401, message="That token is not known here.")
    page = signin_page(request, status_code=429, message=(
        "Too many wrong tokens from this address: each is answered slowly for a while."))
    page.headers["retry-after"] = slowed.headers["retry-after"]
    return page


def start_session(request: Request, principal: Principal) -> Response:
    """A session (its id in the cookie, never the token) in place of the one the browser
    had, and on to the runs."""
    sessions = request.app.state.sessions
    sessions.end(session_of(request))
    response = RedirectResponse("/", status_code=303)
    secure = request.url.scheme == "https"
    response.set_cookie(cookie_for(request), sessions.start(principal), httponly=True,
                        samesite="strict", secure=secure, path="/",
                        max_age=int(sessions.lifetime))
    return response


@router.post("/signout")
def signout(request: Request) -> Response:
    """Ends the session on the server (its cookie is worthless from now on), whoever holds it:
    a read-only user may sign out too."""
    request.app.state.sessions.end(session_of(request))
    response = RedirectResponse("/signin", status_code=303)
    for name in (COOKIE, SECURE_COOKIE):
        if name in request.cookies:
            response.delete_cookie(name, path="/", secure=name == SECURE_COOKIE,
                                   httponly=True, samesite="strict")
    return response
