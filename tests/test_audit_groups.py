"""audit groups findings of one kind, run, stage and path (issue 24, item 3): one dead chunk of
100 items is one line that says how many, not 100 near-identical rows; ``--items`` lists the
rows, and ``--json`` stays one object per finding (what ``/api/audit`` answers)."""

from __future__ import annotations

import json
import time

import pytest
from test_cli import Run, ok_json, wl  # noqa: F401 - wl: fixture

from workledger import Ledger
from workledger.storage.port import ClaimParams, LeaseParams

pytestmark = pytest.mark.integration


def body_rows(text: str) -> list[str]:
    """The table's rows, without the lines a long cell wraps onto."""
    return [line for line in text.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()]


def dead_chunk(wl: Run, db_url: str, n: int) -> int:  # noqa: F811
    """A run of ``n`` sends whose one chunk a dead worker held: every lease expired."""
    run_id = int(ok_json(wl("submit", "sends", "--payload", json.dumps({"n": n}), "--key",
                            "dead", "--json"))["run_id"])
    with Ledger(db_url) as led:
        claimed = led.store.items_claim(ClaimParams(run_id, n, 0.2))
        assert len(claimed) == n
        led.store.items_mark_started(LeaseParams(run_id, [c.id for c in claimed],
                                                 claimed[0].lease_token))
        deadline = time.monotonic() + 10
        while led.store.outlook([run_id]).expired < n:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    return run_id


def test_a_dead_chunk_is_one_line_that_counts_its_items(wl: Run, db_url: str) -> None:  # noqa: F811
    run_id = dead_chunk(wl, db_url, 100)
    audit = wl("audit")
    assert audit.returncode == 0, audit.stderr  # the sweeper moves them: no alert
    [row] = body_rows(audit.stdout)
    assert "expired_lease" in row and "100 items of send" in row and str(run_id) in row
    assert "sweeper: to unknown" in row
    assert "100 findings in 1 line; --items lists each" in audit.stdout
    rows = body_rows(wl("audit", "--items").stdout)
    assert len(rows) == 100 and all("expired_lease" in r for r in rows)
    assert {r.split("│")[3].strip() for r in rows} == {f"send/{seq}" for seq in range(100)}
    findings = json.loads(wl("audit", "--json").stdout)
    assert len(findings) == 100 and {f["seq"] for f in findings} == set(range(100))


def test_failures_group_by_stage_with_the_stage_wide_path_and_apart_when_reviewed(
    wl: Run,  # noqa: F811
) -> None:
    failing = int(ok_json(wl("submit", "numbers", "--payload", '{"n": 8, "fail": [1, 3, 5]}',
                             "--key", "f", "--json"))["run_id"])
    tolerated = int(ok_json(wl("submit", "tolerant", "--payload", '{"n": 5, "fail": [0, 2]}',
                               "--key", "t", "--json"))["run_id"])
    assert wl("worker", "--until-idle").returncode == 0
    audit = wl("audit")
    assert audit.returncode == 1  # the failures of the first run need a person
    rows = body_rows(audit.stdout)
    [failed] = [r for r in rows if f" {failing} " in r.split("│")[1] + " "]
    assert "3 items of double" in failed
    assert f"workledger retry {failing} --stage double" in failed and "--item" not in failed
    [reviewed] = [r for r in rows if f" {tolerated} " in r.split("│")[1] + " "]
    assert "2 items of second" in reviewed and "within tolerance" in reviewed
    assert audit.stdout.index("reviewed (not alerting)") < audit.stdout.index(reviewed)
    one = wl("ack", str(failing), "--stage", "double", "--item", "1", "--note", "known row")
    assert one.returncode == 0
    split = body_rows(wl("audit").stdout)
    assert any("2 items of double" in r for r in split)  # the reviewed one is apart now
    assert any("double/1" in r and "acknowledged" in r for r in split)
    assert len(body_rows(wl("audit", "--items").stdout)) == 5
