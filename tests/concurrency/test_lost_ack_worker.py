"""A real worker process whose COMMITs lose their answers, one after another (PostgreSQL).

The worker (``procs.py``, a stage that is not idempotent) reaches the server through the TCP
proxy of ``tests/net_faults.py``, armed again after each cut: claims, start marks, finishes and
heartbeats each commit and never hear so. Every item must be run once and recorded once, with
no stale result, no expired lease and no attempt charged twice (``storage/doubt.py``).
"""

from __future__ import annotations

import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from net_faults import CommitCutter

from workledger.storage import open_store
from workledger.storage.port import ItemsQuery

from . import procs

pytestmark = pytest.mark.concurrency

CUTS = 12


@pytest.fixture
def cutter(pg_url: str) -> Iterator[CommitCutter]:
    parts = urlsplit(pg_url)
    proxy = CommitCutter(parts.port or 5432, parts.hostname or "127.0.0.1")
    yield proxy
    proxy.close()


def keep_cutting(cutter: CommitCutter, stop: threading.Event) -> None:
    for n in range(1, CUTS + 1):
        cutter.arm("after", writes_only=True)
        while not cutter.wait_cut(n, timeout=0.2):
            if stop.is_set():
                return


def test_a_worker_whose_commits_lose_their_answers_runs_and_records_each_item_once(
        pg_url: str, cutter: CommitCutter, tmp_path: Path) -> None:
    sink = tmp_path / "effects.db"
    procs.sink_init(sink)
    ledger = procs.build_ledger(pg_url, sink, idempotent=False)
    try:
        run_id = ledger.job(procs.JOB).submit({"n": 30}).run_id
    finally:
        ledger.close()
    ready, go = tmp_path / "ready", tmp_path / "go"
    argv = procs.worker_command(cutter.url(pg_url), sink, concurrency=2, chunk=5, lease=30.0,
                                idempotent=False, ready_file=ready, go_file=go)
    with open(tmp_path / "w.out", "wb") as out, open(tmp_path / "w.err", "wb") as err:
        worker = subprocess.Popen(argv, stdout=out, stderr=err)
    stop = threading.Event()
    arming = threading.Thread(target=keep_cutting, args=(cutter, stop), daemon=True)
    try:
        for _ in range(600):
            if ready.exists():
                break
            threading.Event().wait(0.05)
        arming.start()  # the worker's own start-up (migrate, reads) is left alone
        go.write_text("go")
        rc = worker.wait(120)
    finally:
        stop.set()
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    stderr = (tmp_path / "w.err").read_text()[-4000:]
    assert rc == 0, stderr
    assert cutter.cuts >= 6, f"only {cutter.cuts} COMMITs cut"

    effects = Counter(e["item_key"] for e in procs.sink_effects(sink))
    assert sorted(effects) == sorted(f"k{i}" for i in range(30))
    assert set(effects.values()) == {1}, effects  # each effect once
    store = open_store(pg_url)
    try:
        items = store.items_list(ItemsQuery(run_id))
        assert {i.state for i in items} == {"processed"}
        assert {i.attempts for i in items} == {1}
        kinds = Counter(e.kind for e in store.events_list(run_id))
        assert kinds["stale_result"] == 0 and kinds["lease_expired"] == 0, kinds
    finally:
        store.close()
