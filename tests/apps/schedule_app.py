"""An app with a schedule, for tests of firing from real worker processes: ``--app
schedule_app:ledger`` with ``tests/apps`` on the path. Job ``tick``: payload ``{"n": N}``
becomes N items of one idempotent stage that sleeps ``TICK_SLEEP`` seconds each (default 0).
Its schedule ``ticks`` fires ``TICK_SPEC`` (default ``every 1s``) with ``TICK_CATCH_UP``
(default ``all``) and ``TICK_OVERLAP`` (default ``allow``); ``TICK_FAIL`` set: its function
raises. Job ``monthly``: the docs' payroll schedule (``0 6 25 * *`` in Berlin), keyed by
period, for the end-to-end test under faketime."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from workledger import Item, Ledger

ledger = Ledger()
tick = ledger.job("tick")


@tick.decompose
def split(payload: dict[str, Any]) -> Iterator[Item]:
    for i in range(payload.get("n", 2)):
        yield Item(key=f"t{i}")


@tick.stage("work", idempotent=True)
def work(item: Any, ctx: Any) -> None:
    time.sleep(float(os.environ.get("TICK_SLEEP", "0")))


@tick.schedule(os.environ.get("TICK_SPEC", "every 1s"),
               catch_up=os.environ.get("TICK_CATCH_UP", "all"),
               overlap=os.environ.get("TICK_OVERLAP", "allow"))
def ticks(fire: datetime) -> dict[str, Any]:
    if os.environ.get("TICK_FAIL"):
        raise RuntimeError("the calendar service is down")
    return {"n": 2, "at": fire.isoformat()}


payroll = ledger.job("monthly")


@payroll.decompose
def employees(payload: dict[str, Any]) -> Iterator[Item]:
    for i in range(3):
        yield Item(key=f"e{i}")


@payroll.stage("pay", idempotent=True)
def pay(item: Any, ctx: Any) -> None:
    return None


@payroll.schedule("0 6 25 * *", tz="Europe/Berlin", catch_up="latest", overlap="skip")
def monthly_payroll(fire: datetime) -> tuple[dict[str, str], str]:
    period = fire.strftime("%Y-%m")
    return {"period": period}, period
