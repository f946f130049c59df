"""How the commands print: one-line errors, JSON, a run's status."""

from __future__ import annotations

import json
from typing import Any

import click

from workledger.api import Ledger, RunStatus
from workledger.progress import ITEM_STATES, counts_line, stage_order
from workledger.shapes import status_dict

__all__ = ["ITEM_STATES", "echo_json", "one_line", "print_status", "status_dict"]


def one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def print_status(ledger: Ledger, st: RunStatus) -> None:
    left = st.total - st.processed - st.failed - st.skipped
    click.echo(f"run {st.run_id} · job {st.job} · key {st.key}")
    click.echo(f"state      {st.state} (next: {st.next})")
    click.echo(f"units      {st.total} total: {st.processed} processed, {st.failed} failed, "
               f"{st.skipped} skipped, {left} to go")
    for stage in stage_order(ledger, st):
        click.echo(f"stage      {stage}: {counts_line(st.counts.get(stage, {}))}")
    click.echo(f"created    {st.created_at} · decomposed {st.decomposed_at or '-'}"
               f" · completed {st.completed_at or '-'}")
    if st.error:
        click.echo(f"error      {one_line(st.error)}")


# -- the group --------------------------------------------------------------------------------
