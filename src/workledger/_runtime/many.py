"""Many runs at once (``submit_many``, issue 25): every run's items decomposed in this process,
checked whole before anything is written, then recorded by the store in one transaction
(``Store.runs_submit_many``, docs/design.md "Many runs at once")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from workledger._runtime import inputs
from workledger._runtime.decompose import failure_of, to_row
from workledger.core.text import reason_text
from workledger.errors import BadInput, DecompositionFailed, PayloadMismatch
from workledger.jobs import Job, canonical_json, default_key
from workledger.results import Submission
from workledger.storage.port import Deadline, NewItem, NewRun, NewRunItems


def planned(job: Job, runs: Iterable[Any], priority: int, deadline: Deadline | None,
            tenant: str | None = None) -> tuple[list[NewRunItems], list[int]]:
    """The distinct runs of ``runs`` (``(payload, key)`` pairs), each with all its items, and
    for each pair the index of its run: a key given twice with one payload is one run, with
    two payloads a :class:`PayloadMismatch`. Bad input raises before anything is written."""
    entries: list[NewRunItems] = []
    where: list[int] = []
    seen: dict[str, int] = {}
    for n, pair in enumerate(runs):
        payload, key = _pair(pair, n)
        inputs.check_key(key)
        text = canonical_json(payload)
        name = key or default_key(text)
        if name in seen:
            if entries[seen[name]].run.payload != text:
                raise PayloadMismatch(f"key {name!r} is given twice with different payloads; "
                                      "nothing was written", 0)
            where.append(seen[name])
            continue
        seen[name] = len(entries)
        where.append(len(entries))
        new = NewRun(job.name, name, text, float(job.tolerate), closing=job.closing is not None,
                     deadline=deadline, priority=priority, tenant=tenant)
        entries.append(NewRunItems(new, job.stages[0].name, _items(job, payload, name)))
    return entries, where


def _pair(pair: Any, n: int) -> tuple[Any, str | None]:
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise BadInput(f"run {n + 1}: expected a (payload, key) pair, got "
                       f"{type(pair).__name__}; nothing was written")
    return pair[0], pair[1]


def _items(job: Job, payload: Any, key: str) -> list[NewItem]:
    assert job.decomposer is not None
    try:
        return [to_row(seq, unit) for seq, unit in enumerate(job.decomposer(payload))]
    except Exception as exc:  # the user's decomposer failed: the whole call writes nothing
        raise DecompositionFailed(reason_text(f"key {key!r}: {failure_of(exc)}; nothing was "
                                              "written"), 0) from exc


def counts_of(entry: NewRunItems) -> dict[str, dict[str, int]]:
    """The stage counts of a run just recorded with its items (as ``run_counts`` reads)."""
    states: dict[str, int] = {}
    for item in entry.items:
        states[item.state] = states.get(item.state, 0) + 1
    return {entry.stage: states} if states else {}


def in_order(answers: list[Submission], where: list[int]) -> list[Submission]:
    """One answer per pair asked, in order: a key given again later in the call answers as a
    repeated submit would, with the run it named (``created`` False)."""
    out, seen = [], set()
    for i in where:
        answer = answers[i]
        out.append(replace(answer, created=False, resumed=False) if i in seen else answer)
        seen.add(i)
    return out
