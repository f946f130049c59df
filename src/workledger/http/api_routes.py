"""The JSON API, every route under ``/api``: the facade's calls, bodies from ``shapes``."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request
from fastapi.responses import JSONResponse

from workledger.api import (
    Ledger,
    open_private,
    parse_deadline,
    parse_duration,
    parse_priority,
    since_time,
)
from workledger.errors import BadInput, DecompositionFailed, UsageError
from workledger.http.auth import OPEN_ACTOR
from workledger.http.errors import ERROR_RESPONSES, error_json
from workledger.http.models import (
    AckBody,
    AckRequest,
    After,
    AuditBody,
    BackfillRequest,
    FiredBody,
    FiringsBody,
    HistoryBody,
    ItemsBody,
    NoteRequest,
    PruneBody,
    PruneRequest,
    ReconcileBody,
    ReconcileRequest,
    ResolveRequest,
    RetryRequest,
    RunId,
    RunsBody,
    SchedulesBody,
    Seq,
    StatusBody,
    SubmissionBody,
)
from workledger.shapes import (
    finding_dict,
    fired_dict,
    history_dict,
    item_dict,
    reconcile_dict,
    schedule_dict,
    status_dict,
    submission_dict,
)

router = APIRouter(prefix="/api", responses=ERROR_RESPONSES)
NAME_BYTES = 255  # the longest file name Linux, macOS and Windows file systems take
Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many")]


def reply(value: Any, status_code: int = 200) -> JSONResponse:
    """The body as built by ``shapes``: returned as a response, so FastAPI does not validate it
    again against the route's model (the models describe; ``shapes`` builds)."""
    return JSONResponse(value, status_code=status_code)


def ledger_of(request: Request) -> Ledger:
    ledger: Ledger = request.app.state.ledger
    return ledger


def actor_of(request: Request) -> str:
    principal = getattr(request.state, "principal", None)
    return principal.name if principal is not None else OPEN_ACTOR


@router.get("/runs", response_model=RunsBody)
def list_runs(request: Request, job: str | None = None, state: str | None = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 100, after: After = None
              ) -> JSONResponse:
    page = ledger_of(request).runs_page(job=job, state=state, limit=limit, after=after)
    return reply({"runs": [status_dict(st) for st in page.runs], "next": page.next})


@router.get("/runs/{run_id}", response_model=StatusBody)
def get_run(request: Request, run_id: RunId) -> JSONResponse:
    return reply(status_dict(ledger_of(request).status(run_id)))


@router.get("/runs/{run_id}/items", response_model=ItemsBody)
def list_items(request: Request, run_id: RunId, stage: str | None = None,
               state: str | None = None, key: str | None = None, limit: Limit = 100,
               after: After = None) -> JSONResponse:
    rows = ledger_of(request).items_page(run_id, stage=stage, state=state, key=key,
                                         limit=limit, after_id=after or 0)
    return reply({"items": [item_dict(r) for r in rows],
                 "next": rows[-1].id if len(rows) == limit else None})


@router.get("/runs/{run_id}/items/{stage}/{seq}", response_model=HistoryBody)
def get_item(request: Request, run_id: RunId, stage: str, seq: Seq) -> Any:
    ledger = ledger_of(request)
    if ledger.item(run_id, stage, seq) is None:
        return error_json(404, f"run {run_id} has no item {seq} in stage {stage!r}")
    return reply(history_dict(ledger.history(run_id, stage, seq)))


@router.post("/jobs/{job}/runs", status_code=201, response_model=SubmissionBody,
             responses={200: {"model": SubmissionBody,
                              "description": "the key names an existing run: its real state"}})
def submit(request: Request, job: str,
           payload: Annotated[dict[str, Any] | None, Body()] = None,
           idempotency_key: Annotated[str | None, Header()] = None,
           deadline: Annotated[str | None, Query(
               description="a duration after submission (2h) or an ISO 8601 time with its "
                           "zone by which the run should be complete")] = None,
           priority: Annotated[str | None, Query(
               description="a whole number from -1000 to 1000 (default 0): a claimable item "
                           "of a higher-priority run is claimed before any of a lower one")
           ] = None,
           tenant: Annotated[str | None, Query(
               description="the customer the run is for: among runs of one priority, claims "
                           "rotate across tenants by their weights (default: the default "
                           "tenant)")] = None) -> Any:
    ledger = ledger_of(request)
    ledger.job_named(job)
    rank = parse_priority(priority)
    try:
        sub = ledger.submit(job, payload or {}, key=idempotency_key or None,
                            deadline=parse_deadline(deadline), priority=rank, tenant=tenant)
    except DecompositionFailed as exc:  # recorded, nothing dispatched: its status says why
        if exc.status is None:
            raise
        return reply(submission_dict(exc.run_id, True, exc.status), 201)
    return reply(submission_dict(sub.run_id, sub.created, sub.status),
                 201 if sub.created else 200)


def _status(request: Request, run_id: int) -> JSONResponse:
    return reply(status_dict(ledger_of(request).status(run_id)))


@router.post("/runs/{run_id}/pause", response_model=StatusBody)
def pause(request: Request, run_id: RunId, body: NoteRequest | None = None
          ) -> JSONResponse:
    ledger_of(request).pause(run_id, note=(body or NoteRequest()).note, actor=actor_of(request))
    return _status(request, run_id)


@router.post("/runs/{run_id}/resume", response_model=StatusBody)
def resume(request: Request, run_id: RunId, body: NoteRequest | None = None
           ) -> JSONResponse:
    ledger_of(request).resume(run_id, note=(body or NoteRequest()).note, actor=actor_of(request))
    return _status(request, run_id)


@router.post("/runs/{run_id}/cancel", response_model=StatusBody)
def cancel(request: Request, run_id: RunId, body: NoteRequest | None = None
           ) -> JSONResponse:
    ledger_of(request).cancel(run_id, note=(body or NoteRequest()).note, actor=actor_of(request))
    return _status(request, run_id)


@router.post("/runs/{run_id}/retry", response_model=StatusBody)
def retry(request: Request, run_id: RunId, body: RetryRequest | None = None
          ) -> JSONResponse:
    b = body or RetryRequest()
    ledger_of(request).retry(run_id, stage=b.stage, seqs=b.items, note=b.note,
                             actor=actor_of(request))
    return _status(request, run_id)


@router.post("/runs/{run_id}/reconcile", response_model=ReconcileBody)
def reconcile(request: Request, run_id: RunId, body: ReconcileRequest | None = None
              ) -> JSONResponse:
    dry_run = (body or ReconcileRequest()).dry_run
    result = ledger_of(request).reconcile(run_id, dry_run=dry_run, actor=actor_of(request))
    return reply(reconcile_dict(run_id, result))


@router.post("/runs/{run_id}/items/{stage}/{seq}/resolve", response_model=StatusBody)
def resolve(request: Request, run_id: RunId, stage: str, seq: Seq, body: ResolveRequest
            ) -> JSONResponse:
    ledger = ledger_of(request)
    if ledger.item(run_id, stage, seq) is None:
        raise UsageError(f"run {run_id} has no item {seq} in stage {stage!r}")
    if not ledger.resolve(run_id, stage, seq, body.as_state, note=body.note,
                          actor=actor_of(request)):
        raise UsageError(f"item {seq} of stage {stage!r} was settled by someone else meanwhile")
    return _status(request, run_id)


@router.post("/runs/{run_id}/ack", response_model=AckBody)
def ack(request: Request, run_id: RunId, body: AckRequest) -> JSONResponse:
    n = ledger_of(request).ack(run_id, note=body.note, stage=body.stage, seq=body.item,
                               actor=actor_of(request))
    return reply({"run_id": run_id, "acknowledged": n})


@router.get("/schedules", response_model=SchedulesBody)
def list_schedules(request: Request) -> JSONResponse:
    return reply({"schedules": [schedule_dict(s) for s in ledger_of(request).schedules()]})


@router.get("/schedules/{name}/firings", response_model=FiringsBody)
def list_firings(request: Request, name: str, limit: Limit = 50) -> JSONResponse:
    found = ledger_of(request).firings(name, limit)
    return reply({"firings": [
        {"schedule": f.schedule, "fire_at": f.fire_at.isoformat(), "state": f.state,
         "run_id": f.run_id, "created": False, "was": f.error} for f in found]})


@router.post("/schedules/{name}/pause", response_model=SchedulesBody)
def pause_schedule(request: Request, name: str) -> JSONResponse:
    ledger_of(request).schedule_pause(name, actor=actor_of(request))
    return list_schedules(request)


@router.post("/schedules/{name}/resume", response_model=SchedulesBody)
def resume_schedule(request: Request, name: str) -> JSONResponse:
    ledger_of(request).schedule_resume(name, actor=actor_of(request))
    return list_schedules(request)


@router.post("/schedules/{name}/fire", response_model=FiredBody)
def fire_schedule(request: Request, name: str) -> JSONResponse:
    when, fired = ledger_of(request).schedule_fire(name, actor=actor_of(request))
    return reply(fired_dict(name, when, fired))


@router.post("/schedules/{name}/backfill", response_model=FiringsBody)
def backfill_schedule(request: Request, name: str, body: BackfillRequest) -> JSONResponse:
    times = []
    for what, text in (("from", body.start), ("to", body.end)):
        try:
            times.append(datetime.fromisoformat(text))
        except ValueError:
            raise BadInput(f"backfill: {what} {text!r} is not an ISO 8601 time") from None
    done = ledger_of(request).schedule_backfill(name, times[0], times[1], dry_run=body.dry_run,
                                                actor=actor_of(request))
    return reply({"firings": [fired_dict(name, t, f) for t, f in done]})


@router.get("/audit", response_model=AuditBody)
def audit(request: Request,
          run: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
          job: str | None = None,
          since: Annotated[str | None, Query(description="an age (24h, 7d) or ISO time")] = None,
          limit: Limit = 1000,
          after: Annotated[str | None, Query(pattern=r"^[0-9]\.[0-9]{1,19}$",
                                             description="the last page's next")] = None,
          ) -> JSONResponse:
    cutoff = since_time(since) if since is not None else None
    page = ledger_of(request).audit_page(run_id=run, job=job, since=cutoff, limit=limit,
                                         after=after)
    return reply({"findings": [finding_dict(f) for f in page.findings],
                  "needs_person": any(f.needs_person for f in page.findings),
                  "next": page.next})


@router.post("/prune", response_model=PruneBody)
def prune(request: Request, params: PruneRequest) -> JSONResponse:
    older_than = parse_duration(params.finished_before)
    ledger = ledger_of(request)
    if params.export is None:
        return reply(ledger.prune(older_than, job=params.job, dry_run=params.dry_run).to_dict())
    with export_file(request, params.export) as out:
        return reply(ledger.prune(older_than, job=params.job, dry_run=params.dry_run,
                                 export=out).to_dict())


def export_file(request: Request, name: str) -> Any:
    """A file in serve's ``--export-dir``, opened to append (a name, never a path), created
    readable by its owner only: it holds payloads and results."""
    folder: Path | None = request.app.state.export_dir
    if folder is None:
        raise BadInput("export needs the server started with --export-dir")
    if not name or "/" in name or "\\" in name or name.startswith(".") or "\x00" in name:
        raise BadInput("export must be a plain file name (no folder)")
    if len(name.encode("utf-8", "surrogatepass")) > NAME_BYTES:
        raise BadInput(f"export: a file name of at most {NAME_BYTES} bytes")
    try:
        return open_private(folder / name)
    except OSError as exc:
        raise BadInput(f"export: cannot write {name}: {exc.strerror or exc}") from exc

