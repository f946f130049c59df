"""Audit: list every stranded run and item with the re-entry path that will move it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from workledger.core.status import CLOSE_STAGE, PERMANENT_DECOMPOSITION
from workledger.runtime.jobs import Job
from workledger.runtime.reconcile import differences, reconcile
from workledger.runtime.sweeper import AWAITING_VERIFY
from workledger.storage.port import ItemRow, Store


@dataclass(frozen=True)
class Finding:
    kind: str
    run_id: int
    since: str
    path: str  # the named actor and action that will move it
    needs_person: bool
    stage: str | None = None
    seq: int | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def audit(store: Store, jobs: Mapping[str, Job], limit: int = 1000) -> list[Finding]:
    found = _undecomposed(store) + _expired(store, jobs, limit) + _attention(store, limit)
    found += _unclosed(store, jobs) + _drift(store, jobs, limit)
    return found


def _undecomposed(store: Store) -> list[Finding]:
    out = []
    for run in store.runs_undecomposed(0.0):
        permanent = (run.error or "").startswith(PERMANENT_DECOMPOSITION)
        path = ("a person: fix the decomposer, then resubmit under a new key" if permanent
                else "sweeper: re-decomposes from the retained payload, keeping existing rows")
        out.append(Finding("not_decomposed", run.id, str(run.created_at), path, permanent,
                           detail=run.error))
    return out


def _stage_path(jobs: Mapping[str, Job], job_name: str, stage: str) -> str:
    job = jobs.get(job_name)
    if job is None:
        return "sweeper: by the stage's declaration (run it with the app to know which)"
    s = job.stage_named(stage)
    if s.idempotent:
        return "sweeper: back to pending (idempotent stage)"
    if s.verify is not None:
        return "sweeper: asks the stage's verify hook"
    return "sweeper: to unknown, then a person: workledger resolve"


def _job_names(store: Store, items: list[ItemRow]) -> dict[int, str]:
    names: dict[int, str] = {}
    for i in items:
        if i.run_id not in names:
            run = store.run_get(i.run_id)
            names[i.run_id] = run.job if run else ""
    return names


def _expired(store: Store, jobs: Mapping[str, Job], limit: int) -> list[Finding]:
    items = store.leases_expired(limit)
    names = _job_names(store, items)
    return [
        Finding("expired_lease", i.run_id, str(i.lease_until),
                _stage_path(jobs, names[i.run_id], i.stage), False, i.stage, i.seq)
        for i in items
    ]


def _attention(store: Store, limit: int) -> list[Finding]:
    out = []
    for i in store.items_attention(["unknown", "failed"], limit):
        if i.state == "failed":
            path = f"a person: workledger retry {i.run_id} --stage {i.stage} --item {i.seq}"
            out.append(Finding("failed", i.run_id, str(i.updated_at), path, True, i.stage, i.seq,
                               i.error))
        elif i.error == AWAITING_VERIFY:
            out.append(Finding("unknown", i.run_id, str(i.updated_at),
                               "sweeper: asks the stage's verify hook", False, i.stage, i.seq,
                               i.error))
        else:
            path = (f"a person: workledger resolve {i.run_id} --stage {i.stage} --item {i.seq}"
                    " --as processed|failed|pending")
            out.append(Finding("unknown", i.run_id, str(i.updated_at), path, True, i.stage,
                               i.seq, i.error))
    return out


def _unclosed(store: Store, jobs: Mapping[str, Job]) -> list[Finding]:
    out = []
    for job in jobs.values():
        if job.closing is None:
            continue
        for run_id in store.runs_to_close([job.name], CLOSE_STAGE):
            run = store.run_get(run_id)
            since = str(run.completed_at) if run else ""
            out.append(Finding("closing_hook_not_run", run_id, since,
                               "sweeper: runs the closing hook once", False, CLOSE_STAGE, 0))
    return out


def _drift(store: Store, jobs: Mapping[str, Job], limit: int) -> list[Finding]:
    out = []
    for run in store.runs_list(limit):
        job = jobs.get(run.job)
        stages = [s.name for s in job.stages] if job else []
        diff = differences(reconcile(store, run.id, stages, dry_run=True))
        if diff:
            text = ", ".join(f"{k}: stored {a} vs ledger {b}" for k, (a, b) in diff.items())
            out.append(Finding("projection_drift", run.id, str(run.created_at),
                               f"workledger reconcile {run.id}", False, detail=text))
    return out
