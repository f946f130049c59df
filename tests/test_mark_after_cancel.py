"""A decomposition's mark that waits behind a cancel must count what the cancel skipped.

Chaos campaign, PostgreSQL seed 20261204 round 12: run 4's 25 pending items were skipped by a
cancel while its submitter was marking it decomposed; the stored counters kept skipped=4 (the
decomposer's skips) and no completion. run_mark_decomposed's UPDATE took its snapshot, then
waited for the run row the cancel held; under READ COMMITTED it then updated the new row
version with the subqueries' values from the old snapshot.
"""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest

from workledger.storage import open_store
from workledger.storage.port import ItemsInsert, NewItem, NewRun

pytestmark = pytest.mark.concurrency


def test_a_mark_that_waited_behind_a_cancel_counts_the_cancelled_items(pg_url: str) -> None:
    store = open_store(pg_url)
    store.migrate()
    try:
        run, _ = store.run_submit(NewRun("ingest", "k", json.dumps({"n": 3})))
        store.items_insert_many(ItemsInsert(run.id, "generate",
                                            [NewItem(s, f"k{s}", None) for s in range(3)]))
        go, in_cancel = threading.Event(), threading.Event()
        count = store._count  # the cancel's last statement: its run row is locked by then

        def held(conn, run_id, tally):  # type: ignore[no-untyped-def]
            count(conn, run_id, tally)
            in_cancel.set()
            assert go.wait(10)

        store._count = held  # type: ignore[method-assign]
        cancel = threading.Thread(target=store.run_cancel, args=(run.id, "test", None))
        cancel.start()
        assert in_cancel.wait(10)
        store._count = count  # type: ignore[method-assign]
        marked: list[object] = []
        mark = threading.Thread(target=lambda: marked.append(
            store.run_mark_decomposed(run.id, "generate")))
        mark.start()
        with psycopg.connect(pg_url, autocommit=True) as watch:  # the mark waits for the lock
            deadline = time.monotonic() + 10
            while not watch.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = "
                                    "'Lock' AND query LIKE '%%decomposed_at%%'").fetchone():
                assert time.monotonic() < deadline, "the mark never waited for the cancel"
                time.sleep(0.02)
        go.set()
        cancel.join(10)
        mark.join(10)
        stored = store.run_get(run.id)
        assert stored is not None
        assert (stored.total, stored.skipped) == (3, 3)
        assert stored.completed_at is not None
    finally:
        store.close()
