"""An app with a closing hook, for tests of the sweeper's closing pass from the command line:
``--app closing_app:ledger`` with ``tests/apps`` on the path. Job ``closing``: payload
``{"n": N}`` becomes N items of one idempotent stage; its closing hook does nothing, or raises
while the environment sets ``CLOSING_APP_FAIL`` (so its entry waits for a retry)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from workledger import Item, Ledger

ledger = Ledger()
closing = ledger.job("closing")


@closing.decompose
def split(payload: dict[str, Any]) -> Iterator[Item]:
    for i in range(payload["n"]):
        yield Item(key=f"c{i}")


@closing.stage("work", idempotent=True)
def work(item: Any, ctx: Any) -> None:
    return None


@closing.on_complete
def closed(status: Any) -> None:
    if os.environ.get("CLOSING_APP_FAIL"):
        raise RuntimeError("the downstream is down")
