"""How the commands print: one-line errors, JSON, a run's status."""

from __future__ import annotations

import json
from typing import Any

import click

from workledger.api import CLOSE_STAGE, Ledger, RunStatus
from workledger.progress import ITEM_STATES, counts_line, stage_order

__all__ = ["ITEM_STATES", "echo_json", "one_line", "print_status", "status_dict"]


def one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


STATUS_FIELDS = ("run_id", "job", "key", "state", "total", "complete", "counts", "processed",
                 "failed", "skipped", "next", "created_at", "decomposed_at", "completed_at",
                 "error")


def status_dict(st: RunStatus) -> dict[str, Any]:
    """The JSON shape of a run's status: a contract, so new RunStatus fields stay out of it."""
    values = st.to_dict()
    return {name: values[name] for name in STATUS_FIELDS}


def print_status(ledger: Ledger, st: RunStatus) -> None:
    left = st.total - st.processed - st.failed - st.skipped
    click.echo(f"run {st.run_id} · job {st.job} · key {st.key}")
    click.echo(f"state      {st.state} (next: {st.next})")
    click.echo(f"units      {st.total} total: {st.processed} processed, {st.failed} failed, "
               f"{st.skipped} skipped, {left} to go")
    for stage in stage_order(ledger, st):
        counts = counts_line(st.counts.get(stage, {}))
        if stage == CLOSE_STAGE:  # the closing hook's own entry, not a stage of units
            click.echo(f"closing    the closing hook: {counts}")
        else:
            click.echo(f"stage      {stage}: {counts}")
    click.echo(f"created    {st.created_at} · decomposed {st.decomposed_at or '-'}"
               f" · completed {st.completed_at or '-'}")
    if st.error:
        click.echo(f"error      {one_line(st.error)}")


# -- the group --------------------------------------------------------------------------------
