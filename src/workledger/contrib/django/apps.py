"""The Django app: ``INSTALLED_APPS += ["workledger.contrib.django"]``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db import DEFAULT_DB_ALIAS
from django.db.models.signals import post_migrate


class WorkledgerConfig(AppConfig):  # type: ignore[misc]  # Django ships no type hints
    name = "workledger.contrib.django"
    label = "workledger"
    verbose_name = "workledger"

    def ready(self) -> None:
        # no database access here (Django's rule for ready()): the ledger is opened on first
        # use, and migrated with the project's own tables by `manage.py migrate`
        post_migrate.connect(_migrate_ledger, sender=self, dispatch_uid="workledger.migrate")


def _migrate_ledger(sender: Any, *, using: str = DEFAULT_DB_ALIAS, verbosity: int = 1,
                    **kwargs: Any) -> None:
    """``manage.py migrate`` (of the default database) applies the ledger's migrations too,
    through the ledger's own connection, so that no request ever opens an unmigrated one."""
    if using != DEFAULT_DB_ALIAS:
        return
    from workledger.contrib.django import get_ledger

    applied = get_ledger().init()
    if applied and verbosity >= 1:
        print(f"  workledger: applied ledger migrations {', '.join(map(str, applied))}")
