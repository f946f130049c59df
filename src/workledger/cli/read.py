"""Commands that read the ledger: status, runs, items. None runs code of --app (it only names
the ledger) or creates a ledger.

Listings stream: rows are read a page at a time (``limits.PAGE``) and printed as they come, so
memory stays flat up to ``--limit``'s cap; a human-readable listing that stops before the end
says how many rows are left and how to see them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from workledger.api import limits, url_secrets
from workledger.cli import logs
from workledger.cli.output import (
    ID,
    ITEM_STATES,
    LIMIT,
    JsonList,
    console,
    echo_json,
    print_status,
    show,
    status_dict,
)
from workledger.cli.settings import Settings
from workledger.progress import watch_run
from workledger.shapes import item_dict


@click.command()
@click.argument("run_id", metavar="RUN", type=ID)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--watch", is_flag=True, help="Show live progress bars until the run is complete.")
@click.pass_obj
def status(settings: Settings, run_id: int, as_json: bool, watch: bool) -> None:
    """Show RUN's state, derived from its items: per-stage counts by state. Runs no code of
    --app."""
    ledger = settings.ledger()
    st = ledger.status(run_id)
    if watch:
        # a long-lived view: an outage pauses it (said once, on stderr), not ends it
        logs.configure("text", "warning", url_secrets(settings.url))
        ledger.wait_out_outages()
        try:
            st = watch_run(ledger, run_id, Console(stderr=as_json))
        except KeyboardInterrupt:
            st = ledger.status(run_id)
    if as_json:
        echo_json(status_dict(st))
    else:
        print_status(ledger, st)


def paged(fetch: Callable[[int, int | None], list[Any]], limit: int,
          cursor: Callable[[Any], int]) -> Iterator[list[Any]]:
    """Pages of at most ``limits.PAGE`` rows until ``limit`` rows or the end; ``fetch(n,
    after)`` reads the next ``n`` rows after the cursor of the last row (None: the first)."""
    after: int | None = None
    left = limit
    while left > 0:
        n = min(left, limits.PAGE)
        page = fetch(n, after)
        if page:
            yield page
        if len(page) < n:
            return
        left -= n
        after = cursor(page[-1])


def print_listing(pages: Iterator[list[Any]], as_json: bool, as_dict: Callable[[Any], Any],
                  table: Callable[[bool], Table], row: Callable[[Any], list[Any]]
                  ) -> tuple[int, Any]:
    """Print the pages (a JSON list, or one table per page); return how many rows and the
    last one."""
    shown, last = 0, None
    out = JsonList() if as_json else None
    for page in pages:
        if out is not None:
            out.add([as_dict(entry) for entry in page])
        else:
            t = table(shown == 0)
            for entry in page:
                t.add_row(*(show(cell) for cell in row(entry)))
            console().print(t)
        shown, last = shown + len(page), page[-1]
    if out is not None:
        out.close()
    return shown, last


@click.command()
@click.option("--limit", type=LIMIT, default=100, show_default=True,
              help=f"How many runs at most (up to {limits.LIST_MAX:,}).")
@click.option("--before", type=ID, metavar="ID", help="Only runs with an id below ID (to page "
                                                      "back).")
@click.option("--tenant", metavar="NAME",
              help="Only the runs of this tenant ('default': the runs without one).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of run statuses.")
@click.pass_obj
def runs(settings: Settings, limit: int, before: int | None, tenant: str | None,
         as_json: bool) -> None:
    """List recent runs with their derived states, newest first. Runs no code of --app."""
    ledger = settings.ledger()
    pages = paged(lambda n, after: ledger.runs(n, before=before if after is None else after,
                                               tenant=tenant),
                  limit, lambda st: st.run_id)
    first = next(pages, [])
    # a tenant column only where a listed run has a tenant: most ledgers have none
    tenants = ["tenant"] if any(st.tenant for st in first) else []
    shown, last = print_listing(
        itertools.chain([first] if first else [], pages), as_json, status_dict,
        lambda header: Table("run", "job", "key", "state", "priority", *tenants, "total",
                             "processed", "failed", "skipped", "created", show_header=header),
        lambda st: [st.run_id, st.job, st.key, st.state, st.priority,
                    *([st.tenant or "default"] if tenants else []), st.total, st.processed,
                    st.failed, st.skipped, st.created_at])
    if not as_json and shown == 0:
        whose = "" if tenant is None else f" of tenant {tenant}"
        click.echo(f"no runs{whose} yet" if before is None else
                   f"no runs{whose} before run {before}")
    elif not as_json and shown == limit:
        more = ledger.count_runs(before=last.run_id, tenant=tenant)
        if more:
            click.echo(f"... {more:,} more (use --before {last.run_id} / --limit)")


@click.command()
@click.argument("run_id", metavar="RUN", type=ID)
@click.option("--stage", help="Only items of this stage.")
@click.option("--state", type=click.Choice(ITEM_STATES), help="Only items in this state.")
@click.option("--limit", type=LIMIT, default=100, show_default=True,
              help=f"How many items at most (up to {limits.LIST_MAX:,}).")
@click.option("--after", type=ID, default=0, metavar="ID",
              help="Only items with an id above ID (to page through).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of items.")
@click.pass_obj
def items(settings: Settings, run_id: int, stage: str | None, state: str | None, limit: int,
          after: int, as_json: bool) -> None:
    """List RUN's items: seq, key, state, attempts, result and error (the reason). Runs no
    code of --app."""
    ledger = settings.ledger()

    def fetch(n: int, cursor: int | None) -> list[Any]:
        return ledger.items(run_id, stage=stage, state=state, limit=n,
                            after_id=after if cursor is None else cursor)

    shown, last = print_listing(
        paged(fetch, limit, lambda r: r.id), as_json, item_dict,
        lambda header: Table("id", "stage", "seq", "key", "state", "attempts", "result",
                             "error", show_header=header),
        lambda r: [r.id, r.stage, r.seq, r.key, r.state, r.attempts,
                   "" if r.result is None else json.dumps(r.result), r.error])
    if not as_json and shown == limit:
        more = ledger.count_items(run_id, stage=stage, state=state, after_id=last.id)
        if more:
            click.echo(f"... {more:,} more (use --after {last.id} / --limit)")


COMMANDS = (status, runs, items)
