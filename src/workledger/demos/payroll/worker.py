"""The worker process: ``python -m workledger.demos.payroll worker --db URL --out DIR ...``.

:func:`run_demo` starts these; ``--out``, ``--smtp`` and ``--sink`` default to the environment
(``WORKLEDGER_PAYROLL_OUT``, ``WORKLEDGER_PAYROLL_SMTP``, ``WORKLEDGER_PAYROLL_SINK``). It works
until the run is idle and prints its counters as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path

from workledger.demos.payroll.config import PayrollConfig
from workledger.demos.payroll.job import build

APP = "workledger.demos.payroll.job:ledger"  # what the handler processes import


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m workledger.demos.payroll worker --db URL --out DIR --smtp HOST:PORT``."""
    parser = argparse.ArgumentParser(prog="python -m workledger.demos.payroll")
    parser.add_argument("command", choices=["worker"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", default=os.environ.get("WORKLEDGER_PAYROLL_OUT", "payslips"))
    parser.add_argument("--smtp", default=os.environ.get("WORKLEDGER_PAYROLL_SMTP",
                                                         "127.0.0.1:25"))
    parser.add_argument("--sink", default=os.environ.get("WORKLEDGER_PAYROLL_SINK"))
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--processes", type=int, default=min(os.cpu_count() or 1, 4),
                        help="render payslips in this many processes (1: in threads)")
    args = parser.parse_args(argv)
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
