"""The jobs ``benchmarks/execution.py`` measures (``--app exec_app:ledger``, this folder on the
import path, so handler processes can import it too).

- ``cpu``: each item does ``WORK`` rounds of pure-Python arithmetic (:func:`burn`), the same
  function ``multiprocessing.Pool`` runs for the comparison;
- ``first``: one item whose handler appends the time it started to ``$EXEC_BENCH_STARTS``;
- ``single`` / ``batched``: a no-op send in a stage that is not idempotent, one item per call or
  25 per call.
"""

from __future__ import annotations

import os
import time
from typing import Any

from workledger import BatchContext, Item, Ledger

WORK = 30_000  # rounds per item: about 2 ms of one core
BATCH = 25

ledger = Ledger()


def burn(i: int) -> int:
    total = 0
    for k in range(WORK):
        total += (k * i) % 7
    return total


def _items(payload: dict[str, Any]) -> Any:
    return (Item(key=f"i{i}", data={"i": i}) for i in range(int(payload["n"])))


cpu = ledger.job("cpu")
cpu.decompose(_items)
cpu.stage("burn", idempotent=True)(lambda item, ctx: burn(item.data["i"]))

first = ledger.job("first")
first.decompose(_items)


@first.stage("start", idempotent=True)
def start(item: Any, ctx: Any) -> None:
    with open(os.environ["EXEC_BENCH_STARTS"], "a") as f:
        f.write(f"{time.time()}\n")


single = ledger.job("single")
single.decompose(_items)
single.stage("send")(lambda item, ctx: None)

batched = ledger.job("batched")
batched.decompose(_items)


@batched.stage("send", batch=BATCH)
def send(items: list[Any], ctx: BatchContext) -> list[None]:
    return [None] * len(items)
