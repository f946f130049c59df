"""The built-in demonstrations: ``workledger demo events`` and ``workledger demo payroll``."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from workledger.api import limits
from workledger.cli.output import Seconds
from workledger.cli.settings import Settings
from workledger.errors import UsageError

DEMO_EXTRA = "pip install 'workledger[demo]'"


def _payroll_demo() -> Any:
    """The payroll demo's entry point; it needs reportlab (the ``demo`` extra),
    which the library itself does not."""
    try:
        from workledger.demos.payroll import run_demo
    except ImportError as exc:
        missing = exc.name or "a dependency"
        raise UsageError(f"the payroll demo needs {missing}, which is not installed: "
                         f"{DEMO_EXTRA} (make demo does it)") from exc
    return run_demo


@click.group()
def demo() -> None:
    """Built-in demonstrations."""


@demo.command("events")
@click.option("--events", "count", type=click.IntRange(min=1), default=1000, show_default=True,
              help="How many events the remote response holds.")
@click.option("--kill-after", type=click.IntRange(min=1), metavar="K",
              help="SIGKILL the first worker once K effects exist. [default: 40% of the events]")
@click.option("--lease", type=Seconds(limits.LEASE_MAX), default=2.0, show_default=True,
              help="The workers' lease in seconds.")
@click.pass_obj
def demo_events(settings: Settings, count: int, kill_after: int | None, lease: float) -> None:
    """The event fan-out: N events, a worker killed part-way, a second one finishing the rest.

    Submits run "events-demo-N" to the --db ledger (default ./workledger.db), writes effects
    to a sink file next to it, and ends with a table showing nothing was done twice. Run it
    again: it reports the existing run's real state and finishes whatever is left.
    """
    from workledger.demos.runner import DemoOptions, run_events_demo

    options = DemoOptions(url=settings.url, events=count,
                          kill_after=kill_after or max(1, count * 2 // 5), lease=lease)
    if not run_events_demo(options, Console()):
        raise click.exceptions.Exit(1)


@demo.command("payroll")
@click.option("--employees", type=click.IntRange(min=1), default=2000, show_default=True,
              help="How many employees the pay period has (a few are invalid on purpose).")
@click.option("--out", "out_dir", default="./payslips", show_default=True, metavar="DIR",
              help="Where the PDFs, the employee store and the mail sink's record go: a new "
                   "or empty folder, or one this demo wrote before.")
@click.option("--crash-after", type=click.IntRange(min=1), metavar="K",
              help="SIGKILL the worker process after K deliveries, then finish with a fresh one.")
@click.option("--mail-outage", type=Seconds(limits.LEASE_MAX), metavar="SECONDS",
              help="The built-in mail sink refuses with 451 for that long; deliveries back off.")
@click.option("--smtp-host", metavar="HOST",
              help="Deliver to this SMTP server instead of the built-in sink (no verify hook: "
                   "uncertain deliveries become unknown).")
@click.option("--smtp-port", type=click.IntRange(min=1, max=65535), metavar="PORT",
              help="The SMTP server's port (with --smtp-host; alone it means 127.0.0.1).")
@click.option("--json", "as_json", is_flag=True,
              help="End with the run's figures as one JSON object on the last line.")
@click.pass_obj
def demo_payroll(settings: Settings, employees: int, out_dir: str, crash_after: int | None,
                 mail_outage: float | None, smtp_host: str | None,
                 smtp_port: int | None, as_json: bool) -> None:
    """The payroll run: generate a PDF payslip per employee, then deliver it by e-mail.

    Two stages with their own state, so a mail outage never forces regeneration. The pay
    period is the run's key: running the command again resumes the same run, reports its real
    state and finishes what is left; it never starts a second run. Ends with a table showing
    nothing was generated or sent twice.
    """
    run_demo = _payroll_demo()

    code = run_demo(settings.url, employees=employees, out_dir=out_dir, crash_after=crash_after,
                    mail_outage=mail_outage, smtp_host=smtp_host, smtp_port=smtp_port,
                    console=Console(), as_json=as_json)
    if code:
        raise click.exceptions.Exit(code)
