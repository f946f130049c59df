"""The payroll job's constants, its configuration and the names it derives from a run.

Everything here is a plain value or a pure function: the store, the renderer, the mailer, the
job and the demo runner all read from this module and none of them from each other's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

JOB = "payroll"
DEFAULT_PERIOD = "2026-11"
TEMPLATE_VERSION = "payslip-2026.1"
COMPANY = "Ledgerwood Manufacturing Ltd"
SENDER = "payroll@workledger.local"
MAIL_DOMAIN = "workledger.local"
STAFF_DOMAIN = "staff.example.com"
BOUNCE_DOMAIN = "former-staff.example.com"  # the built-in sink refuses these mailboxes (550)
TOLERATE = 0.01  # a run with up to 1% undeliverable payslips completes, with failures listed


@dataclass(frozen=True)
class PayrollConfig:
    """Where the store and the PDFs live and where mail goes; ``sink`` enables the verify hook."""

    out_dir: Path = Path("payslips")
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 25
    sink: Path | None = None

    @property
    def store_path(self) -> Path:
        return self.out_dir / "employees.db"

    def as_env(self) -> dict[str, str]:
        """The environment :meth:`from_env` reads this configuration back from."""
        env = {"WORKLEDGER_PAYROLL_OUT": str(self.out_dir),
               "WORKLEDGER_PAYROLL_SMTP": f"{self.smtp_host}:{self.smtp_port}"}
        if self.sink is not None:
            env["WORKLEDGER_PAYROLL_SINK"] = str(self.sink)
        return env

    @staticmethod
    def from_env() -> PayrollConfig:
        host, _, port = os.environ.get("WORKLEDGER_PAYROLL_SMTP", "127.0.0.1:25").rpartition(":")
        sink = os.environ.get("WORKLEDGER_PAYROLL_SINK")
        return PayrollConfig(Path(os.environ.get("WORKLEDGER_PAYROLL_OUT", "payslips")),
                             host or "127.0.0.1", int(port or 25), Path(sink) if sink else None)


def document_id(run_id: int, period: str, employee_id: str) -> str:
    """The payslip's number, allocated from run and employee before anything is rendered."""
    return f"PS-{period}-R{run_id}-{employee_id}"


def message_id(idempotency_key: str) -> str:
    """``<run/deliver/seq@workledger.local>``: the same for every attempt of one delivery."""
    return f"<{idempotency_key}@{MAIL_DOMAIN}>"


def message_prefix(run_id: int) -> str:
    return f"<{run_id}/deliver/"
