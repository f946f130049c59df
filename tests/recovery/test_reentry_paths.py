"""Each re-entry path of docs/design.md not covered elsewhere, driven by a real crash or fault."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from workledger import Item, Ledger, Retry
from workledger.storage.port import NewRun

from .declared_app import UNITS, build, effects

pytestmark = pytest.mark.concurrency

APP = str(Path(__file__).with_name("declared_app.py"))


def _run(url: str, sink: str, declaration: str, cmd: str, failpoints: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "WORKLEDGER_FAILPOINTS"}
    if failpoints:
        env["WORKLEDGER_FAILPOINTS"] = failpoints
    proc = subprocess.run([sys.executable, APP, url, sink, declaration, cmd], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 137), proc.stderr[-2000:]
    return proc.returncode


def _crash_after_effects(url: str, sink: str, declaration: str) -> Ledger:
    """Handlers ran (effects exist), then the process died before recording them. In an
    idempotent stage the whole chunk ran first (outcomes are written per chunk); in a stage
    that is not, each outcome is written as soon as it is known, so the first write's crash
    leaves one effect unrecorded and the chunk's other items never started."""
    assert _run(url, sink, declaration, "run", "complete.before_commit:1:exit") == 137
    # (the next handler of a stage that is not idempotent may have started meanwhile)
    assert len(effects(sink)) in ((UNITS,) if declaration == "idempotent" else (1, 2))
    ledger = build(url, sink, declaration)
    deadline = time.monotonic() + 10
    run_id = ledger.runs()[0].run_id
    while ledger.store.outlook([run_id]).expired < UNITS:
        assert time.monotonic() < deadline, "the dead worker's leases never expired"
        time.sleep(0.05)
    return ledger


def _started(ledger: Ledger) -> int:
    """Claimed items whose handler had started when the worker died."""
    (st,) = ledger.runs()
    return sum(1 for i in ledger.items(st.run_id, state="claimed") if i.started_at is not None)


def test_expired_idempotent_stage_goes_back_to_pending_and_runs_again(
    db_url: str, tmp_path: Path
) -> None:
    sink = str(tmp_path / "sink.db")
    ledger = _crash_after_effects(db_url, sink, "idempotent")
    assert ledger.sweep().to_pending == UNITS
    assert _run(db_url, sink, "idempotent", "recover") == 0
    (st,) = ledger.runs()
    assert (st.state, st.processed) == ("completed", UNITS)
    assert set(Counter(effects(sink)).values()) == {2}  # at-least-once, keyed for dedup


def test_expired_verify_stage_asks_the_hook_and_never_resends(
    db_url: str, tmp_path: Path
) -> None:
    sink = str(tmp_path / "sink.db")
    ledger = _crash_after_effects(db_url, sink, "verify")
    ran = _started(ledger)  # the effects happened in these; one may have died before its effect
    assert 1 <= len(effects(sink)) <= ran <= 2
    report = ledger.sweep()
    # the started items are asked about; the ones never started simply go back to pending
    assert (report.to_unknown, report.verified, report.to_pending) == (ran, ran, UNITS - ran)
    assert _run(db_url, sink, "verify", "recover") == 0
    (st,) = ledger.runs()
    assert (st.state, st.processed) == ("completed", UNITS)
    assert sorted(Counter(effects(sink)).values()) == [1] * UNITS
    kinds = Counter(e.kind for e in ledger.events(st.run_id))
    assert kinds["verified"] == ran


def test_expired_plain_stage_becomes_unknown_until_a_person_resolves(
    db_url: str, tmp_path: Path
) -> None:
    sink = str(tmp_path / "sink.db")
    ledger = _crash_after_effects(db_url, sink, "plain")
    ran = _started(ledger)
    assert 1 <= len(effects(sink)) <= ran <= 2
    report = ledger.sweep()
    assert (report.to_unknown, report.to_pending) == (ran, UNITS - ran)
    (st,) = ledger.runs()
    assert st.state == "awaiting_repair"
    assert _run(db_url, sink, "plain", "recover") == 0  # a worker does not touch unknown items
    assert set(Counter(effects(sink)).values()) == {1}  # nothing ran twice
    people = [f for f in ledger.audit() if f.needs_person]
    assert {f.kind for f in people} == {"unknown"} and len(people) == ran
    for doubt in [i for i in ledger.items(st.run_id) if i.state == "unknown"]:
        assert doubt.started_at is not None
        done = f"{st.run_id}/send/{doubt.seq}" in effects(sink)
        assert ledger.resolve(st.run_id, "send", doubt.seq, "processed" if done else "pending",
                              note="checked the sink")
    assert _run(db_url, sink, "plain", "recover") == 0
    assert ledger.status(st.run_id).state == "completed"
    assert sorted(Counter(effects(sink)).values()) == [1] * UNITS


def test_retryable_failure_is_picked_up_by_a_worker_after_its_backoff(db_url: str) -> None:
    ledger = Ledger(db_url)
    job = ledger.job("flaky")
    job.decompose(lambda payload: (Item(key=k) for k in payload["keys"]))
    attempts: list[int] = []

    @job.stage("call", idempotent=True)
    def call(item: Any, ctx: Any) -> Any:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise Retry("downstream busy", delay=0.3)
        return ctx.attempt

    sub = job.submit({"keys": ["a"]}, key="f")
    report = ledger.work(concurrency=1, until_idle=True)  # waits for not_before, not a person
    assert (report.retried, report.processed, attempts) == (1, 1, [1, 2])
    story = ledger.history(sub.run_id, "call", 0)
    assert [e.kind for e in story.events] == ["retry_scheduled"]
    assert (story.item.attempts, story.item.result) == (2, 2)


def test_imported_run_without_items_is_decomposed_by_the_sweeper_once(db_url: str) -> None:
    ledger = Ledger(db_url)
    job = ledger.job("legacy")
    job.decompose(lambda payload: (Item(key=k) for k in payload["keys"]))
    job.stage("apply", idempotent=True)(lambda item, ctx: None)
    run, created = ledger.store.run_submit(NewRun("legacy", "imported-1", '{"keys":["a","b"]}'))
    assert created and ledger.status(run.id).state == "accepted"
    assert ledger.sweep(grace=0.0).redecomposed == 1
    assert ledger.sweep(grace=0.0).redecomposed == 0  # a run with items is never re-decomposed
    ledger.work(concurrency=1, until_idle=True)
    st = ledger.status(run.id)
    assert (st.state, st.total, st.counts) == ("completed", 2, {"apply": {"processed": 2}})
