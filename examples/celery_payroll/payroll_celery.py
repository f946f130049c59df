"""The payroll demo's job (``workledger.demos.payroll``), dispatched through Celery.

``celery -A payroll_celery worker`` runs it; ``workledger --app payroll_celery:ledger submit
payroll ...`` submits a run (see README.md). Configured from the environment:

- ``WORKLEDGER_DB``: the ledger (default ``sqlite:///payroll.db`` in this folder);
- ``CELERY_BROKER_URL``: the broker (default the local RabbitMQ, guest/guest);
- ``PAYROLL_QUEUE``: the Celery queue of its messages (default ``payroll``);
- ``WORKLEDGER_PAYROLL_OUT``: the employee store and the PDFs (default ``payslips``);
- ``WORKLEDGER_PAYROLL_SMTP``: the mail server (default the sink of
  ``python -m workledger.demos.payroll sink``, ``127.0.0.1:2525``);
- ``WORKLEDGER_PAYROLL_SINK``: the sink's records, which the ``deliver`` stage's verify hook
  asks (default ``payslips/mail-sink.db``).
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

from workledger.contrib.celery import CeleryDispatch
from workledger.demos.payroll import PayrollConfig, build

os.environ.setdefault("WORKLEDGER_DB", "sqlite:///payroll.db")
out = Path(os.environ.get("WORKLEDGER_PAYROLL_OUT", "payslips"))
host, _, port = os.environ.get("WORKLEDGER_PAYROLL_SMTP", "127.0.0.1:2525").rpartition(":")
config = PayrollConfig(out, host, int(port),
                       Path(os.environ.get("WORKLEDGER_PAYROLL_SINK", out / "mail-sink.db")))

app = Celery("payroll_celery",
             broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_prefetch_multiplier = 1  # a message holds up to 50 payslips: take one at a time
queue = os.environ.get("PAYROLL_QUEUE", "payroll")
app.conf.task_default_queue = queue  # this app's workers consume its queue alone

ledger = build(None, config, dispatch=CeleryDispatch(app, queue=queue, chunk=50, lease=30.0))
