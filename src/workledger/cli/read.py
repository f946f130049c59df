"""Commands that read the ledger: status, runs, items."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from workledger.cli.output import ITEM_STATES, echo_json, print_status, status_dict
from workledger.cli.settings import Settings
from workledger.progress import watch_run
from workledger.shapes import item_dict


@click.command()
@click.argument("run_id", metavar="RUN", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--watch", is_flag=True, help="Show live progress bars until the run is complete.")
@click.pass_obj
def status(settings: Settings, run_id: int, as_json: bool, watch: bool) -> None:
    """Show RUN's state, derived from its items: per-stage counts by state."""
    ledger = settings.ledger()
    st = ledger.status(run_id)
    if watch:
        try:
            st = watch_run(ledger, run_id, Console(stderr=as_json))
        except KeyboardInterrupt:
            st = ledger.status(run_id)
    if as_json:
        echo_json(status_dict(st))
    else:
        print_status(ledger, st)


@click.command()
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="How many runs at most.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of run statuses.")
@click.pass_obj
def runs(settings: Settings, limit: int, as_json: bool) -> None:
    """List recent runs with their derived states, newest first."""
    found = settings.ledger().runs(limit)
    if as_json:
        echo_json([status_dict(st) for st in found])
        return
    table = Table("run", "job", "key", "state", "total", "processed", "failed", "skipped",
                  "created")
    for st in found:
        table.add_row(str(st.run_id), st.job, st.key, st.state, str(st.total), str(st.processed),
                      str(st.failed), str(st.skipped), st.created_at)
    Console(markup=False).print(table)


@click.command()
@click.argument("run_id", metavar="RUN", type=int)
@click.option("--stage", help="Only items of this stage.")
@click.option("--state", type=click.Choice(ITEM_STATES), help="Only items in this state.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="How many items at most.")
@click.option("--after", type=click.IntRange(min=0), default=0, metavar="ID",
              help="Only items with an id above ID (to page through).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of items.")
@click.pass_obj
def items(settings: Settings, run_id: int, stage: str | None, state: str | None, limit: int,
          after: int, as_json: bool) -> None:
    """List RUN's items: seq, key, state, attempts, result and error (the reason)."""
    rows = settings.ledger().items(run_id, stage=stage, state=state, limit=limit, after_id=after)
    if as_json:
        echo_json([item_dict(r) for r in rows])
        return
    table = Table("id", "stage", "seq", "key", "state", "attempts", "result", "error")
    for r in rows:
        result = "" if r.result is None else json.dumps(r.result)
        table.add_row(str(r.id), r.stage, str(r.seq), r.key or "", r.state, str(r.attempts),
                      result, r.error or "")
    Console(markup=False).print(table)


# -- progress ----------------------------------------------------------------------------------


COMMANDS = (status, runs, items)
