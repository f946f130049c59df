"""One JSON shape per thing: what ``--json`` prints and what the HTTP API answers.

The CLI and the HTTP layer both build their bodies here, so the two cannot drift: a run's
status, a submission, an item, an item's history, an audit finding, a reconcile result.
``tests/test_http_api.py`` checks that the API's bodies equal the CLI's output.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any

from workledger.api import RunStatus

if TYPE_CHECKING:
    from datetime import datetime

    from workledger._runtime.repair.operations import History
    from workledger.api import Finding, Fired, ScheduleStatus
    from workledger.storage.port import ItemRow, Reconciled

# A status and an item are their dataclasses' fields, in order (results.py RunStatus,
# storage/port.py ItemRow): a new field there is in --json, the API and /openapi.json at once.
STATUS_FIELDS = tuple(f.name for f in fields(RunStatus))


def status_dict(st: RunStatus) -> dict[str, Any]:
    """The JSON shape of a run's status: every field of RunStatus."""
    values = st.to_dict()
    return {name: values[name] for name in STATUS_FIELDS}


def submission_dict(run_id: int, created: bool, st: RunStatus) -> dict[str, Any]:
    return {"run_id": run_id, "created": created, **status_dict(st)}


def item_dict(item: ItemRow) -> dict[str, Any]:
    return asdict(item)


def history_dict(story: History) -> dict[str, Any]:
    return {"item": asdict(story.item), "events": [asdict(e) for e in story.events]}


def finding_dict(finding: Finding) -> dict[str, Any]:
    return finding.to_dict()


def reconcile_dict(run_id: int, result: Reconciled) -> dict[str, Any]:
    from workledger.api import differences

    diff = {k: {"stored": a, "ledger": b} for k, (a, b) in differences(result).items()}
    return {"run_id": run_id, "differences": diff, "repaired": result.repaired}


def schedule_dict(schedule: ScheduleStatus) -> dict[str, Any]:
    """The JSON shape of a schedule: every field of ScheduleStatus."""
    return schedule.to_dict()


def fired_dict(name: str, fire: datetime, fired: Fired | None) -> dict[str, Any]:
    """A firing asked for by hand (``schedule fire``, ``backfill``); ``state`` None: a dry run."""
    return {"schedule": name, "fire_at": fire.isoformat(),
            "state": None if fired is None else fired.state,
            "run_id": None if fired is None else fired.run_id,
            "created": False if fired is None else fired.created,
            "was": None if fired is None else fired.was}
