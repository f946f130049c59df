"""A message owed by a process whose clock runs ahead is still owed (SQLite, issue 21).

On SQLite every time is the writing process's clock. A broker worker whose wall clock ran 14
minutes ahead marked the items of a message as owed the next one from ``wait`` seconds after
*its* now: to every honest process the re-dispatch time lay 14 minutes in the future, and the
items sat pending with their message lost (the 1,000-fault campaign at 1344931, seed 20261204,
round 86). No honest writer puts a re-dispatch time further ahead than the item's own due time
(its backoff, a bucket's hold) plus 16 waits, so the sweeper treats one further ahead as
written by a clock ahead: owed now. Only the wall clock is faked, in a real process, as in
chaos/processes.py.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workledger import Item, Ledger
from workledger.storage.port import DispatchMark, ItemsQuery

pytestmark = pytest.mark.integration

WAIT = 2.0  # the ledger's redispatch_after, in seconds
ROOT = Path(__file__).resolve().parents[1]

MARK = """
import sys
from workledger import Ledger
from workledger.storage.port import DispatchMark
with Ledger(sys.argv[1]) as ledger:
    marked = ledger.store.items_mark_dispatched(
        DispatchMark(int(sys.argv[2]), "work", [int(s) for s in sys.argv[3].split(",")], 2.0))
    print(len(marked))
"""


def _libfaketime() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


def _ledger(url: str) -> Ledger:
    ledger = Ledger(url)
    job = ledger.job("sends")

    @job.decompose
    def split(payload: dict[str, Any]) -> Iterator[Item]:
        for i in range(4):
            yield Item(key=f"m{i}")

    @job.stage("work", idempotent=True)
    def work(item: Any, ctx: Any) -> None:
        return None

    return ledger


def _mark_ahead(url: str, run_id: int, seqs: list[int], library: str) -> None:
    env = dict(os.environ, LD_PRELOAD=library, FAKETIME="+14m",
               FAKETIME_DONT_FAKE_MONOTONIC="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "chaos" / "faketime_site"), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", MARK, url, str(run_id),
                           ",".join(map(str, seqs))], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == str(len(seqs)), done.stderr


@pytest.mark.skipif(_libfaketime() is None and not os.environ.get("CI"),
                    reason="faketime is not installed (apt-get install faketime)")
def test_items_marked_by_a_clock_ahead_are_owed_and_an_honest_mark_is_not(
        tmp_path: Path) -> None:
    library = _libfaketime()
    assert library is not None, "CI installs faketime (.ci/run)"
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with _ledger(url) as ledger:
        run_id = ledger.submit("sends", {}).run_id
        ledger.sweep()  # decomposed: four pending items
        seqs = sorted(i.seq for i in ledger.store.items_list(ItemsQuery(run_id, "work")))
        assert len(seqs) == 4
        ledger.store.items_mark_dispatched(DispatchMark(run_id, "work", seqs[:2], WAIT))
        _mark_ahead(url, run_id, seqs[2:], library)
        owed = ledger.store.items_owed(run_id, 10, WAIT)
        # the honest mark is owed in 4 s, not now; the one 14 minutes ahead is owed now
        assert sorted(seq for _, seq in owed) == seqs[2:]
        # a caller that does not say its wait (a read-only look) sees only what is due
        assert ledger.store.items_owed(run_id, 10) == []
