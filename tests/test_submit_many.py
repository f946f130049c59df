"""``job.submit_many([(payload, key), ...])`` and ``workledger submit JOB --many FILE`` (issue 25):
many runs recorded and decomposed in one transaction, each with its own key and the answers
``submit`` gives to a repeated key; bad input writes nothing. On SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_cli import cli_cmd, cli_env

from workledger import Item, Ledger, Skip
from workledger.errors import BadInput, DecompositionFailed, PayloadMismatch

pytestmark = pytest.mark.integration


def _split(payload: dict[str, Any]) -> Any:
    if payload.get("boom"):
        raise ValueError("the source is down")
    for i in range(payload["n"]):
        yield Skip(key=f"s{i}", reason="not today") if payload.get("skip") == i else Item(
            key=f"u{i}", data={"i": i})


def _ledger(db_url: str) -> Ledger:
    ledger = Ledger(db_url)
    job = ledger.job("bulk")
    job.decompose(_split)
    job.stage("go", idempotent=True)(lambda item, ctx: None)
    return ledger


@pytest.fixture
def ledger(db_url: str) -> Any:
    led = _ledger(db_url)
    try:
        yield led
    finally:
        led.close()


def test_many_runs_are_recorded_decomposed_and_answered_in_order(ledger: Ledger) -> None:
    job = ledger.job("bulk")
    subs = job.submit_many([({"n": 3}, "a"), ({"n": 2, "skip": 1}, "b"), ({"n": 0}, "c")],
                           priority=5)
    assert [s.created for s in subs] == [True, True, True]
    assert [s.status.key for s in subs] == ["a", "b", "c"]
    assert len({s.run_id for s in subs}) == 3
    assert [(s.status.total, s.status.skipped) for s in subs] == [(3, 0), (2, 1), (0, 0)]
    # each answer is the run's real state, the same a status read gives
    for s in subs:
        assert s.status == ledger.status(s.run_id)
        assert s.status.priority == 5
    assert subs[2].state == "completed" and subs[0].state == "running"
    assert [(e.kind, e.detail) for e in ledger.store.events_list(subs[1].run_id)] == [
        ("submitted", {"key": "b"}), ("decomposed", {"total": 2})]
    report = ledger.work(concurrency=1, chunk=50, until_idle=True)
    assert report.processed == 4
    assert all(ledger.status(s.run_id).complete for s in subs)


def test_a_repeated_key_answers_like_submit(ledger: Ledger) -> None:
    job = ledger.job("bulk")
    first = job.submit({"n": 1}, key="old")
    subs = job.submit_many([({"n": 1}, "old"), ({"n": 2}, "new"), ({"n": 2}, "new")])
    assert [s.created for s in subs] == [False, True, False]
    assert subs[0].run_id == first.run_id and subs[1].run_id == subs[2].run_id
    assert subs[0].status == ledger.status(first.run_id)
    again = job.submit_many([({"n": 2}, "new")])
    assert (again[0].run_id, again[0].created) == (subs[1].run_id, False)
    assert len(ledger.runs()) == 2


@pytest.mark.parametrize("batch", [
    [({"n": 1}, "fresh"), ({"n": 9}, "old")],  # the same key as a run recorded before
    [({"n": 1}, "fresh"), ({"n": 2}, "twice"), ({"n": 3}, "twice")],  # twice in the batch
])
def test_a_key_with_another_payload_is_refused_and_nothing_is_written(
        ledger: Ledger, batch: list[Any]) -> None:
    job = ledger.job("bulk")
    job.submit({"n": 1}, key="old")
    with pytest.raises(PayloadMismatch, match="different payload"):
        job.submit_many(batch)
    assert [r.key for r in ledger.runs()] == ["old"]


def test_a_failing_decomposer_or_a_bad_key_writes_nothing(ledger: Ledger) -> None:
    job = ledger.job("bulk")
    with pytest.raises(DecompositionFailed, match="the source is down") as failed:
        job.submit_many([({"n": 1}, "a"), ({"n": 1, "boom": True}, "b")])
    assert "key 'b'" in str(failed.value)
    with pytest.raises(BadInput):
        job.submit_many([({"n": 1}, "a"), ({"n": 1}, "x" * 2000)])
    with pytest.raises(BadInput):
        job.submit_many([({"n": 1}, "a"), "not a pair"])  # type: ignore[list-item]
    assert ledger.runs() == []
    assert job.submit_many([]) == []


def test_many_runs_in_one_call_stay_correct_when_drained(ledger: Ledger) -> None:
    job = ledger.job("bulk")
    subs = job.submit_many([({"n": 2}, f"r{i}") for i in range(1500)])
    assert len({s.run_id for s in subs}) == 1500
    assert all(s.created and s.status.total == 2 for s in subs)
    ledger.work(concurrency=1, chunk=500, until_idle=True)
    for s in subs[::150]:
        checked = ledger.reconcile(s.run_id, dry_run=True)
        assert checked.stored == checked.derived and checked.stored_counts == (
            checked.ledger_counts)
        assert ledger.status(s.run_id).processed == 2


# -- the CLI -----------------------------------------------------------------------------------


def _cli(db_url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_cmd("--db", db_url, "--app", "claims_app:ledger", *args),
                          cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=120)


def test_the_cli_submits_json_lines_and_refuses_a_bad_line_whole(
        db_url: str, tmp_path: Path) -> None:
    sink = str(tmp_path / "calls.log")
    lines = tmp_path / "runs.jsonl"
    lines.write_text("".join(json.dumps({"payload": {"n": 2, "sink": sink}, "key": f"k{i}"})
                             + "\n" for i in range(30)) + "\n")  # a blank line is nothing
    got = _cli(db_url, tmp_path, "submit", "notes", "--many", str(lines), "--json")
    assert got.returncode == 0, got.stderr
    body = json.loads(got.stdout)
    assert [b["key"] for b in body] == [f"k{i}" for i in range(30)]
    assert all(b["created"] and b["total"] == 2 for b in body)
    plain = _cli(db_url, tmp_path, "submit", "notes", "--many", str(lines))
    assert plain.returncode == 0, plain.stderr
    assert "30 runs: 0 recorded, 30 already there" in plain.stdout
    for bad in ('{"payload": {"n": 1, "sink": "x"}, "key": "z"}\n{"key": "no payload"}\n',
                '{"payload": {"n": 1, "sink": "x"}, "key": "z"}\nnot json\n',
                '{"payload": {"n": 1, "sink": "x"}, "key": "z"}\n[1, 2]\n',
                '{"payload": {"n": 1, "sink": "x"}, "key": "z", "extra": 1}\n'):
        lines.write_text(bad)
        refused = _cli(db_url, tmp_path, "submit", "notes", "--many", str(lines))
        assert refused.returncode == 2, refused
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "line" in refused.stderr
    both = _cli(db_url, tmp_path, "submit", "notes", "--many", str(lines), "--payload", "{}")
    assert both.returncode == 2 and "--many" in both.stderr
    listed = _cli(db_url, tmp_path, "runs", "--json", "--limit", "100")
    assert len(json.loads(listed.stdout)) == 30  # nothing of the refused files was written
