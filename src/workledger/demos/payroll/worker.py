"""The worker process: ``python -m workledger.demos.payroll worker --db URL --out DIR ...``.

:func:`run_demo` starts these; ``--out``, ``--smtp`` and ``--sink`` default to the environment
(``WORKLEDGER_PAYROLL_OUT``, ``WORKLEDGER_PAYROLL_SMTP``, ``WORKLEDGER_PAYROLL_SINK``). It works
until the run is idle and prints its counters as one JSON line.

``python -m workledger.demos.payroll sink [--employees N] [--port P]`` seeds the employee store
in ``--out`` and runs the mail sink there until it is stopped: what a run needs when something
else runs the workers (``examples/celery_payroll/``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from collections.abc import Sequence
from pathlib import Path

from workledger.demos.payroll.config import BOUNCE_DOMAIN, DEFAULT_PERIOD, PayrollConfig
from workledger.demos.payroll.job import build
from workledger.demos.payroll.store import EmployeeStore
from workledger.demos.smtp_sink import MailSink

APP = "workledger.demos.payroll.job:ledger"  # what the handler processes import


def make_parser() -> argparse.ArgumentParser:
    """The options of ``python -m workledger.demos.payroll``, each with what it is."""
    parser = argparse.ArgumentParser(
        prog="python -m workledger.demos.payroll",
        description="worker: drain the payroll run's ledger until idle and print its counters "
                    "as one JSON line; sink: seed the employee store and run the local mail "
                    "sink until stopped (what examples/celery_payroll needs).")
    parser.add_argument("command", choices=["worker", "sink"],
                        help="worker (needs --db) or sink")
    parser.add_argument("--db", help="worker: the ledger's URL (sqlite:///... or "
                                     "postgresql://...)")
    parser.add_argument("--employees", type=int, default=2000,
                        help="sink: employees to seed (default %(default)s)")
    parser.add_argument("--port", type=int, default=2525,
                        help="sink: the port to listen on (default %(default)s)")
    parser.add_argument("--period", default=DEFAULT_PERIOD,
                        help="sink: the pay period (default %(default)s)")
    parser.add_argument("--out", default=os.environ.get("WORKLEDGER_PAYROLL_OUT", "payslips"),
                        help="the folder of the employee store, the PDFs and the sink's "
                             "records [env WORKLEDGER_PAYROLL_OUT; default %(default)s]")
    parser.add_argument("--smtp", default=os.environ.get("WORKLEDGER_PAYROLL_SMTP",
                                                         "127.0.0.1:25"),
                        help="worker: the mail server, HOST:PORT [env WORKLEDGER_PAYROLL_SMTP; "
                             "default %(default)s]")
    parser.add_argument("--sink", default=os.environ.get("WORKLEDGER_PAYROLL_SINK"),
                        help="worker: the sink's records, which the deliver stage's verify "
                             "hook asks (none: no verify hook) [env WORKLEDGER_PAYROLL_SINK]")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="worker: handlers at once (default %(default)s)")
    parser.add_argument("--chunk", type=int, default=100,
                        help="worker: items per claim (default %(default)s)")
    parser.add_argument("--lease", type=float, default=5.0,
                        help="worker: lease in seconds (default %(default)s)")
    parser.add_argument("--processes", type=int, default=min(os.cpu_count() or 1, 4),
                        help="worker: render payslips in this many processes (1: in threads; "
                             "default %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m workledger.demos.payroll worker --db URL --out DIR --smtp HOST:PORT``."""
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command == "sink":
        return sink(Path(args.out), args.employees, args.period, args.port)
    if not args.db:
        parser.error("worker needs --db")
    host, _, port = args.smtp.rpartition(":")
    config = PayrollConfig(Path(args.out), host, int(port), Path(args.sink) if args.sink else None)
    # the handler processes import the job (workledger.demos.payroll.job:ledger), which reads
    # its configuration from the environment
    os.environ.update(config.as_env())
    book = build(args.db, config)
    try:
        report = book.work(concurrency=args.concurrency, chunk=args.chunk, lease=args.lease,
                           until_idle=True, processes=args.processes, app=APP)
    finally:
        book.close()
    print(json.dumps({k: v for k, v in vars(report).items() if isinstance(v, int)}))
    return 0


def sink(out: Path, employees: int, period: str, port: int) -> int:
    """Seed the employee store in ``out`` and run the mail sink on ``port`` until stopped
    (SIGINT, SIGTERM). Mailboxes of former staff refuse mail (550), as in the demo."""
    out.mkdir(parents=True, exist_ok=True)
    store = EmployeeStore(out / "employees.db")
    store.seed(employees, period)
    store.close()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with MailSink(out / "mail-sink.db", reject_domains=[BOUNCE_DOMAIN], port=port) as mail:
        print(f"{employees} employees for {period} in {out / 'employees.db'}; mail sink on "
              f"{mail.host}:{mail.port} ({out / 'mail-sink.db'})", flush=True)
        stop.wait()
    return 0
