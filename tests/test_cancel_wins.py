"""A cancel wins over every path back to ``pending``, and the closing entry is never a unit.

Found by the model of the ledger (tests/model/): a release or an expired lease in a cancelled
run, or a decomposition still writing after the cancel, left an item ``pending`` that nothing
would ever claim (docs/design.md used to list this as a known gap); a cancel counted a pending
closing entry as a skipped unit; and redriving a failed closing hook took a unit off the run's
``failed`` counter that the hook had never added. Each case on both backends.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from writes_support import write_of

from workledger import Ledger, Permanent
from workledger._runtime.repair.reconcile import derive_projection
from workledger.core.status import CLOSE_STAGE
from workledger.storage.port import (
    ClaimedItem,
    ClaimParams,
    Finish,
    FinishParams,
    ItemRow,
    ItemsInsert,
    ItemsQuery,
    LeaseParams,
    NewItem,
    NewRun,
    ReclaimParams,
    RunRow,
    Store,
)

pytestmark = pytest.mark.contract

JOB, STAGE = "ingest", "generate"


def submit(store: Store, n: int, mark: bool = True) -> RunRow:
    run, _ = store.run_submit(NewRun(JOB, "k", json.dumps({"n": n})))
    insert(store, run.id, range(n))
    return store.run_mark_decomposed(run.id, STAGE) if mark else run


def insert(store: Store, run_id: int, seqs: Any, stage: str = STAGE) -> None:
    store.items_insert_many(ItemsInsert(run_id, stage, [NewItem(s, f"k{s}", None)
                                                        for s in seqs]))


def claim(store: Store, run_id: int, limit: int, lease: float = 60.0) -> list[ClaimedItem]:
    return store.items_claim(ClaimParams(run_id, limit, lease))


def items(store: Store, run_id: int) -> list[ItemRow]:
    return store.items_list(ItemsQuery(run_id))


def run_of(store: Store, run_id: int) -> RunRow:
    found = store.run_get(run_id)
    assert found is not None
    return found


def agrees(store: Store, run_id: int, stages: list[str]) -> bool:
    """The stored counters equal what reconcile derives from the items."""
    check = store.run_reconcile(run_id, derive_projection(stages), False, "test")
    return check.stored == check.derived and dict(check.stored_counts) == dict(
        check.ledger_counts)


def test_a_release_in_a_cancelled_run_skips_what_it_hands_back(store: Store) -> None:
    run = submit(store, 3)
    (held,) = claim(store, run.id, 1)
    assert store.run_cancel(run.id, "test", None) == 2
    assert store.items_release(LeaseParams(run.id, [held.id], held.lease_token)) == 1
    assert [(i.state, i.error) for i in items(store, run.id)] == [("skipped", "cancelled")] * 3
    stored = run_of(store, run.id)
    assert (stored.skipped, stored.completed_at is not None) == (3, True)
    assert agrees(store, run.id, [STAGE])


def test_a_lease_that_expires_in_a_cancelled_run_skips_the_item(store: Store) -> None:
    run = submit(store, 2)
    (held,) = claim(store, run.id, 1, lease=0.2)
    store.run_cancel(run.id, "test", None)
    deadline = time.monotonic() + 30
    moved: list[ItemRow] = []
    while not moved:  # poll: the lease runs out by the database's clock
        assert time.monotonic() < deadline, "the lease never expired"
        moved = store.leases_reclaim_expired(ReclaimParams(JOB, STAGE, "pending", "expired"))
        time.sleep(0.05)
    assert [i.id for i in moved] == [held.id]
    assert {(i.state, i.error) for i in items(store, run.id)} == {("skipped", "cancelled")}
    assert run_of(store, run.id).skipped == 2
    assert agrees(store, run.id, [STAGE])


def test_rows_a_decomposition_writes_after_the_cancel_are_skipped(store: Store) -> None:
    run = submit(store, 2, mark=False)
    assert store.run_cancel(run.id, "test", None) == 2
    insert(store, run.id, range(2, 4))  # the decomposer was still writing
    assert {i.state for i in items(store, run.id)} == {"skipped"}
    marked = store.run_mark_decomposed(run.id, STAGE)
    assert (marked.total, marked.skipped, marked.completed_at is not None) == (4, 4, True)
    assert agrees(store, run.id, [STAGE])


def test_a_cancelled_run_whose_decomposer_died_counts_the_rows_it_wrote(store: Store) -> None:
    """The decomposer died after two batches (one row a decomposer's skip) and the run was
    cancelled before the sweeper resumed it: nobody ever marks a cancelled run decomposed, so
    the counters must count those rows already, as reconcile does."""
    run = submit(store, 0, mark=False)
    insert(store, run.id, range(3))
    store.items_insert_many(ItemsInsert(run.id, STAGE, [NewItem(3, "k3", None, "skipped",
                                                                "no address")]))
    assert store.run_cancel(run.id, "test", None) == 3
    stored = run_of(store, run.id)
    assert (stored.total, stored.skipped, stored.decomposed_at) == (4, 4, None)
    assert agrees(store, run.id, [STAGE])


def test_a_cancel_does_not_count_the_closing_entry_as_a_skipped_unit(store: Store) -> None:
    run = submit(store, 1)
    (c,) = claim(store, run.id, 1)
    store.items_finish_if_leased(FinishParams(run.id, [Finish(
        c.id, c.lease_token, write_of("processed"))]))
    insert(store, run.id, [0], stage=CLOSE_STAGE)  # the sweeper is about to close it
    assert store.run_cancel(run.id, "test", None) == 1
    stored = run_of(store, run.id)
    assert (stored.processed, stored.skipped) == (1, 0)
    assert agrees(store, run.id, [STAGE])


@pytest.mark.integration
def test_a_redriven_closing_hook_runs_again_and_the_counters_stay_right(db_url: str) -> None:
    ledger = Ledger(db_url)
    job = ledger.job(JOB)
    calls: list[int] = []

    @job.decompose
    def split(payload: dict[str, int]) -> Any:
        from workledger import Item
        return (Item(key=str(i)) for i in range(payload["n"]))

    @job.stage(STAGE, idempotent=True)
    def handle(item: Any, ctx: Any) -> None:
        return None

    @job.on_complete
    def close(status: Any) -> None:
        calls.append(status.run_id)
        if len(calls) == 1:
            raise Permanent("the report server is down")

    run_id = job.submit({"n": 2}).run_id
    ledger.work(concurrency=1, lease=5.0)
    ledger.sweep(grace=0)
    (closing,) = ledger.items(run_id, stage=CLOSE_STAGE)
    assert closing.state == "failed"
    assert ledger.retry(run_id, stage=CLOSE_STAGE) == 1
    check = ledger.reconcile(run_id, dry_run=True)
    assert check.stored == check.derived
    ledger.sweep(grace=0)
    (closing,) = ledger.items(run_id, stage=CLOSE_STAGE)
    assert (closing.state, calls) == ("processed", [run_id, run_id])
    assert ledger.status(run_id).state == "completed"
    ledger.close()
