"""The schemas of the API's bodies, for ``/openapi.json``. The bodies themselves are built by
``workledger.shapes`` (the CLI's ``--json``); these only describe them."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_type_hints

from fastapi import Path, Query
from pydantic import BaseModel, Field, create_model

from workledger.api import ItemRow, RunStatus

# Ids and seqs are 64-bit in both databases: larger numbers are bad input, not a driver error.
MAX_ID = 2**63 - 1
RunId = Annotated[int, Path(ge=0, le=MAX_ID)]
Seq = Annotated[int, Path(ge=-MAX_ID, le=MAX_ID)]
After = Annotated[int | None, Query(ge=0, le=MAX_ID,
                                    description="the cursor from the last page's next")]


def body_of(shape: type[Any], name: str, doc: str) -> type[BaseModel]:
    """The schema of a body made from a dataclass's fields, in their order, each required (a
    body always carries every field): the dataclass is the one definition of the shape, so a
    new field is one edit there, in the body (shapes.py) and in this schema alike."""
    hints = get_type_hints(shape)
    spec: dict[str, Any] = {f.name: (hints[f.name], ...) for f in fields(shape)}
    return create_model(name, __doc__=doc, __module__=__name__, **spec)


if TYPE_CHECKING:  # made at import from the dataclasses; to a type checker, models
    StatusBody = BaseModel
    ItemBody = BaseModel
else:
    StatusBody = body_of(RunStatus, "StatusBody",
                         "A run's status: exactly ``workledger status --json``.")
    ItemBody = body_of(ItemRow, "ItemBody", "An item: the fields of ``workledger items --json``.")


class SubmissionBody(StatusBody):
    """``workledger submit --json``."""

    created: bool


class RunsBody(BaseModel):
    runs: list[StatusBody]
    next: int | None = Field(description="the cursor of the next page (after=...), or null")


class ItemsBody(BaseModel):
    items: list[ItemBody]
    next: int | None = Field(description="the cursor of the next page (after=...), or null")


class EventBody(BaseModel):
    id: int
    run_id: int
    item_id: int | None
    at: str
    kind: str
    lease_token: int | None
    actor: str | None
    detail: Any


class HistoryBody(BaseModel):
    """``workledger history --json``."""

    item: ItemBody
    events: list[EventBody]


class FindingBody(BaseModel):
    kind: str
    run_id: int
    since: str
    path: str
    needs_person: bool
    stage: str | None
    seq: int | None
    detail: str | None
    reviewed: str | None = Field(default=None, description="why it does not alert, if so")


class AuditBody(BaseModel):
    findings: list[FindingBody]
    needs_person: bool = Field(description="whether a finding of this page needs a person")
    next: str | None = Field(description="the cursor of the next page (after=...), or null")


class Difference(BaseModel):
    stored: Any
    ledger: Any


class ReconcileBody(BaseModel):
    """One entry of ``workledger reconcile --json``."""

    run_id: int
    differences: dict[str, Difference]
    repaired: bool


class PruneBody(BaseModel):
    dry_run: bool
    runs: list[int]
    items: int
    events: int
    resumed: list[int]
    kept: list[int]
    closing: list[int]


# -- requests ------------------------------------------------------------------------------------


class NoteRequest(BaseModel):
    note: str | None = Field(default=None, description="why: recorded with the action")


class RetryRequest(NoteRequest):
    stage: str | None = None
    items: list[Annotated[int, Field(ge=-MAX_ID, le=MAX_ID)]] | None = Field(
        default=None, description="seqs; default every failed item")


class AckRequest(BaseModel):
    note: str = Field(min_length=1, description="what was reviewed and decided")
    stage: str | None = None
    item: Annotated[int, Field(ge=0, le=MAX_ID)] | None = Field(
        default=None, description="one item's seq; default every failed item (of the stage)")


class AckBody(BaseModel):
    run_id: int
    acknowledged: int


class ReconcileRequest(BaseModel):
    dry_run: bool = False


class ResolveRequest(NoteRequest):
    as_state: Literal["processed", "failed", "pending"] = Field(alias="as")


class PruneRequest(BaseModel):
    finished_before: str = Field(description="a duration: runs finished longer ago, e.g. 30d")
    job: str | None = None
    dry_run: bool = False
    export: str | None = Field(default=None, description="a file name in serve's --export-dir")


class ScheduleBody(BaseModel):
    """One entry of ``workledger schedules --json`` (times ISO 8601 in UTC)."""

    name: str
    job: str
    spec: str
    tz: str
    catch_up: str | None = Field(description="null: the loaded app does not declare it")
    overlap: str | None
    declared: bool
    recorded: bool
    paused: bool
    paused_at: str | None
    paused_by: str | None
    next_fire_at: str | None
    last_fire_at: str | None
    last_run_id: int | None
    last_run_state: str | None
    waiting_fire_at: str | None
    missed: int


class SchedulesBody(BaseModel):
    schedules: list[ScheduleBody]


class FiredBody(BaseModel):
    """A firing asked for by hand: ``schedule fire --json``, one entry of ``backfill --json``."""

    schedule: str
    fire_at: str
    state: str | None = Field(description="submitted, skipped, waiting, none, recorded, failed; "
                                          "null in a dry run")
    run_id: int | None
    created: bool
    was: str | None


class FiringsBody(BaseModel):
    firings: list[FiredBody]


class BackfillRequest(BaseModel):
    start: str = Field(alias="from", description="ISO 8601 with its zone; included")
    end: str = Field(alias="to", description="ISO 8601 with its zone; included")
    dry_run: bool = False
