"""Recovery and repair commands: sweep, retry, resolve, pause, resume, cancel, history,
reconcile, audit. Each operator action is recorded in ``wl_events`` with actor ``operator``
and the ``--note`` as its reason."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from workledger.api import RESOLVE_TARGETS, differences
from workledger.cli.output import echo_json, one_line
from workledger.cli.settings import Settings
from workledger.errors import UsageError

NOTE = click.option("--note", metavar="TEXT", help="Why: recorded with the action in wl_events.")
JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


def _needs_app(settings: Settings) -> None:
    if not settings.ledger().jobs:
        raise UsageError("this command needs the job definitions: pass --app module:attribute "
                         "or set WORKLEDGER_APP")


@click.command()
@click.option("--grace", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds without decomposition progress before a run is re-decomposed.")
@click.option("--lease", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True,
              help="Lease in seconds on a closing hook while it runs (use the workers' lease: "
                   "if this sweep dies inside a hook, the hook waits that long to run again).")
@JSON
@click.pass_obj
def sweep(settings: Settings, grace: float, lease: float, as_json: bool) -> None:
    """Run one sweeper pass: re-decompose stranded runs, settle expired leases by each stage's
    declaration (idempotent -> pending, verify -> ask, else unknown), ask verify hooks, and run
    closing hooks. Workers also sweep periodically; two sweepers racing do no harm."""
    _needs_app(settings)
    report = settings.ledger().sweep(grace=grace, lease=lease)
    if as_json:
        echo_json(asdict(report))
    else:
        click.echo(", ".join(f"{k.replace('_', ' ')} {v}" for k, v in asdict(report).items()))


@click.command()
@click.argument("run_id", metavar="RUN", type=int)
@click.option("--stage", help="Only failed items of this stage.")
@click.option("--item", "seqs", type=int, multiple=True, metavar="SEQ",
              help="Only this item (its seq; repeatable).")
@NOTE
@click.pass_obj
def retry(settings: Settings, run_id: int, stage: str | None, seqs: tuple[int, ...],
          note: str | None) -> None:
    """Redrive RUN's failed items back to pending with fresh attempts (audited)."""
    n = settings.ledger().retry(run_id, stage=stage, seqs=list(seqs) or None, note=note)
    click.echo(f"run {run_id}: redrove {n} failed item{'s' if n != 1 else ''}")


@click.command()
@click.argument("run_id", metavar="RUN", type=int)
@click.option("--stage", required=True, help="The item's stage.")
@click.option("--item", "seq", required=True, type=int, metavar="SEQ", help="The item's seq.")
@click.option("--as", "as_state", required=True, type=click.Choice(RESOLVE_TARGETS),
              help="What really happened: processed, failed, or pending (run it again).")
@NOTE
@click.pass_obj
def resolve(settings: Settings, run_id: int, stage: str, seq: int, as_state: str,
            note: str | None) -> None:
    """Settle an item in state unknown after checking what really happened."""
    if not settings.ledger().resolve(run_id, stage, seq, as_state, note=note):
        raise UsageError(f"item {seq} of stage {stage!r} was settled by someone else meanwhile")
    click.echo(f"run {run_id}: item {stage}/{seq} resolved as {as_state}")


@click.command()
@click.argument("run_id", metavar="RUN", type=int)
@NOTE
@click.pass_obj
def pause(settings: Settings, run_id: int, note: str | None) -> None:
    """Stop claiming RUN's items; items in flight finish."""
    done = settings.ledger().pause(run_id, note=note)
    click.echo(f"run {run_id}: {'paused' if done else 'already paused or cancelled'}")


@click.command()
@click.argument("run_id", metavar="RUN", type=int)
@NOTE
@click.pass_obj
def resume(settings: Settings, run_id: int, note: str | None) -> None:
    """Let workers claim RUN's items again."""
    done = settings.ledger().resume(run_id, note=note)
    click.echo(f"run {run_id}: {'resumed' if done else 'was not paused'}")


@click.command()
@click.argument("run_id", metavar="RUN", type=int)
@NOTE
@click.pass_obj
def cancel(settings: Settings, run_id: int, note: str | None) -> None:
    """Cancel RUN: its pending items become skipped (reason: cancelled)."""
    n = settings.ledger().cancel(run_id, note=note)
    if n < 0:
        click.echo(f"run {run_id}: already cancelled")
    else:
        click.echo(f"run {run_id}: cancelled; {n} pending item{'s' if n != 1 else ''} skipped")


@click.command()
@click.argument("run_id", metavar="RUN", type=int)
@click.option("--stage", required=True, help="The item's stage.")
@click.option("--item", "seq", required=True, type=int, metavar="SEQ", help="The item's seq.")
@JSON
@click.pass_obj
def history(settings: Settings, run_id: int, stage: str, seq: int, as_json: bool) -> None:
    """An item's story: its row (attempts, token, times, result, reason) and its events."""
    story = settings.ledger().history(run_id, stage, seq)
    if as_json:
        echo_json({"item": asdict(story.item), "events": [asdict(e) for e in story.events]})
        return
    i = story.item
    click.echo(f"item {i.stage}/{i.seq} key {i.key} of run {i.run_id}: {i.state}, "
               f"attempts {i.attempts}, lease token {i.lease_token}")
    click.echo(f"created {i.created_at} · updated {i.updated_at} · lease until "
               f"{i.lease_until or '-'} · not before {i.not_before or '-'}")
    if i.result is not None:
        click.echo(f"result  {i.result}")
    if i.error:
        click.echo(f"reason  {one_line(i.error)}")
    table = Table("at", "event", "token", "actor", "detail")
    traces: list[tuple[str, str, str]] = []
    for e in story.events:
        detail = e.detail
        if isinstance(detail, dict) and isinstance(detail.get("traceback"), str):
            traces.append((e.at, e.kind, detail["traceback"]))
            detail = {k: v for k, v in detail.items() if k != "traceback"}
        table.add_row(e.at, e.kind, str(e.lease_token or ""), e.actor or "", str(detail or ""))
    Console(markup=False).print(table)
    for at, kind, trace in traces:
        click.echo(f"\ntraceback of the {kind} event at {at}:\n{trace.rstrip()}")


@click.command()
@click.argument("run_id", metavar="RUN", type=int, required=False)
@click.option("--all", "every", is_flag=True, help="Every run (most recent 10,000).")
@click.option("--dry-run", is_flag=True, help="Show the differences, change nothing.")
@JSON
@click.pass_obj
def reconcile(settings: Settings, run_id: int | None, every: bool, dry_run: bool,
              as_json: bool) -> None:
    """Derive RUN's counters (total, processed, failed, skipped, completion) and its
    per-stage state counts (what status reads) from its items, print each difference from the
    stored ones, and repair them unless --dry-run. Safe while workers run."""
    if (run_id is None) == (not every):
        raise UsageError("give a RUN or --all (not both)")
    ledger = settings.ledger()
    ids = [run_id] if run_id is not None else [s.run_id for s in ledger.runs(10_000)]
    out: list[dict[str, Any]] = []
    for rid in ids:
        result = ledger.reconcile(rid, dry_run=dry_run)
        diff = {k: {"stored": a, "ledger": b} for k, (a, b) in differences(result).items()}
        out.append({"run_id": rid, "differences": diff, "repaired": result.repaired})
    if as_json:
        echo_json(out)
        return
    for entry in out:
        if not entry["differences"]:
            click.echo(f"run {entry['run_id']}: counters agree with the ledger")
            continue
        verb = "repaired" if entry["repaired"] else "would repair (dry run)"
        text = ", ".join(f"{k} {v['stored']} -> {v['ledger']}"
                         for k, v in entry["differences"].items())
        click.echo(f"run {entry['run_id']}: {verb}: {text}")


@click.command()
@JSON
@click.pass_obj
def audit(settings: Settings, as_json: bool) -> None:
    """List every stranded run and item with the path that will move it, and since when.
    Exits 1 when something needs a person."""
    findings = settings.ledger().audit()
    if as_json:
        echo_json([f.to_dict() for f in findings])
    elif not findings:
        click.echo("nothing stranded")
    else:
        table = Table("run", "what", "item", "since", "who moves it", "detail")
        for f in findings:
            item = f"{f.stage}/{f.seq}" if f.stage is not None else ""
            table.add_row(str(f.run_id), f.kind, item, f.since, f.path, one_line(f.detail or ""))
        Console(markup=False, width=160).print(table)
    if any(f.needs_person for f in findings):
        raise click.exceptions.Exit(1)


COMMANDS = (sweep, retry, resolve, pause, resume, cancel, history, reconcile, audit)
