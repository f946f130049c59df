"""The payroll run: one payslip PDF per employee, generated, then e-mailed, never anything twice.

The job is written the way a user writes a job of their own, with the public API only
(``from workledger import ...``). The package holds:

- ``config``: the constants, :class:`PayrollConfig`, and the document and message ids;
- ``store``: the **employee store** (a SQLite file the demo creates in the output folder:
  employees, their salary history, the pay period, the document numbers given out and every
  render call);
- ``render`` and ``mail``: the payslip PDF with its atomic write, and the e-mail with its SMTP
  delivery and the classification of SMTP answers;
- ``job``: the **job** ``payroll``: decomposition into one item per employee (identity only:
  the employee id and the period), some of them ``skipped`` with a reason; stage ``generate``
  (idempotent) renders a byte-identical PDF to a deterministic path; stage ``deliver`` (not
  idempotent) sends it by SMTP with a Message-ID derived from ``ctx.idempotency_key`` and,
  when the built-in mail sink is the server, declares a ``verify`` hook that asks the sink;
- ``demo``: :func:`run_demo`, what ``workledger demo payroll`` calls: a mail sink, a run keyed
  by the pay period, worker subprocesses (one SIGKILLed with ``crash_after``), progress bars
  and a final table that counts renders and messages;
- ``worker`` and ``__main__``: the worker entry point,
  ``python -m workledger.demos.payroll worker --db URL --out DIR ...``.

The package's ``ledger`` (``--app workledger.demos.payroll:ledger``) is configured from the
environment: ``WORKLEDGER_PAYROLL_OUT`` (default ``./payslips``), ``WORKLEDGER_PAYROLL_SMTP``
(``host:port``) and ``WORKLEDGER_PAYROLL_SINK`` (the sink's records file; without it the
``deliver`` stage has no verify hook and an uncertain delivery becomes ``unknown``).
"""

from __future__ import annotations

import importlib
from typing import Any

# Each name is imported from its module when it is first asked for: a handler process that
# imports the job (``workledger.demos.payroll.job:ledger``) then loads neither the demo's
# progress display nor its mail sink, and starts sooner.
_WHERE = {
    "BOUNCE_DOMAIN": "config",
    "COMPANY": "config",
    "DEFAULT_PERIOD": "config",
    "JOB": "config",
    "MAIL_DOMAIN": "config",
    "SENDER": "config",
    "STAFF_DOMAIN": "config",
    "TEMPLATE_VERSION": "config",
    "TOLERATE": "config",
    "PayrollConfig": "config",
    "document_id": "config",
    "message_id": "config",
    "message_prefix": "config",
    "run_demo": "demo",
    "Payroll": "job",
    "build": "job",
    "ledger": "job",
    "Mailer": "mail",
    "Uncertain": "mail",
    "build_message": "mail",
    "render_payslip": "render",
    "write_atomically": "render",
    "EmployeeStore": "store",
    "Payslip": "store",
    "seed_employee": "store",
    "main": "worker",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "BOUNCE_DOMAIN",
    "COMPANY",
    "DEFAULT_PERIOD",
    "JOB",
    "MAIL_DOMAIN",
    "SENDER",
    "STAFF_DOMAIN",
    "TEMPLATE_VERSION",
    "TOLERATE",
    "EmployeeStore",
    "Mailer",
    "Payroll",
    "PayrollConfig",
    "Payslip",
    "Uncertain",
    "build",
    "build_message",
    "document_id",
    "ledger",
    "main",
    "message_id",
    "message_prefix",
    "render_payslip",
    "run_demo",
    "seed_employee",
    "write_atomically",
]
