"""wl_stage_counts, the projection status reads (migration 0002), on both backends.

Every test on a ledger database already ends by checking that the counts equal the items'
GROUP BY (conftest). These tests cover what that check cannot see: the order status lists
stages in when no job definition is loaded, and reconcile while workers move the counts.
"""

from __future__ import annotations

import threading
import time

import pytest
from writes_support import write_of

from workledger import Item, Ledger, Permanent
from workledger.storage.port import ClaimParams, Finish, FinishParams

pytestmark = pytest.mark.integration


def _two_stage(ledger: Ledger, first: str, second: str, hold: threading.Event | None = None
               ) -> None:
    job = ledger.job("two")
    job.decompose(lambda p: (Item(key=i) for i in range(p["n"])))
    job.stage(first, idempotent=True)(lambda item, ctx: None)

    def later(item: object, ctx: object) -> None:
        if hold is not None:
            hold.wait(30)

    job.stage(second, after=first, idempotent=True)(later)


def test_status_without_the_job_lists_stages_in_the_order_they_ran(db_url: str) -> None:
    """The second stage's name sorts first ('deliver' < 'generate'), and the first stage's
    pending and claimed counts have dropped to 0: status must still know which came first."""
    with Ledger(db_url) as ledger:
        _two_stage(ledger, "generate", "deliver")
        run_id = ledger.job("two").submit({"n": 6}).run_id
        claimed = ledger.store.items_claim(ClaimParams(run_id, 10, 30.0))
        assert {c.stage for c in claimed} == {"generate"} and len(claimed) == 6
        ledger.store.items_finish_if_leased(FinishParams(run_id, [
            Finish(c.id, c.lease_token, write_of("processed", False), next_stage="deliver")
            for c in claimed]))
    with Ledger(db_url) as bare:  # no job definitions: stages come from the ledger
        status = bare.status(run_id)
        assert list(status.counts) == ["generate", "deliver"]
        assert status.counts == {"generate": {"processed": 6}, "deliver": {"pending": 6}}
        assert (status.total, status.processed, status.complete) == (6, 0, False)


def test_reconcile_while_a_worker_drains_finds_nothing_to_repair(db_url: str) -> None:
    """Claims and finishes move the counts while reconcile compares them with the items: it
    must neither see a difference that is not there nor write one (repair mode)."""
    with Ledger(db_url) as ledger:
        _two_stage(ledger, "a", "b")
        run_id = ledger.job("two").submit({"n": 3000}).run_id
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            with Ledger(db_url) as worker_ledger:
                _two_stage(worker_ledger, "a", "b")
                worker_ledger.work(concurrency=1, chunk=40, until_idle=True)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=drain)
    thread.start()
    checks = 0
    with Ledger(db_url) as operator:
        _two_stage(operator, "a", "b")
        while thread.is_alive() or checks < 3:
            dry = operator.reconcile(run_id, dry_run=True)
            assert dry.stored_counts == dry.ledger_counts, (dry.stored_counts, dry.ledger_counts)
            assert not operator.reconcile(run_id).repaired
            checks += 1
            time.sleep(0.005)
        thread.join(60)
        assert not errors, errors
        final = operator.status(run_id)
    assert final.state == "completed" and final.processed == 3000
    assert checks >= 3


def test_a_run_keeps_the_tolerance_it_was_submitted_under(db_url: str) -> None:
    """status without the job definition (the CLI without --app) judges failures by the
    tolerance recorded with the run (migration 0003), not by tolerance 0."""
    with Ledger(db_url) as ledger:
        job = ledger.job("lenient", tolerate=0.25)
        job.decompose(lambda p: (Item(key=i) for i in range(p["n"])))

        @job.stage("apply", idempotent=True)
        def apply(item: object, ctx: object) -> None:
            if getattr(item, "seq", 0) == 0:
                raise Permanent("no such account")

        run_id = job.submit({"n": 4}).run_id
        ledger.work(concurrency=1, until_idle=True)
        assert ledger.status(run_id).state == "completed_with_failures"
    with Ledger(db_url) as bare:  # no job definitions loaded
        status = bare.status(run_id)
        assert (status.state, status.failed, status.processed) == (
            "completed_with_failures", 1, 3)
    with Ledger(db_url) as strict:  # a different definition does not rewrite the run's terms
        strict.job("lenient", tolerate=0).decompose(lambda p: iter(()))
        assert strict.status(run_id).state == "completed_with_failures"
