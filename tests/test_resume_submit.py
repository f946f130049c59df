"""Submitting again the key of a run whose decomposition was cut short (a crash, a full disk)
carries the decomposition on, checked against the rows already written (issue 12)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from workledger import Item, Ledger
from workledger.errors import DecompositionFailed

pytestmark = pytest.mark.integration


class Crash(BaseException):
    """Stands for the process dying mid-decomposition: nothing records it on the run."""


def _ledger(db_url: str, source: list[str], crash_at: list[int]) -> Ledger:
    ledger = Ledger(db_url)
    job = ledger.job("events")
    job.batch_size = 2  # rows are written two at a time

    @job.decompose
    def split(payload: Any) -> Iterator[Item]:
        for i, key in enumerate(source):
            if crash_at and i == crash_at[0]:
                crash_at.clear()
                raise Crash
            yield Item(key=key)

    job.stage("apply", idempotent=True)(lambda item, ctx: None)
    return ledger


def test_the_same_key_resumes_a_cut_short_decomposition(db_url: str) -> None:
    source = [f"a{i}" for i in range(7)]
    ledger = _ledger(db_url, source, crash_at=[5])
    try:
        with pytest.raises(Crash):
            ledger.submit("events", {"day": 1}, key="day-1")
        run = ledger.status(1)
        assert (run.state, run.total) == ("accepted", 4)  # two batches were written
        again = ledger.submit("events", {"day": 1}, key="day-1")
        assert (again.created, again.resumed) == (False, True)
        assert (again.status.state, again.status.total) == ("running", 7)
        assert [i.key for i in ledger.items(1)] == source  # no row written twice
        third = ledger.submit("events", {"day": 1}, key="day-1")
        assert (third.resumed, third.status.total) == (False, 7)  # nothing left to carry on
    finally:
        ledger.close()


def test_a_source_that_changed_meanwhile_fails_the_run_instead_of_mixing_two_versions(
    db_url: str,
) -> None:
    source = [f"a{i}" for i in range(6)]
    ledger = _ledger(db_url, source, crash_at=[3])
    try:
        with pytest.raises(Crash):
            ledger.submit("events", {"day": 2}, key="day-2")
        source[:] = [f"b{i}" for i in range(6)]
        with pytest.raises(DecompositionFailed, match="output changed"):
            ledger.submit("events", {"day": 2}, key="day-2")
        assert ledger.status(1).state == "failed"
        assert [i.key for i in ledger.items(1)] == ["a0", "a1"]
    finally:
        ledger.close()
