"""The project's jobs (settings.WORKLEDGER_APP = "wlsite.jobs:ledger"), written as
docs/django.md shows: the model imported at the top, the handler reading the order through
Django's ORM, in `manage.py workledger worker` or in its handler processes (--processes),
which set Django up before they import this module."""

import os
from typing import Any

from shop.models import Order

from workledger import Item, Ledger

ledger = Ledger()  # its database comes from the project's settings
fulfil = ledger.job("fulfil")


@fulfil.decompose
def lines(payload: dict[str, Any]) -> Any:
    for n in range(payload["units"]):
        yield Item(key=f"{payload['order']}-{n}", data={"order": payload["order"]})


@fulfil.stage("ship", idempotent=True)
def ship(item: Any, ctx: Any) -> Any:
    return {"order": Order.objects.get(number=item.data["order"]).number, "line": item.key,
            "pid": os.getpid()}
