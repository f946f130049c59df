"""The project's jobs (settings.WORKLEDGER_APP = "wlsite.jobs:ledger"). The handler reads the
order through Django's ORM: the worker runs in `manage.py workledger worker`, set up."""

from typing import Any

from workledger import Item, Ledger

ledger = Ledger()  # its database comes from the project's settings
fulfil = ledger.job("fulfil")


@fulfil.decompose
def lines(payload: dict[str, Any]) -> Any:
    for n in range(payload["units"]):
        yield Item(key=f"{payload['order']}-{n}", data={"order": payload["order"]})


@fulfil.stage("ship", idempotent=True)
def ship(item: Any, ctx: Any) -> Any:
    from shop.models import Order

    return {"order": Order.objects.get(number=item.data["order"]).number, "line": item.key}
