"""An app for the tests of the claim order (priorities): ``--app claims_app:ledger``.

Payload ``{"n": N, "sink": PATH, "hold": SECONDS}`` becomes N items. Each handler holds for
``hold`` seconds and appends ``<run_id> <seq> <pid> <start> <end>`` (wall-clock seconds) to
``sink``, so a test sees which run's items ran when.
"""

from __future__ import annotations

import os
import time
from typing import Any

from limits_app import _split  # the same payload: {"n", "sink", "hold"}

from workledger import Ledger

ledger = Ledger()


def _note(item: Any, ctx: Any) -> None:
    start = time.time()
    if item.data["hold"]:
        time.sleep(item.data["hold"])
    with open(item.data["sink"], "a") as f:
        f.write(f"{ctx.run_id} {item.seq} {os.getpid()} {start:.6f} {time.time():.6f}\n")


notes = ledger.job("notes")
notes.decompose(_split)
notes.stage("note", idempotent=True)(_note)
