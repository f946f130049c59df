"""The message a broker carries (identity only) and the options of a dispatch, without a
broker or a database: what is accepted, what is refused, and in which words."""

from __future__ import annotations

from typing import Any

import pytest

from workledger import Ledger
from workledger._runtime.broker.dispatch import BrokerDispatch, DispatchOptions, Message, chunks
from workledger.errors import BadInput, UsageError

pytestmark = pytest.mark.unit


def test_a_message_names_items_and_nothing_else() -> None:
    m = Message("shop.jobs:ledger", "invoices", 42, "render", (3, 4, 9), delay=2.5)
    body = m.body()
    assert body == {"v": 1, "app": "shop.jobs:ledger", "job": "invoices", "run": 42,
                    "stage": "render", "seqs": [3, 4, 9]}
    assert Message.from_body(body) == Message("shop.jobs:ledger", "invoices", 42, "render",
                                              (3, 4, 9))  # the delay is the broker's


def test_a_held_back_message_names_when_its_items_are_held_until() -> None:
    m = Message("shop.jobs:ledger", "invoices", 42, "render", (3,), delay=0.1,
                held=1_796_300_000_123)
    assert m.body()["held"] == 1_796_300_000_123
    assert Message.from_body(m.body()) == Message("shop.jobs:ledger", "invoices", 42, "render",
                                                  (3,), held=1_796_300_000_123)


@pytest.mark.parametrize("body", [
    None, [], "text", {"v": 2, "app": "a:b", "job": "j", "run": 1, "stage": "s", "seqs": []},
    {"v": 1, "app": "a:b", "job": "j", "run": "1", "stage": "s", "seqs": [1]},
    {"v": 1, "app": "a:b", "job": "j", "run": 1, "stage": "s", "seqs": [1, True]},
    {"v": 1, "app": "a:b", "job": "j", "run": -1, "stage": "s", "seqs": [1]},
    {"v": 1, "app": "a:b", "job": "j", "run": 1, "stage": "s", "seqs": [2**63]},
    {"v": 1, "app": "a:b", "job": "j", "run": 1, "stage": "s", "seqs": list(range(10_001))},
    {"v": 1, "app": "a:b", "job": "j", "run": 1, "seqs": [1]},
    {"v": 1, "app": 7, "job": "j", "run": 1, "stage": "s", "seqs": [1]},
    {"v": 1, "app": "a:b", "job": "j", "run": 1, "stage": "s", "seqs": [1], "held": 1.5},
])
def test_anything_but_a_message_is_refused_in_one_line(body: Any) -> None:
    with pytest.raises(BadInput) as err:
        Message.from_body(body)
    assert "\n" not in str(err.value) and "workledger message" in str(err.value)


def test_chunks_cut_seqs_into_messages_of_at_most_the_chunk() -> None:
    assert list(chunks([1, 2, 3, 4, 5], 2)) == [(1, 2), (3, 4), (5,)]
    assert list(chunks([], 2)) == []


def test_redispatch_after_is_twice_the_lease_unless_given() -> None:
    assert DispatchOptions(lease=10).wait == 20
    assert DispatchOptions(lease=10, redispatch_after=3).wait == 3


@pytest.mark.parametrize("options", [{"chunk": 0}, {"chunk": 10_001}, {"lease": 0},
                                     {"lease": 86_401}, {"concurrency": 0},
                                     {"redispatch_after": 0}])
def test_options_out_of_range_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        DispatchOptions(**options)


def test_a_dispatch_serves_one_ledger(tmp_path: Any) -> None:
    dispatch = BrokerDispatch("q")
    Ledger(f"sqlite:///{tmp_path / 'a.db'}", dispatch=dispatch)
    with pytest.raises(UsageError, match="another ledger"):
        Ledger(f"sqlite:///{tmp_path / 'b.db'}", dispatch=dispatch)


def test_a_ledger_without_a_broker_refuses_a_message(tmp_path: Any) -> None:
    with pytest.raises(UsageError, match="no broker"):
        Ledger(f"sqlite:///{tmp_path / 'a.db'}").deliver({"v": 1})


@pytest.mark.integration
def test_a_ledger_its_workers_could_not_import_is_refused_before_anything_is_claimable(
        sqlite_url: str) -> None:
    from workledger import Item

    ledger = Ledger(sqlite_url, dispatch=BrokerDispatch("q"))  # made here: no module holds it
    job = ledger.job("local")
    job.decompose(lambda payload: (Item(key=str(i)) for i in range(3)))
    job.stage("only")(lambda item, ctx: None)
    with pytest.raises(UsageError, match="app='module:attribute'"):
        job.submit({"n": 3})
    (run,) = ledger.runs()
    assert run.state == "accepted" and run.decomposed_at is None  # nothing was claimable
    ledger.close()


def test_a_celery_worker_imports_nothing_a_message_names() -> None:
    from workledger.contrib.celery import deliver

    body = {"v": 1, "app": "a_module_nobody_imported:ledger", "job": "j", "run": 1,
            "stage": "s", "seqs": [0]}
    with pytest.raises(UsageError, match="has not imported"):
        deliver(body)
    import sys

    assert "a_module_nobody_imported" not in sys.modules


def test_a_message_must_name_a_ledger() -> None:
    from workledger.contrib.celery import deliver

    with pytest.raises(UsageError, match="not a Ledger"):
        deliver({"v": 1, "app": "workledger.api:ITEM_STATES", "job": "j", "run": 1,
                 "stage": "s", "seqs": [0]})
