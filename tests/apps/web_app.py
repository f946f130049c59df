"""The jobs the HTTP tests use: ``--app web_app:ledger`` with ``tests/apps`` on the path, or
``build(url)`` for a ledger of their own in-process (the same definitions).

``numbers``: payload ``{"n": N, "skip": [...], "fail": [...], "sleep": seconds}`` becomes N
items (idempotent stage ``double``): those in ``skip`` skipped at decomposition, those in
``fail`` fail permanently ("odd one out") while the file named by ``WEB_APP_FAIL_OFF`` does
not exist, the rest doubled after sleeping. ``sends``: one item per ``n``, stage ``send`` not
idempotent and without a verify hook, so a lost holder leaves it ``unknown``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workledger import Context, Item, ItemView, Ledger, Permanent, Skip


def build(url: str | None = None) -> Ledger:
    ledger = Ledger(url)
    numbers = ledger.job("numbers")

    @numbers.decompose
    def split(payload: dict[str, Any]) -> Iterator[Item | Skip]:
        for i in range(payload.get("n", 10)):
            if i in payload.get("skip", []):
                yield Skip(key=f"n{i}", reason="unwanted number")
            else:
                yield Item(key=f"n{i}", data={"i": i, "sleep": payload.get("sleep", 0),
                                              "fail": i in payload.get("fail", [])})

    @numbers.stage("double", idempotent=True)
    def double(item: ItemView, ctx: Context) -> dict[str, int]:
        if item.data["sleep"]:
            time.sleep(item.data["sleep"])
        fixed = os.environ.get("WEB_APP_FAIL_OFF")
        if item.data["fail"] and not (fixed and Path(fixed).exists()):
            raise Permanent("odd one out")
        return {"double": item.data["i"] * 2}

    sends = ledger.job("sends")

    @sends.decompose
    def split_sends(payload: dict[str, Any]) -> Iterator[Item]:
        for i in range(payload.get("n", 3)):
            yield Item(key=f"s{i}")

    @sends.stage("send")
    def send(item: ItemView, ctx: Context) -> dict[str, str]:
        return {"sent": ctx.idempotency_key}

    return ledger


ledger = build()
