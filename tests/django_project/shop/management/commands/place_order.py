"""`manage.py place_order N`: an order and its fulfilment run, in one transaction.atomic()."""

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction
from wlsite.jobs import fulfil

from shop.models import Order
from workledger.contrib.django import submit
from workledger.errors import WorkledgerError


class Command(BaseCommand):
    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("number", type=int)
        parser.add_argument("--units", type=int, default=3)
        parser.add_argument("--rollback", action="store_true", help="roll the block back")
        parser.add_argument("--outside", action="store_true", help="no atomic block")
        parser.add_argument("--using", default="default")

    def handle(self, *, number: int, units: int, rollback: bool, outside: bool, using: str,
               **options: Any) -> None:
        def place() -> None:
            Order.objects.create(number=number)
            sub = submit(fulfil, {"order": number, "units": units}, key=f"order-{number}",
                         using=using)
            self.stdout.write(json.dumps({"run": sub.run_id, "created": sub.created,
                                          "state": sub.state}))

        try:
            if outside:
                place()
                return
            with transaction.atomic():
                place()
                if rollback:
                    transaction.set_rollback(True)
        except WorkledgerError as exc:
            self.stderr.write(f"error: {exc}")
            sys.exit(exc.exit_code)
