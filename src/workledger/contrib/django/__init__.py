"""workledger in a Django project (docs/django.md).

``INSTALLED_APPS += ["workledger.contrib.django"]``, then:

- the ledger is the :class:`~workledger.Ledger` named by ``settings.WORKLEDGER_APP``
  (``"module:attribute"``), on ``settings.WORKLEDGER_DB`` or else the database of
  ``DATABASES["default"]`` (:func:`get_ledger`);
- ``manage.py migrate`` migrates the ledger too; ``manage.py workledger ...`` runs any
  workledger command (``worker``, ``status``, ``audit``...) on it;
- :func:`submit` records a run in the current ``transaction.atomic()`` block: it exists if
  and only if that transaction commits, and a worker decomposes it after the commit.

>>> from django.db import transaction                          # doctest: +SKIP
>>> from workledger.contrib.django import submit                # doctest: +SKIP
>>> with transaction.atomic():                                  # doctest: +SKIP
...     order = Order.objects.create(number=7)
...     submit("fulfil", {"order": order.number}, key=f"order-{order.number}")
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from workledger.api import Ledger, Submission, import_app
from workledger.contrib.django.database import url_for
from workledger.errors import UsageError
from workledger.jobs import Job

__all__ = ["command_line", "get_ledger", "ledger_url", "submit"]

_lock = threading.Lock()
_ledger: Ledger | None = None


def ledger_url() -> str:
    """``settings.WORKLEDGER_DB``, or the URL of ``DATABASES["default"]``."""
    given = getattr(settings, "WORKLEDGER_DB", None)
    if given:
        return str(given)
    return url_for(DEFAULT_DB_ALIAS, connections[DEFAULT_DB_ALIAS].settings_dict)


def get_ledger() -> Ledger:
    """The project's ledger: ``settings.WORKLEDGER_APP``'s (a ledger without jobs when it is
    not set, enough to read and repair), pointed at :func:`ledger_url`. Made once."""
    global _ledger
    with _lock:
        if _ledger is None:
            spec = getattr(settings, "WORKLEDGER_APP", None)
            ledger = _load(str(spec)) if spec else Ledger()
            url = ledger_url()
            if ledger.url != url:
                ledger.use(url)
            _ledger = ledger
        return _ledger


def _load(spec: str) -> Ledger:
    found: Any = import_app(spec)
    if not isinstance(found, Ledger):
        raise UsageError(f"settings.WORKLEDGER_APP {spec!r} is a {type(found).__name__}, "
                         "not a workledger Ledger")
    found.app = spec
    return found


def submit(job: Job | str, payload: Any, *, key: str | None = None,
           using: str = DEFAULT_DB_ALIAS, priority: int = 0,
           tenant: str | None = None) -> Submission:
    """Record a run of ``job`` (a job or its name) in the current transaction of Django's
    database ``using`` (the ledger's): inside ``transaction.atomic()`` it is committed or
    rolled back with everything else the block wrote; outside one, in a transaction of its
    own. Only the run row is written there; a worker decomposes it after the commit.

    The same ``key`` again returns that run (``created=False``, its real state); another
    payload under it raises ``PayloadMismatch`` and writes nothing."""
    ledger = get_ledger()
    if isinstance(job, Job):
        ledger, name = job.ledger if isinstance(job.ledger, Ledger) else ledger, job.name
    else:
        name = job
    connection = connections[using]
    with transaction.atomic(using=using):  # a savepoint inside the caller's block
        connection.ensure_connection()
        return ledger.submit(name, payload, key=key, conn=connection.connection,
                             priority=priority, tenant=tenant)


def command_line(args: Sequence[str]) -> list[str]:
    """The workledger command line that runs ``args`` on the project's ledger. Its ``--app``
    is ``workledger.contrib.django.project:ledger``, the same ledger through a module that
    sets Django up first: what handler processes (``worker --processes N``) import."""
    from workledger.contrib.django.project import SPEC

    ledger = get_ledger()
    return ["--db", ledger.url, *(["--app", SPEC] if ledger.app else []), *args]
