"""The oracle of docs/reliability.md, checked with SQL and the sink, never with workledger's code.

After a round recovers, :func:`check` reads the ledger through the oracle's own connection
(backend.Db) and the sink (sink.py) and returns every violation of:

- **L** nothing lost: each run's first stage holds exactly its payload's units, hand-offs
  exist, every submission that was acknowledged is a run, every item is terminal or has a
  named way back in;
- **D** no unflagged duplicate: an effect ran twice only in an idempotent stage (keyed the
  same) or for an item that went through ``unknown``; a processed item's effect happened;
- **T** terminal is one-way: :class:`OneWay` diffs snapshots taken during the round;
- **R** the projection reconciles: stored counters and stage counts equal what this module
  derives from the item rows (and ``reconcile --all --dry-run`` agrees, checked by the round).

V (liveness) and E (clear errors) are judged by the round runner (rounds.py) and processes.py.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from backend import Db
from plan import RoundPlan
from sink import SinkView

STAGES = {"relay": ("prepare", "deliver"), "charge": ("charge",)}
IDEMPOTENT = frozenset({"prepare", "@close"})
TERMINAL = frozenset({"processed", "failed", "skipped"})
AWAITING_VERIFY = "lease_expired: awaiting verify"  # the reason audit shows for the sweeper
FLAGGED_BY = frozenset({"unknown", "verified", "resolved"})  # events of an item in doubt


@dataclass(frozen=True)
class Violation:
    check: str  # L D T R E V
    what: str

    def __str__(self) -> str:
        return f"{self.check}: {self.what}"


@dataclass
class Facts:
    """The ledger as the oracle reads it, in one pass after the round."""

    runs: dict[int, dict[str, Any]]
    items: list[tuple[int, int, str, int, str, str | None]]  # id, run, stage, seq, state, error
    events: dict[int, Counter[str]]  # item id -> event kinds
    counts: dict[tuple[int, str, str], int]


def read_facts(db: Db) -> Facts:
    runs = {}
    for row in db.rows(
            "SELECT id, job, idempotency_key, payload, decomposed_at IS NOT NULL,"
            " cancelled_at IS NOT NULL, paused_at IS NOT NULL, completed_at IS NOT NULL, error,"
            " total, processed, failed, skipped FROM wl_runs"):
        payload = json.loads(row[3]) if isinstance(row[3], str) else row[3]
        runs[row[0]] = dict(zip(
            ("id", "job", "key", "payload", "decomposed", "cancelled", "paused", "complete",
             "error", "total", "processed", "failed", "skipped"),
            (row[0], row[1], row[2], payload, *(bool(v) for v in row[4:8]), *row[8:]),
            strict=True))
    items = [tuple(r) for r in db.rows(
        "SELECT id, run_id, stage, seq, state, error FROM wl_items ORDER BY id")]
    events: dict[int, Counter[str]] = defaultdict(Counter)
    for item_id, kind, n in db.rows("SELECT item_id, kind, count(*) FROM wl_events"
                                    " WHERE item_id IS NOT NULL GROUP BY item_id, kind"):
        events[item_id][kind] += n
    counts = {(r[0], r[1], r[2]): int(r[3]) for r in db.rows(
        "SELECT run_id, stage, state, n FROM wl_stage_counts WHERE n <> 0")}
    return Facts(runs, items, events, counts)


# -- T: terminal is one-way, from snapshots -----------------------------------------------------


@dataclass
class OneWay:
    """Trigger-free: compares successive snapshots of every item's (state, token, updated_at).
    A processed or skipped item never changes; a failed one changes only by a redrive, which
    :meth:`check` matches against the ``redriven`` events afterwards."""

    previous: dict[int, tuple[str, Any, str]] = field(default_factory=dict)
    left_failed: Counter[int] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    snapshots: int = 0

    def observe(self, db: Db) -> None:
        rows = db.rows("SELECT id, state, lease_token, updated_at FROM wl_items")
        now = {r[0]: (r[1], r[2], str(r[3])) for r in rows}
        for item_id, old in self.previous.items():
            new = now.get(item_id)
            if new is None:
                self.violations.append(Violation("L", f"item {item_id} disappeared"))
            elif old[0] in ("processed", "skipped") and new != old:
                self.violations.append(Violation(
                    "T", f"item {item_id} left terminal {old[0]} (token {old[1]}) for "
                         f"{new[0]} (token {new[1]})"))
            elif old[0] == "failed" and new != old:
                self.left_failed[item_id] += 1
        self.previous = now
        self.snapshots += 1

    def check(self, facts: Facts) -> list[Violation]:
        found = list(self.violations)
        for item_id, n in sorted(self.left_failed.items()):
            redriven = facts.events.get(item_id, Counter())["redriven"]
            if redriven < n:
                found.append(Violation("T", f"item {item_id} left failed {n} times with "
                                            f"{redriven} audited redrives"))
        return found


# -- settledness, for liveness ---------------------------------------------------------------


def unsettled(db: Db) -> list[str]:
    """Runs that some process (not a person) still has to move, with why."""
    rows = db.rows(
        "SELECT r.id, r.job, r.decomposed_at IS NOT NULL, r.cancelled_at IS NOT NULL,"
        " r.paused_at IS NOT NULL, i.stage, i.state, i.error, count(i.id)"
        " FROM wl_runs AS r LEFT JOIN wl_items AS i ON i.run_id = r.id"
        " GROUP BY r.id, r.job, r.decomposed_at, r.cancelled_at, r.paused_at, i.stage, i.state,"
        " i.error")
    runs: dict[int, dict[str, Any]] = {}
    for run_id, job, decomposed, cancelled, paused, stage, state, error, n in rows:
        run = runs.setdefault(run_id, {"job": job, "decomposed": bool(decomposed),
                                       "cancelled": bool(cancelled), "paused": bool(paused),
                                       "states": Counter(), "closed": False})
        if stage == "@close":
            run["closed"] |= state in TERMINAL or state == "unknown"
            if state in ("pending", "claimed"):
                run["states"]["@close " + state] += n
        elif state is not None:
            run["states"][AWAITING_VERIFY if error == AWAITING_VERIFY else state] += n
    return [f"run {rid}: {why}" for rid, run in sorted(runs.items())
            if (why := _why_open(run))]


def _why_open(run: dict[str, Any]) -> str | None:
    states: Counter[str] = run["states"]
    if not run["decomposed"] and not run["cancelled"]:
        return "not decomposed"
    moving = {s: n for s, n in states.items()
              if s in ("pending", "claimed", AWAITING_VERIFY) or s.startswith("@close")}
    if run["paused"] and not run["cancelled"]:
        moving.pop("pending", None)  # a person resumes it
    if moving:
        return ", ".join(f"{n} {s}" for s, n in sorted(moving.items()))
    open_work = sum(n for s, n in states.items() if s not in TERMINAL)
    if run["job"] == "relay" and not run["cancelled"] and not open_work and run["decomposed"] \
            and not run["closed"]:
        return "closing hook not run"
    return None


# -- the final checks ---------------------------------------------------------------------------


def check(facts: Facts, view: SinkView, plan: RoundPlan,
          acknowledged: list[dict[str, Any]]) -> list[Violation]:
    return (check_lost(facts, plan, acknowledged) + check_duplicates(facts, view)
            + check_projection(facts))


def check_lost(facts: Facts, plan: RoundPlan,
               acknowledged: list[dict[str, Any]]) -> list[Violation]:
    found: list[Violation] = []
    planned = {r.key: r for r in plan.runs}
    by_key = {run["key"]: run for run in facts.runs.values()}
    for ack in acknowledged:
        run = by_key.get(ack["key"])
        if run is None or run["id"] != ack["run_id"]:
            found.append(Violation("L", f"submission of key {ack['key']} acknowledged run "
                                        f"{ack['run_id']}, the ledger has {run and run['id']}"))
    items_of: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for item in facts.items:
        items_of[item[1]].append(item)
    for run in facts.runs.values():
        plan_run = planned.get(run["key"].split("-fp")[0])
        if plan_run is None or run["payload"] not in (plan_run.payload(0), plan_run.payload(1)):
            found.append(Violation("L", f"run {run['id']} (key {run['key']}) was never submitted"
                                        " with that payload"))
            continue
        found += _run_items(run, items_of[run["id"]])
    return found


def _run_items(run: dict[str, Any], items: list[tuple[Any, ...]]) -> list[Violation]:
    found: list[Violation] = []
    rid, stages = run["id"], STAGES[run["job"]]
    units, every = run["payload"]["units"], run["payload"].get("skip_every") or 0
    by_stage: dict[str, dict[int, tuple[Any, ...]]] = defaultdict(dict)
    for item in items:
        by_stage[item[2]][item[3]] = item
    first = by_stage[stages[0]]
    if run["decomposed"] and sorted(first) != list(range(units)):
        found.append(Violation("L", f"run {rid}: first stage has seqs {sorted(first)[:8]}..."
                                    f" ({len(first)}), the payload has {units} units"))
    for seq, item in first.items():
        if every and seq % every == every - 1 and item[4] != "skipped":
            found.append(Violation("L", f"run {rid}: unit {seq} should be skipped at"
                                        f" decomposition, is {item[4]}"))
    for prev, nxt in zip(stages, stages[1:], strict=False):
        for seq, item in by_stage[prev].items():
            if (item[4] == "processed") != (seq in by_stage[nxt]):
                there = "is" if seq in by_stage[nxt] else "is not"
                found.append(Violation("L", f"run {rid}: {prev}/{seq} is {item[4]} but its"
                                            f" {nxt} row {there} there"))
    for item in items:
        why = _stranded(run, item)
        if why:
            found.append(Violation("L", f"run {rid}: {item[2]}/{item[3]} {why}"))
    return found


def _stranded(run: dict[str, Any], item: tuple[Any, ...]) -> str | None:
    """Why an item has no named way back in (None when it is terminal or has one)."""
    state = item[4]
    if state in TERMINAL or state == "unknown":  # unknown: its verify hook, or a person
        return None
    if state == "claimed":
        return "is still claimed after every worker stopped"
    if run["cancelled"]:
        return "is pending in a cancelled run: nothing will ever claim it"
    if not run["decomposed"] or run["paused"]:
        return None  # the sweeper decomposes it; a person resumes it
    return "is pending after recovery"


def check_duplicates(facts: Facts, view: SinkView) -> list[Violation]:
    found: list[Violation] = []
    known = {f"{i[1]}/{i[2]}/{i[3]}": i for i in facts.items}
    for key in set(view.effects) - set(known):
        found.append(Violation("D", f"an effect keyed {key} names no item"))
    for key, item in known.items():
        effects = view.effects[key]
        if item[2] not in IDEMPOTENT and effects > 1 and \
                not facts.events.get(item[0], Counter()).keys() & FLAGGED_BY:
            found.append(Violation("D", f"{key} ran its effect {effects} times and was never"
                                        " unknown, verified or resolved"))
        if item[4] == "processed" and effects == 0:
            found.append(Violation("D", f"{key} is processed but its effect never happened"))
    return found


def duplicates(facts: Facts, view: SinkView) -> dict[str, int]:
    """Effects that ran more than once: in idempotent stages, and flagged ones elsewhere."""
    out = Counter[str]()
    for item in facts.items:
        n = view.effects[f"{item[1]}/{item[2]}/{item[3]}"]
        if n > 1:
            out["idempotent" if item[2] in IDEMPOTENT else "flagged"] += n - 1
    return dict(out)


def check_projection(facts: Facts) -> list[Violation]:
    found: list[Violation] = []
    grouped = Counter((i[1], i[2], i[4]) for i in facts.items)
    if dict(grouped) != facts.counts:
        diff = {k: (facts.counts.get(k, 0), grouped.get(k, 0))
                for k in set(grouped) | set(facts.counts) if facts.counts.get(k, 0) != grouped[k]}
        found.append(Violation("R", f"wl_stage_counts differ from the items: {diff}"))
    for run in facts.runs.values():
        derived = derive(run, [i for i in facts.items if i[1] == run["id"]])
        stored = {k: run[k] for k in derived}
        if stored != derived:
            found.append(Violation("R", f"run {run['id']}: stored {stored}, items say {derived}"))
    return found


def derive(run: dict[str, Any], items: list[tuple[Any, ...]]) -> dict[str, Any]:
    """A run's counters in units, from its item rows (docs/design.md, "Run states")."""
    stages = STAGES[run["job"]]
    work = [i for i in items if i[2] != "@close"]
    n = Counter((i[2], i[4]) for i in work)
    total = sum(c for (stage, _), c in n.items() if stage == stages[0])
    finished = {s: sum(c for (_, st), c in n.items() if st == s) for s in ("failed", "skipped")}
    processed = n[(stages[-1], "processed")]
    open_items = sum(c for (_, st), c in n.items() if st not in TERMINAL)
    complete = run["decomposed"] and not open_items and \
        processed + finished["failed"] + finished["skipped"] >= total
    return {"total": total if run["decomposed"] else run["total"], "processed": processed,
            **finished, "complete": complete}
