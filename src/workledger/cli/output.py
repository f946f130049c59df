"""How the commands print: one-line errors, JSON (whole or streamed), tables, a run's status.

Human-readable output shows every stored text through :func:`show`, so a key or a reason
cannot send a terminal escape; JSON output stays exact (``json.dumps`` escapes control
characters itself).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from workledger.api import CLOSE_STAGE, ITEM_STATES, Ledger, RunStatus, limits, visible
from workledger.progress import counts_line, stage_order
from workledger.shapes import status_dict

__all__ = ["ID", "ITEM_STATES", "LIMIT", "JsonList", "Seconds", "console", "echo_json",
           "one_line", "print_status", "show", "status_dict"]

# Ids, seqs and --after: both databases hold 64-bit integers (a larger one is bad input).
ID = click.IntRange(0, limits.ID_MAX)
# Rows a listing returns: it streams, so the cap bounds its time, not its memory.
LIMIT = click.IntRange(1, limits.LIST_MAX)


if TYPE_CHECKING:  # generic from click 8.2 on; pyproject allows 8.1
    _ParamType = click.ParamType[float, Any]
else:
    _ParamType = click.ParamType


class Seconds(_ParamType):
    """A finite number of seconds within bounds: NaN or infinity would turn a lease into
    NULL (SQLite) or an error (PostgreSQL)."""

    name = "seconds"

    def __init__(self, most: float, *, zero: bool = False) -> None:
        self.most = most
        self.zero = zero

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        low_ok = seconds >= 0 if self.zero else seconds > 0
        if not (math.isfinite(seconds) and low_ok and seconds <= self.most):
            low = "0" if self.zero else "more than 0"
            self.fail(f"{value} is not {low} to {self.most:,.0f} seconds", param, ctx)
        return seconds


def one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def show(text: Any) -> str:
    """Stored text as a terminal may show it: control characters as visible escapes."""
    return visible("" if text is None else str(text))


def console(**options: Any) -> Console:
    """A rich console that prints text as it is: no markup, no emoji codes, no colouring."""
    return Console(markup=False, emoji=False, highlight=False, **options)


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


class JsonList:
    """A JSON list printed a page of elements at a time, the same text ``echo_json`` prints for
    the whole list: memory stays flat however long the listing is."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, values: list[Any]) -> None:
        parts = []
        for value in values:  # indented one level deeper, as inside the list
            text = json.dumps(value, indent=2, default=str).replace("\n", "\n  ")
            parts.append(("[\n  " if self.count == 0 else ",\n  ") + text)
            self.count += 1
        click.echo("".join(parts), nl=False)

    def close(self) -> None:
        click.echo("\n]" if self.count else "[]")


def print_status(ledger: Ledger, st: RunStatus) -> None:
    left = st.total - st.processed - st.failed - st.skipped
    click.echo(f"run {st.run_id} · job {show(st.job)} · key {show(st.key)}")
    click.echo(f"state      {st.state} (next: {st.next})")
    click.echo(f"units      {st.total} total: {st.processed} processed, {st.failed} failed, "
               f"{st.skipped} skipped, {left} to go")
    for stage in stage_order(ledger, st):
        counts = counts_line(st.counts.get(stage, {}))
        if stage == CLOSE_STAGE:  # the closing hook's own entry, not a stage of units
            click.echo(f"closing    the closing hook: {counts}")
        else:
            click.echo(f"stage      {show(stage)}: {counts}")
    click.echo(f"created    {st.created_at} · decomposed {st.decomposed_at or '-'}"
               f" · completed {st.completed_at or '-'}")
    if st.error:
        click.echo(f"error      {show(one_line(st.error))}")
