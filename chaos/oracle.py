"""The oracle of docs/reliability.md, checked with SQL and the sink, never with workledger's code.

After a round recovers, :func:`check` reads the ledger through the oracle's own connection
(backend.Db) and the sink (sink.py) and returns every violation of:

- **L** nothing lost: each run's first stage holds exactly its payload's units, hand-offs
  exist, every submission that was acknowledged is a run, every item is terminal or has a
  named way back in;
- **D** no duplicate nobody chose: an effect of a stage that is not idempotent ran again only
  after a person chose it (``resolve --as pending`` of that item, or ``retry`` of its run,
  after the previous effect), whatever states the item went through meanwhile; a closing
  hook's effect ran again only after such a retry or when the process that made the previous
  one died (a hook is run again when its process dies inside it, or gives up on a database
  that stays away before it has recorded the hook's outcome); a processed item's effect
  happened;
- **T** terminal is one-way: :class:`OneWay` diffs snapshots taken during the round;
- **R** the projection reconciles: stored counters and stage counts equal what this module
  derives from the item rows (and ``reconcile --all --dry-run`` agrees, checked by the round).

- **V** every run that does not wait for a person settles within a stated bound after the last
  fault (:func:`check_settled`; the round runner measures, rounds.py);
- **W** a SQLite ledger's write-ahead log stays under a stated size (:func:`check_wal`; the
  round samples it every half second).

E (clear errors) is judged by processes.py.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from backend import Db
from plan import RoundPlan
from sink import Choice, Effect, SinkView

STAGES = {"relay": ("prepare", "deliver"), "charge": ("charge",)}
IDEMPOTENT = frozenset({"prepare"})  # keyed by ctx.idempotency_key: a repeat is harmless
CLOSE = "@close"
TERMINAL = frozenset({"processed", "failed", "skipped"})
AWAITING_VERIFY = "lease_expired: awaiting verify"  # the reason audit shows for the sweeper


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


def check(facts: Facts, view: SinkView, plan: RoundPlan, acknowledged: list[dict[str, Any]],
          died: frozenset[int] = frozenset()) -> list[Violation]:
    """``died``: pids of the round's processes that were killed or died at a failpoint."""
    return (check_lost(facts, plan, acknowledged) + check_duplicates(facts, view, died)
            + check_fenced(view) + check_projection(facts))


def check_fenced(view: SinkView) -> list[Violation]:
    """D, the other half: an effect the downstream's fence refused was a handler still running
    while its item was verified or resolved. That may happen only to a holder that looked gone
    because its PostgreSQL session ended while the handler ran (a terminated session, a
    restart: docs/reliability.md, "Durability assumptions", the clocks); the fence is what
    kept its effect from happening twice. Anywhere else (every refusal on SQLite, where a live
    holder keeps its file locked) the ledger took an item from a live holder."""
    found: list[Violation] = []
    for r in view.refusals:
        if any(start <= r.at and until >= r.started for start, until in view.cuts):
            continue
        found.append(Violation("D", f"{r.key}: the effect of token {r.token} (pid {r.pid}) was "
                                    "fenced out: its item was verified, resolved or run again "
                                    "(a closing hook) while its handler still ran, and nothing "
                                    "had ended its session"))
    return found


def check_settled(recovery: float | None, stuck: list[str], bound: float) -> list[Violation]:
    """V: ``recovery`` is how long after the last fault every run was settled (None: not within
    ``bound``); ``stuck`` says what was still open when the bound ran out."""
    if recovery is not None and recovery <= bound:
        return []
    return [Violation("V", f"not settled within {bound:g} s of the last fault: {s}")
            for s in (stuck or ["(nothing named)"])[:10]]


def check_wal(largest: int, limit: int) -> list[Violation]:
    """W: the largest write-ahead log seen during the round, against the stated limit."""
    if largest <= limit:
        return []
    return [Violation("W", f"the SQLite WAL reached {largest / 2**20:.1f} MiB, over the "
                           f"stated bound of {limit / 2**20:g} MiB")]


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


def check_duplicates(facts: Facts, view: SinkView,
                     died: frozenset[int] = frozenset()) -> list[Violation]:
    found: list[Violation] = []
    known = {f"{i[1]}/{i[2]}/{i[3]}": i for i in facts.items}
    for key in set(view.effects) - set(known):
        found.append(Violation("D", f"an effect keyed {key} names no item"))
    for key, item in known.items():
        effects = view.history.get(key, [])
        for prev, nxt in zip(effects, effects[1:], strict=False):
            if item[2] in IDEMPOTENT or _why_again(key, item[2], prev, nxt, view.choices, died):
                continue
            what = "closing hook" if item[2] == CLOSE else "effect"
            found.append(Violation("D", f"{key}: {what} ran again (effect #{nxt.id} by pid "
                                        f"{nxt.pid} after #{prev.id} by pid {prev.pid}) and no"
                                        " person chose it; item now " + str(item[4])))
            break
        if item[4] == "processed" and view.effects[key] == 0:
            found.append(Violation("D", f"{key} is processed but its effect never happened"))
    return found


def _why_again(key: str, stage: str, prev: Effect, nxt: Effect, choices: list[Choice],
               died: frozenset[int]) -> str | None:
    """Why an effect may happen again after ``prev`` (None: nothing allowed it)."""
    run = key.split("/", 1)[0]
    for c in choices:
        if prev.id <= c.after_effect < nxt.id and (
                (c.what == "resolve pending" and c.key == key)
                or (c.what == "retry" and c.key == f"{run}/*")):
            return f"{c.what} after the previous effect"
    if stage == CLOSE and prev.pid in died:
        return "the hook's process died (or gave up on the database) after its effect"
    return None


def duplicates(facts: Facts, view: SinkView,
               died: frozenset[int] = frozenset()) -> dict[str, int]:
    """Effects that ran again: in an idempotent stage, after a person's choice, or a closing
    hook whose process died (what check D allows), and ``unexplained`` ones (what it does not)."""
    out = Counter[str]()
    for item in facts.items:
        key = f"{item[1]}/{item[2]}/{item[3]}"
        effects = view.history.get(key, [])
        for prev, nxt in zip(effects, effects[1:], strict=False):
            if item[2] in IDEMPOTENT:
                out["idempotent"] += 1
                continue
            why = _why_again(key, item[2], prev, nxt, view.choices, died)
            out["unexplained" if why is None else
                "close_rerun_after_death" if why.startswith("the hook") else "chosen"] += 1
    if view.refusals:  # late effects a fence refused (check_fenced says when they may be)
        out["fenced"] += len(view.refusals)
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
    """A run's counters in units, from its item rows (docs/design.md, "Run states"): ``total``
    too before the mark, since every batch counts its rows (a cancelled run whose
    decomposition was cut short is never marked)."""
    stages = STAGES[run["job"]]
    work = [i for i in items if i[2] != "@close"]
    n = Counter((i[2], i[4]) for i in work)
    total = sum(c for (stage, _), c in n.items() if stage == stages[0])
    finished = {s: sum(c for (_, st), c in n.items() if st == s) for s in ("failed", "skipped")}
    processed = n[(stages[-1], "processed")]
    open_items = sum(c for (_, st), c in n.items() if st not in TERMINAL)
    complete = run["decomposed"] and not open_items and \
        processed + finished["failed"] + finished["skipped"] >= total
    return {"total": total, "processed": processed,
            **finished, "complete": complete}
