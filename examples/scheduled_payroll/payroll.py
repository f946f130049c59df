"""A payroll run on a calendar: `workledger --app payroll:ledger worker` fires it.

In production the schedule is monthly, ``"0 6 25 * *"`` in ``Europe/Berlin``: 06:00 on the
25th. Here ``PAYROLL_EVERY`` (default ``every 10s``) fires it every ten seconds so that you can
watch it; each firing is keyed by its period, so a second firing of one period (a restart, a
second worker, a second host) is the same run, never a second payroll.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from workledger import Item, Ledger

ledger = Ledger(os.environ.get("WORKLEDGER_DB", "sqlite:///payroll.db"))
# every run should be complete within two hours of its firing; audit warns 30 minutes before
payroll = ledger.job("payroll", deadline="2h", deadline_warning="30m")
EMPLOYEES = 20


@payroll.decompose
def employees(payload: dict[str, Any]) -> Iterator[Item]:
    for n in range(EMPLOYEES):
        yield Item(key=f"emp-{n:04d}", data={"period": payload["period"]})


@payroll.stage("payslip", idempotent=True)
def payslip(item: Any, ctx: Any) -> dict[str, str]:
    return {"payslip": f"{item.key} {item.data['period']}"}


SPEC = os.environ.get("PAYROLL_EVERY", "every 10s")  # production: "0 6 25 * *"


@payroll.schedule(SPEC, tz="Europe/Berlin", catch_up="latest", overlap="skip")
def monthly(fire: datetime) -> tuple[dict[str, str], str]:
    # a monthly schedule keys by month; the example's ten-second one by its second
    period = fire.strftime("%Y-%m" if SPEC.startswith("0 ") else "%Y-%m-%dT%H:%M:%S")
    return {"period": period}, period
