"""An app for the tests of cluster-wide stage limits: ``--app limits_app:ledger``.

Payload ``{"n": N, "sink": PATH, "hold": SECONDS}`` becomes N items. Each handler appends
``<stage> <seq> <pid> <start> <end>`` (wall-clock seconds) to ``sink`` after holding for
``hold`` seconds, so a test sees when every execution ran and how many overlapped.

- ``paced``: stage ``call`` at most 25 a second over every worker (``rate_limit="25/s"``, the
  default burst of 1), with full history, so each claim is an event with the time its bucket
  was spent; then stage ``after``, not limited.
- ``capped``: stage ``call`` with at most 3 items claimed at once (``max_in_flight=3``).
- ``keyed``: stage ``call`` with at most one item per concurrency key claimed at once
  (``max_per_key=1``); item ``i`` has the key ``acct-<i % 4>``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from workledger import Item, Ledger

ledger = Ledger()
RATE = 25
CAP = 3


def _split(payload: dict[str, Any]) -> Any:
    for i in range(int(payload["n"])):
        yield Item(key=f"k{i}", data={"sink": payload["sink"],
                                      "hold": float(payload.get("hold", 0))})


def _note(item: Any, ctx: Any) -> None:
    start = time.time()
    if item.data["hold"]:
        time.sleep(item.data["hold"])
    with open(item.data["sink"], "a") as f:
        f.write(f"{ctx.stage} {item.seq} {os.getpid()} {start:.6f} {time.time():.6f}\n")


paced = ledger.job("paced", full_history=True)
paced.decompose(_split)
paced.stage("call", idempotent=True, rate_limit=f"{RATE}/s")(_note)
paced.stage("after", idempotent=True)(_note)

capped = ledger.job("capped")
capped.decompose(_split)
capped.stage("call", idempotent=True, max_in_flight=CAP)(_note)


def _split_keyed(payload: dict[str, Any]) -> Any:
    for i in range(int(payload["n"])):
        yield Item(key=f"k{i}", data={"sink": payload["sink"],
                                      "hold": float(payload.get("hold", 0))},
                   concurrency_key=f"acct-{i % 4}")


keyed = ledger.job("keyed")
keyed.decompose(_split_keyed)
keyed.stage("call", idempotent=True, max_per_key=1)(_note)
