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
    from workledger._runtime.repair.operations import History
    from workledger.api import Finding
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
