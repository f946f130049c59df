"""A write that arrives after its run was pruned leaves nothing behind (issue 21, item 9).

Before, a worker stopped past its lease and resumed after the run had been finished by
another worker and pruned wrote its ``stale_result`` events for a run that no longer existed,
and nothing ever removed them. Every event is now written only while its run exists (the
insert reads the run row, and on PostgreSQL holds it against a concurrent prune until it
commits). Real processes, both backends; then the other late writers through the port."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from writes_support import write_of

from workledger._runtime.repair import retention
from workledger.storage.port import ClaimParams, Finish, FinishParams, ItemsQuery, NewEvent

from . import procs
from .test_processes import (
    Proc,
    lose_holder,
    make_ledger,  # noqa: F401 - a fixture
    sink,  # noqa: F401 - a fixture
    spawn,  # noqa: F401 - a fixture
    stop_outside_transaction,
    tagged_url,
    wait_until,
)

pytestmark = pytest.mark.concurrency


def events_of(ledger: Any, run_id: int) -> int:
    return len(ledger.store.events_page(run_id, 0, 1000))


def test_a_stale_worker_resumed_after_the_prune_writes_no_event_of_the_pruned_run(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path,  # noqa: F811
    db_url: str,
) -> None:
    n = 3
    ledger = make_ledger()
    run_id = ledger.job(procs.JOB).submit({"n": n}).run_id
    stale = spawn(procs.worker_command(tagged_url(db_url, "wl-late"), sink, concurrency=n,
                                       chunk=n, lease=1.5, block=3.0), name="stale")
    wait_until(lambda: procs.sink_count(sink) == n, "the first worker running its chunk")
    stop_outside_transaction(stale, db_url, "wl-late")
    lose_holder(db_url, "wl-late")  # a stopped worker that lives keeps its items otherwise

    fresh = spawn(procs.worker_command(db_url, sink, concurrency=n, chunk=n, lease=1.5),
                  name="fresh")
    assert fresh.wait_ok()["processed"] == n  # after the leases expired and were taken back
    report = retention.prune(ledger.store, ledger.jobs, 0.0)
    assert report.runs == [run_id] and ledger.store.run_get(run_id) is None
    assert events_of(ledger, run_id) == 0

    stale.signal(signal.SIGCONT)  # its handlers end, their results arrive late
    assert stale.wait_ok()["stale"] == n
    assert events_of(ledger, run_id) == 0
    assert ledger.store.items_list(ItemsQuery(run_id, None, None, 10, 0)) == []


def test_no_late_writer_leaves_an_event_of_a_pruned_run(
    make_ledger: Callable[..., Any],  # noqa: F811
) -> None:
    """The same through the port: a stale finish, a direct event (``ack``, the sweeper's
    ``sweep_failed``) and a claim, each after the prune."""
    ledger = make_ledger()
    store = ledger.store
    run_id = ledger.job(procs.JOB).submit({"n": 2}).run_id
    claimed = store.items_claim(ClaimParams(run_id, 1, 0.01, actor="late"))
    ledger.work(until_idle=True)  # the other item, then the expired one taken back
    assert ledger.status(run_id).complete
    assert retention.prune(store, ledger.jobs, 0.0).runs == [run_id]

    item = claimed[0]
    store.items_finish_if_leased(FinishParams(run_id, [Finish(
        item.id, item.lease_token or 0, write_of("processed"), result='{"late": true}')],
        "late"))
    store.events_add([NewEvent(run_id, "acknowledged", actor="late")])
    assert store.items_claim(ClaimParams(run_id, 10, 30.0, actor="late")) == []
    assert events_of(ledger, run_id) == 0


def test_an_event_committed_while_its_run_is_pruned_goes_with_the_run(
    sink: Path, pg_url: str,  # noqa: F811
) -> None:
    """PostgreSQL: an event insert that began before the prune's delete holds the run row, so
    the delete waits for its commit and the prune then deletes the event with the others."""
    import threading

    import psycopg

    ledger = procs.build_ledger(pg_url, sink)
    run_id = ledger.job(procs.JOB).submit({"n": 1}).run_id
    ledger.work(until_idle=True)
    late = psycopg.connect(pg_url)  # one open transaction, as a slow writer's
    late.execute(ledger.store.Q["events_add"], {
        "run_id": run_id, "item_id": None, "kind": "acknowledged", "lease_token": None,
        "actor": "late", "detail": None})
    pruned: list[Any] = []
    pruner = threading.Thread(target=lambda: pruned.append(
        retention.prune(ledger.store, ledger.jobs, 0.0)))
    pruner.start()
    with psycopg.connect(pg_url, autocommit=True) as watch:
        wait_until(lambda: watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%%DELETE FROM wl_runs%%'"
        ).fetchone()[0] == 1, "the prune's delete to wait for the event's transaction")
    late.commit()
    late.close()
    pruner.join(30)
    assert pruned[0].runs == [run_id]
    assert events_of(ledger, run_id) == 0
    ledger.close()
