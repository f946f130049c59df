"""The project's ledger as a module attribute that sets Django up: ``project:ledger``.

``manage.py workledger`` names it as the CLI's ``--app`` (:func:`command_line`), so that a
process that starts from nothing, a handler process of ``worker --processes N`` (spawned, a
fresh interpreter), calls ``django.setup()`` (with the ``DJANGO_SETTINGS_MODULE`` it
inherited from ``manage.py``) before it imports ``settings.WORKLEDGER_APP``: a jobs module
may then import its models at the top, as any Django module does. In a process Django is set
up in already, importing it changes nothing.
"""

from __future__ import annotations

from typing import Any

import django
from django.apps import apps

if not apps.ready:
    django.setup()

SPEC = "workledger.contrib.django.project:ledger"


def __getattr__(name: str) -> Any:
    if name == "ledger":  # made on first use: the settings decide which it is
        from workledger.contrib.django import get_ledger

        return get_ledger()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
