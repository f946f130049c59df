"""Audit: list every stranded run and item with the re-entry path that will move it.

A finding either needs a person now (``needs_person``) or does not: either a process will move
it (the sweeper, a worker), or a person has already reviewed it (``reviewed`` says how: the
failure is within the tolerance of a finished run, or it was acknowledged with ``ack`` after it
failed). Everything is read a page at a time, so nothing is silently left out; the filters
(run, job, since) are in the queries, and ``audit_page`` lists a page of findings at a time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from workledger._runtime.repair.operations import ACKNOWLEDGED
from workledger._runtime.repair.reconcile import differences, reconcile
from workledger._runtime.status import decompose_failures, status_of
from workledger.core.states import AWAITING_VERIFY, ItemState
from workledger.core.status import (
    CLOSE_STAGE,
    PERMANENT_DECOMPOSITION,
    RunState,
    decomposer_needs_person,
)
from workledger.errors import BadInput
from workledger.jobs import Job
from workledger.storage.port import AuditItems, EventRow, ItemRow, RunRow, Store

PAGE = 1000


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
    reviewed: str | None = None  # why it does not alert: within tolerance, or acknowledged

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FindingGroup:
    """Findings of one kind, run, stage and path, and reviewed alike: what a person reads as
    one line (a dead chunk of 100 items is one group of 100 expired leases)."""

    kind: str
    run_id: int
    stage: str | None
    path: str  # for several items, the stage-wide action (retry --stage, resolve --all-unknown)
    needs_person: bool
    reviewed: str | None
    findings: tuple[Finding, ...]

    @property
    def count(self) -> int:
        return len(self.findings)

    @property
    def since(self) -> str:
        return min(f.since for f in self.findings)

    @property
    def items(self) -> str:
        """The item (``stage/seq``), or how many items of which stage."""
        if self.count > 1:
            return f"{self.count:,} items of {self.stage}"
        first = self.findings[0]
        return f"{first.stage}/{first.seq}" if first.stage is not None else ""

    @property
    def detail(self) -> str | None:
        """The reason, or the most common one and how many others there are."""
        reasons = Counter(f.detail for f in self.findings if f.detail)
        if not reasons:
            return None
        top, n = reasons.most_common(1)[0]
        if len(reasons) == 1:
            return top
        others = len(reasons) - 1
        return f"{top} ({n:,} of them; {others:,} other reason{'s' if others > 1 else ''})"


def group_findings(findings: Iterable[Finding]) -> list[FindingGroup]:
    """The findings grouped by kind, run, stage, stage-wide path and review, in the order
    each group first appears."""
    groups: dict[tuple[Any, ...], list[Finding]] = {}
    for f in findings:
        key = (f.kind, f.run_id, f.stage, _stage_wide(f), f.needs_person, f.reviewed)
        groups.setdefault(key, []).append(f)
    return [FindingGroup(kind, run_id, stage, path if len(found) > 1 else found[0].path,
                         person, reviewed, tuple(found))
            for (kind, run_id, stage, path, person, reviewed), found in groups.items()]


def _stage_wide(f: Finding) -> str:
    """What moves every item of ``f``'s kind in its stage at once (its own path when its path
    names no item)."""
    if f.stage is None or f.stage == CLOSE_STAGE:
        return f.path
    if f.kind == "failed":
        return _retry_path(f.run_id, f.stage)
    if f.kind == "unknown" and f.needs_person:
        return _resolve_path(f.run_id, f.stage)
    return f.path


def _retry_path(run_id: int, stage: str, seq: int | None = None) -> str:
    item = f" --item {seq}" if seq is not None else ""
    return f"a person: workledger retry {run_id} --stage {stage}{item}"


def _resolve_path(run_id: int, stage: str, seq: int | None = None) -> str:
    which = f"--item {seq}" if seq is not None else "--all-unknown"
    why = "" if seq is not None else " --note WHY"
    return (f"a person: workledger resolve {run_id} --stage {stage} {which} "
            f"--as processed|failed|pending{why}")


@dataclass(frozen=True)
class AuditFilter:
    """Which findings to list: of one run, of one job, and since when (a time as stored)."""

    run_id: int | None = None
    job: str | None = None
    since: str | None = None

    def keeps(self, run: RunRow | None, when: str) -> bool:
        if self.run_id is not None and (run is None or run.id != self.run_id):
            return False
        if self.job is not None and (run is None or run.job != self.job):
            return False
        return self.since is None or when >= self.since


@dataclass
class _Runs:
    """The runs findings point at, each read once: its row, its status, its acknowledgements."""

    store: Store
    jobs: Mapping[str, Job]
    rows: dict[int, RunRow | None] = field(default_factory=dict)
    states: dict[int, Any] = field(default_factory=dict)
    acks: dict[int, list[EventRow]] = field(default_factory=dict)

    def row(self, run_id: int) -> RunRow | None:
        if run_id not in self.rows:
            self.rows[run_id] = self.store.run_get(run_id)
        return self.rows[run_id]

    def job(self, run_id: int) -> Job | None:
        run = self.row(run_id)
        return self.jobs.get(run.job) if run else None

    def status(self, run_id: int) -> Any:
        run = self.row(run_id)
        if run_id not in self.states and run is not None:
            self.states[run_id] = status_of(self.store, run, self.job(run_id))
        return self.states.get(run_id)

    def acknowledged(self, item: ItemRow) -> EventRow | None:
        """The latest acknowledgement covering ``item``'s failure (made after it failed)."""
        if item.run_id not in self.acks:
            self.acks[item.run_id] = self.store.events_list(item.run_id, kind=ACKNOWLEDGED)
        for event in reversed(self.acks[item.run_id]):
            scope = event.detail if isinstance(event.detail, dict) else {}
            if scope.get("stage") not in (None, item.stage):
                continue
            if scope.get("seq") not in (None, item.seq) or event.at < item.updated_at:
                continue
            return event
        return None


Position = tuple[int, int]  # (section, run or item id): where a page of findings ends


@dataclass(frozen=True)
class AuditPage:
    """A page of findings and the cursor of the next (``after=``), None on the last page."""

    findings: list[Finding]
    next: str | None


def audit(store: Store, jobs: Mapping[str, Job], where: AuditFilter | None = None
          ) -> list[Finding]:
    """Every finding the filter keeps."""
    where = where or AuditFilter()
    return [f for _, f in _positioned(store, jobs, where, (0, 0))]


def audit_page(store: Store, jobs: Mapping[str, Job], where: AuditFilter, limit: int,
               after: str | None = None) -> AuditPage:
    """At most ``limit`` findings from the cursor ``after`` on (a previous page's ``next``).
    The run, job and time filters are in the queries: a filter that matches little reads
    little, however many findings the ledger holds."""
    found: list[Finding] = []
    last: Position = (0, 0)
    for position, finding in _positioned(store, jobs, where, parse_cursor(after)):
        if len(found) == limit:
            return AuditPage(found, f"{last[0]}.{last[1]}")
        found.append(finding)
        last = position
    return AuditPage(found, None)


def parse_cursor(text: str | None) -> Position:
    if text is None:
        return (0, 0)
    section, _, after = text.partition(".")
    if not (section.isdigit() and after.isdigit() and len(after) < 20):
        raise BadInput(f"after {text!r}: give the next of the previous page")
    return int(section), int(after)


def _positioned(store: Store, jobs: Mapping[str, Job], where: AuditFilter, start: Position
                ) -> Iterator[tuple[Position, Finding]]:
    """The findings in a fixed order, each with its position, from after ``start`` on."""
    runs = _Runs(store, jobs)
    sections: list[Callable[[int], Iterable[tuple[int, Finding]]]] = [
        lambda after: _by_run(_deferred(store), after),
        lambda after: _by_run(_undecomposed(store), after),
        lambda after: _expired(store, runs, where, after),
        lambda after: _attention(store, runs, where, after),
        lambda after: _by_run(_unclosed(store, jobs), after),
        lambda after: _by_run(_drift(store, jobs, where), after),
        lambda after: _by_run(_deadlines(store), after),
        lambda after: _firings_failed(store, after)]
    for number, section in enumerate(sections):
        if number < start[0]:
            continue
        for key, finding in section(start[1] if number == start[0] else 0):
            if where.keeps(runs.row(finding.run_id), finding.since):
                yield (number, key), finding


def _by_run(found: Iterable[Finding], after: int) -> list[tuple[int, Finding]]:
    """A section of run findings (a run at most once each), ordered by run, past ``after``."""
    return sorted(((f.run_id, f) for f in found if f.run_id > after), key=lambda p: p[0])


def _deferred(store: Store) -> Iterator[Finding]:
    for run in store.runs_deferred(None, 1000):
        yield Finding("not_decomposed", run.id, str(run.created_at),
                      "a worker or the sweeper: takes it at once (recorded in a caller's "
                      "transaction) and decomposes it from the retained payload", False)


def _undecomposed(store: Store) -> Iterator[Finding]:
    for run in store.runs_undecomposed(0.0):
        failures = decompose_failures(store, run)
        person = decomposer_needs_person(run.error, failures)
        if (run.error or "").startswith(PERMANENT_DECOMPOSITION):
            path = "a person: fix the decomposer, then resubmit under a new key"
        elif person:
            path = (f"a person: the decomposer failed {failures} times; fix it, then "
                    "workledger sweep")
        else:
            path = "sweeper: re-decomposes from the retained payload, keeping existing rows"
        yield Finding("not_decomposed", run.id, str(run.created_at), path, person,
                      detail=run.error)


def _stage_path(job: Job | None, stage: str) -> str:
    if job is None:
        return "sweeper: by the stage's declaration (run it with the app to know which)"
    s = job.stage_named(stage)
    if s.idempotent:
        return "sweeper: back to pending (idempotent stage)"
    if s.verify is not None:
        return "sweeper: asks the stage's verify hook"
    return "sweeper: to unknown, then a person: workledger resolve"


def _paged(store: Store, kind: str, where: AuditFilter, after: int
           ) -> Iterator[ItemRow]:
    while page := store.items_audit(AuditItems(kind, where.run_id, where.job, where.since,
                                               after, PAGE)):
        yield from page
        after = page[-1].id


def _expired(store: Store, runs: _Runs, where: AuditFilter, after: int
             ) -> Iterator[tuple[int, Finding]]:
    for i in _paged(store, "expired", where, after):
        yield i.id, Finding("expired_lease", i.run_id, str(i.lease_until),
                            _stage_path(runs.job(i.run_id), i.stage), False, i.stage, i.seq)


def _attention(store: Store, runs: _Runs, where: AuditFilter, after: int
               ) -> Iterator[tuple[int, Finding]]:
    for i in _paged(store, "attention", where, after):
        if i.state == ItemState.FAILED:
            yield i.id, _failure(i, runs)
        elif i.error == AWAITING_VERIFY:
            yield i.id, Finding("unknown", i.run_id, str(i.updated_at),
                                "sweeper: asks the stage's verify hook", False, i.stage,
                                i.seq, i.error)
        else:
            path = _resolve_path(i.run_id, i.stage, i.seq)
            yield i.id, Finding("unknown", i.run_id, str(i.updated_at), path, True, i.stage,
                                i.seq, i.error)


def _failure(i: ItemRow, runs: _Runs) -> Finding:
    path = _retry_path(i.run_id, i.stage, i.seq)
    reviewed = None
    status = runs.status(i.run_id)
    ack = runs.acknowledged(i)
    if ack is not None:
        note = ack.detail.get("note") if isinstance(ack.detail, dict) else None
        reviewed = f"acknowledged {ack.at} by {ack.actor or 'operator'}: {note}"
    elif status is not None and status.state == RunState.COMPLETED_WITH_FAILURES:
        reviewed = (f"within tolerance: run {i.run_id} finished completed_with_failures "
                    f"({status.failed} of {status.total} units failed)")
    elif i.stage == CLOSE_STAGE:
        path = f"a person: workledger retry {i.run_id} --stage {CLOSE_STAGE}"
    return Finding("failed", i.run_id, str(i.updated_at), path, reviewed is None, i.stage,
                   i.seq, i.error, reviewed)


def _unclosed(store: Store, jobs: Mapping[str, Job]) -> Iterator[Finding]:
    for job in jobs.values():
        if job.closing is None:
            continue
        for run_id in store.runs_to_close([job.name], CLOSE_STAGE):
            run = store.run_get(run_id)
            since = str(run.completed_at) if run else ""
            yield Finding("closing_hook_not_run", run_id, since,
                          "sweeper: runs the closing hook once", False, CLOSE_STAGE, 0)


def _drift(store: Store, jobs: Mapping[str, Job], where: AuditFilter) -> Iterator[Finding]:
    for run in _runs(store, where):
        if not where.keeps(run, str(run.created_at)):
            continue  # not asked for: no reconcile
        job = jobs.get(run.job)
        stages = [s.name for s in job.stages] if job else []
        diff = differences(reconcile(store, run.id, stages, dry_run=True))
        if diff:
            text = ", ".join(f"{k}: stored {a} vs ledger {b}" for k, (a, b) in diff.items())
            yield Finding("projection_drift", run.id, str(run.created_at),
                          f"workledger reconcile {run.id}", False, detail=text)


def _stamp(t: datetime) -> str:
    """A time the way the ledger's other times read (UTC, to the microsecond)."""
    return t.astimezone(UTC).isoformat(sep=" ", timespec="microseconds")


def _late(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _deadlines(store: Store) -> Iterator[Finding]:
    """Open runs past their deadline (a person: exit 1), and those inside its warning."""
    now, rows = store.runs_deadlines(PAGE)
    for d in rows:
        left = f"{d.left:,} of {d.total:,} units left"
        if d.deadline_at <= now:
            late = (now - d.deadline_at).total_seconds()
            yield Finding("deadline_missed", d.run_id, _stamp(d.deadline_at),
                          f"a person: the run is {_late(late)} past its deadline; workledger "
                          f"status {d.run_id} says what holds it", True,
                          detail=f"{_late(late)} late, {left}")
        else:
            early = (d.deadline_at - now).total_seconds()
            yield Finding("deadline_near", d.run_id, _stamp(d.warn_at or d.deadline_at),
                          f"workers: the deadline is in {_late(early)}", False,
                          detail=f"due in {_late(early)}, {left}")


def _firings_failed(store: Store, after: int) -> list[tuple[int, Finding]]:
    """Firings whose schedule function raised (run 0: no run was made)."""
    found = []
    for number, f in enumerate(store.firings_failed(PAGE), start=1):
        if number <= after:
            continue
        found.append((number, Finding(
            "firing_failed", 0, _stamp(f.fire_at),
            "sweeper: tries it again each pass within the catch-up window; after it, a person: "
            f"fix the function, then workledger schedule backfill {f.schedule} --from "
            f"{f.fire_at.isoformat()} --to {f.fire_at.isoformat()}", True,
            detail=f"schedule {f.schedule}, firing {f.fire_at.isoformat()}, {f.attempts} "
                   f"tries: {f.error}")))
    return found


def _runs(store: Store, where: AuditFilter) -> Iterator[RunRow]:
    """The runs whose projection to check: the one asked for, or the most recent ones."""
    if where.run_id is not None:
        run = store.run_get(where.run_id)
        if run is not None:
            yield run
        return
    yield from store.runs_list(1000)
