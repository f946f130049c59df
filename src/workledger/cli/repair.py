"""Recovery and repair commands: sweep, retry, resolve, pause, resume, cancel, history,
reconcile, audit. Each operator action is recorded in ``wl_events`` with actor ``operator``
and the ``--note`` as its reason."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import click
from rich.table import Table

from workledger.api import (
    RESOLVE_TARGETS,
    Finding,
    FindingGroup,
    ItemState,
    Ledger,
    group_findings,
    limits,
    parse_priority,
    parse_weight,
    since_time,
    visible,
)
from workledger.cli.output import (
    ID,
    JsonList,
    Seconds,
    console,
    echo_json,
    one_line,
    show,
)
from workledger.cli.settings import Settings
from workledger.errors import UsageError
from workledger.shapes import finding_dict, history_dict, reconcile_dict

NOTE = click.option("--note", metavar="TEXT", help="Why: recorded with the action in wl_events.")
JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


@click.command()
@click.option("--grace", type=Seconds(limits.GRACE_MAX, zero=True), default=30.0,
              show_default=True,
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
    closing hooks. Workers also sweep periodically; two sweepers racing do no harm. Needs --app
    (it runs decomposers, verify and closing hooks); one run that fails does not stop the
    pass for the others."""
    ledger = settings.ledger(app=True)
    if not ledger.jobs:
        raise UsageError("this command needs the job definitions: pass --app module:attribute "
                         "or set WORKLEDGER_APP")
    report = ledger.sweep(grace=grace, lease=lease)
    if as_json:
        echo_json(asdict(report))
    else:
        click.echo(", ".join(f"{k.replace('_', ' ')} {v}" for k, v in asdict(report).items()))


@click.command()
@click.argument("run_id", metavar="RUN", type=ID)
@click.option("--stage", help="Only failed items of this stage.")
@click.option("--item", "seqs", type=ID, multiple=True, metavar="SEQ",
              help="Only this item (its seq; repeatable).")
@NOTE
@click.pass_obj
def retry(settings: Settings, run_id: int, stage: str | None, seqs: tuple[int, ...],
          note: str | None) -> None:
    """Redrive RUN's failed items back to pending with fresh attempts (audited). Refused in a
    cancelled run; an unknown stage, or a seq that names no failed item, is exit 2. Runs no
    code of --app."""
    n = settings.ledger().retry(run_id, stage=stage, seqs=list(seqs) or None, note=note)
    if n == 0 and not seqs:
        click.echo(f"run {run_id}: no failed items{f' in stage {stage}' if stage else ''}; "
                   "nothing changed")
    else:
        click.echo(f"run {run_id}: redrove {n} failed item{'s' if n != 1 else ''}")


@click.command()
@click.argument("run_id", metavar="RUN", type=ID)
@click.option("--stage", required=True, help="The items' stage.")
@click.option("--item", "seqs", multiple=True, type=ID, metavar="SEQ",
              help="An item's seq (repeat it for several).")
@click.option("--all-unknown", is_flag=True,
              help="Every unknown item of the stage (needs --note).")
@click.option("--as", "as_state", required=True, type=click.Choice(RESOLVE_TARGETS),
              help="What really happened: processed, failed, or pending (run it again).")
@NOTE
@click.pass_obj
def resolve(settings: Settings, run_id: int, stage: str, seqs: tuple[int, ...],
            all_unknown: bool, as_state: str, note: str | None) -> None:
    """Settle items in state unknown after checking what really happened: one (--item SEQ),
    several (--item repeated) or all of a stage (--all-unknown). Each item is moved by its own
    guarded transition and audited; an item that is not unknown is refused before anything
    changes. --as processed needs --app (the item is handed on to the stage that follows);
    failed and pending run none of its code."""
    if bool(seqs) == all_unknown:
        raise UsageError("say which items: --item SEQ (repeatable) or --all-unknown")
    if all_unknown and not (note and note.strip()):
        raise UsageError("--all-unknown settles many items at once: say why with --note")
    ledger = settings.ledger(app=as_state == ItemState.PROCESSED)  # its next stage
    if len(seqs) == 1:
        if not ledger.resolve(run_id, stage, seqs[0], as_state, note=note):
            raise UsageError(f"item {seqs[0]} of stage {stage!r} was settled by someone else "
                             "meanwhile")
        click.echo(f"run {run_id}: item {show(stage)}/{seqs[0]} resolved as {as_state}")
        return
    done, lost = ledger.resolve_many(run_id, stage, as_state, seqs=list(seqs) or None,
                                     note=note)
    if done == 0 and lost == 0:
        click.echo(f"run {run_id}: no unknown items in stage {show(stage)}; nothing changed")
        return
    click.echo(f"run {run_id}: {done} item{'s' if done != 1 else ''} of stage {show(stage)} "
               f"resolved as {as_state}"
               + (f"; {lost} settled by someone else meanwhile" if lost else ""))


@click.command()
@click.argument("run_id", metavar="RUN", type=ID)
@NOTE
@click.pass_obj
def pause(settings: Settings, run_id: int, note: str | None) -> None:
    """Stop claiming RUN's items; items in flight finish. A finished (complete or cancelled)
    run is refused (exit 2). Runs no code of --app."""
    done = settings.ledger().pause(run_id, note=note)
    click.echo(f"run {run_id}: {'paused' if done else 'already paused; nothing changed'}")


@click.command(context_settings={"ignore_unknown_options": True})  # N may be -5
@click.argument("run_id", metavar="RUN", type=ID)
@click.argument("priority", metavar="N")
@NOTE
@click.pass_obj
def priority(settings: Settings, run_id: int, priority: str, note: str | None) -> None:
    """Give open RUN priority N (-1000 to 1000; higher runs are claimed first, the default
    is 0). Recorded with --note and who did it. A finished run is refused (exit 2). Runs no
    code of --app."""
    rank = parse_priority(priority)
    done = settings.ledger().set_priority(run_id, rank, note=note)
    click.echo(f"run {run_id}: priority {rank}" if done else
               f"run {run_id}: priority {rank} already; nothing changed")


@click.command()
@click.argument("name", metavar="TENANT")
@click.option("--weight", metavar="N",
              help="The tenant's share of the claims among the tenants with claimable work at "
                   "one priority, 1 to 1000 (every tenant weighs 1 until given another).")
@NOTE
@click.pass_obj
def tenant(settings: Settings, name: str, weight: str | None, note: str | None) -> None:
    """Show TENANT's weight and open runs, or with --weight N set its weight (recorded with
    --note and who did it; workers see it within a second). 'default' is the tenant of the
    runs submitted without one. Runs no code of --app."""
    ledger = settings.ledger()
    if weight is not None:
        share = parse_weight(weight)
        done = ledger.set_tenant_weight(name, share, note=note)
        click.echo(f"tenant {name}: weight {share}" if done else
                   f"tenant {name}: weight {share} already; nothing changed")
        return
    if note is not None:
        raise UsageError("--note goes with --weight: it records why the weight changed")
    shown = ledger.tenant(name)
    runs = f"{shown.open_runs:,} open run{'' if shown.open_runs == 1 else 's'}"
    by = f" (set by {shown.updated_by} at {shown.updated_at})" if shown.updated_by else ""
    click.echo(f"tenant {shown.name}: weight {shown.weight}{by}, {runs}")


@click.command()
@click.argument("run_id", metavar="RUN", type=ID)
@NOTE
@click.pass_obj
def resume(settings: Settings, run_id: int, note: str | None) -> None:
    """Let workers claim RUN's items again. A finished run is refused (exit 2). Runs no code of
    --app."""
    done = settings.ledger().resume(run_id, note=note)
    click.echo(f"run {run_id}: {'resumed' if done else 'was not paused; nothing changed'}")


@click.command()
@click.argument("run_id", metavar="RUN", type=ID)
@NOTE
@click.pass_obj
def cancel(settings: Settings, run_id: int, note: str | None) -> None:
    """Cancel RUN: its pending items become skipped (reason: cancelled). A finished run is
    refused (exit 2): cancelling it would relabel its history. Runs no code of --app."""
    n = settings.ledger().cancel(run_id, note=note)
    if n < 0:
        click.echo(f"run {run_id}: already cancelled; nothing changed")
    else:
        click.echo(f"run {run_id}: cancelled; {n} pending item{'s' if n != 1 else ''} skipped")


@click.command()
@click.argument("run_id", metavar="RUN", type=ID)
@click.option("--stage", help="Only failed items of this stage.")
@click.option("--item", "seq", type=ID, metavar="SEQ", help="Only this item (its seq).")
@click.option("--note", required=True, metavar="TEXT",
              help="What was reviewed and decided: recorded with the acknowledgement.")
@click.pass_obj
def ack(settings: Settings, run_id: int, stage: str | None, seq: int | None, note: str) -> None:
    """Acknowledge RUN's failed items (or one stage's, or one item's) after reviewing them: an
    event, not a state change. audit then lists them as reviewed and no longer exits 1 for
    them; an item that fails again later alerts again. Runs no code of --app."""
    n = settings.ledger().ack(run_id, stage=stage, seq=seq, note=note)
    click.echo(f"run {run_id}: acknowledged {n} failed item{'s' if n != 1 else ''}")


@click.command()
@click.argument("run_id", metavar="RUN", type=ID)
@click.option("--stage", required=True, help="The item's stage.")
@click.option("--item", "seq", required=True, type=ID, metavar="SEQ", help="The item's seq.")
@JSON
@click.pass_obj
def history(settings: Settings, run_id: int, stage: str, seq: int, as_json: bool) -> None:
    """An item's story: its row (attempts, token, times, result, reason) and its events. Runs
    no code of --app."""
    story = settings.ledger().history(run_id, stage, seq)
    if as_json:
        echo_json(history_dict(story))
        return
    i = story.item
    click.echo(f"item {show(i.stage)}/{i.seq} key {show(i.key)} of run {i.run_id}: {i.state}, "
               f"attempts {i.attempts}, lease token {i.lease_token}")
    click.echo(f"created {i.created_at} · updated {i.updated_at} · lease until "
               f"{i.lease_until or '-'} · not before {i.not_before or '-'}")
    if i.result is not None:
        click.echo(f"result  {show(i.result)}")
    if i.error:
        click.echo(f"reason  {show(one_line(i.error))}")
    table = Table("at", "event", "token", "actor", "detail")
    traces: list[tuple[str, str, str]] = []
    for e in story.events:
        detail = e.detail
        if isinstance(detail, dict) and isinstance(detail.get("traceback"), str):
            traces.append((e.at, e.kind, detail["traceback"]))
            detail = {k: v for k, v in detail.items() if k != "traceback"}
        table.add_row(e.at, show(e.kind), str(e.lease_token or ""), show(e.actor),
                      show(detail or ""))
    console().print(table)
    for at, kind, trace in traces:
        click.echo(f"\ntraceback of the {show(kind)} event at {at}:\n"
                   f"{visible(trace.rstrip(), newlines=True)}")


@click.command()
@click.argument("run_id", metavar="RUN", type=ID, required=False)
@click.option("--all", "every", is_flag=True,
              help="Every run, the most recent first (read a page at a time).")
@click.option("--dry-run", is_flag=True, help="Show the differences, change nothing.")
@JSON
@click.pass_obj
def reconcile(settings: Settings, run_id: int | None, every: bool, dry_run: bool,
              as_json: bool) -> None:
    """Derive RUN's counters (total, processed, failed, skipped, completion) and its
    per-stage state counts (what status reads) from its items, print each difference from the
    stored ones, and repair them unless --dry-run. Safe while workers run. Runs no code of
    --app."""
    if (run_id is None) == (not every):
        raise UsageError("give a RUN or --all (not both)")
    ledger = settings.ledger()
    out = JsonList() if as_json else None
    checked: list[int] = []
    for rid in [run_id] if run_id is not None else _recent_runs(ledger):
        entry = reconcile_dict(rid, ledger.reconcile(rid, dry_run=dry_run))
        if out is not None:
            out.add([entry])
        else:
            click.echo(_reconciled_line(entry))
        checked.append(rid)
    if out is not None:
        out.close()
    elif every:
        click.echo(f"checked {len(checked):,} run{'s' if len(checked) != 1 else ''}")


def _recent_runs(ledger: Ledger) -> Iterator[int]:
    """The ids of every run, newest first, read a page at a time (keyset: a run submitted
    meanwhile is not checked; it was not there when the check began)."""
    before: int | None = None
    while ids := ledger.run_ids(limits.PAGE, before=before):
        yield from ids
        before = ids[-1]


def _reconciled_line(entry: dict[str, Any]) -> str:
    if not entry["differences"]:
        return f"run {entry['run_id']}: counters agree with the ledger"
    verb = "repaired" if entry["repaired"] else "would repair (dry run)"
    text = ", ".join(f"{k} {v['stored']} -> {v['ledger']}"
                     for k, v in entry["differences"].items())
    return f"run {entry['run_id']}: {verb}: {show(text)}"


@click.command()
@click.option("--run", "run_id", type=ID, metavar="RUN", help="Only this run's findings.")
@click.option("--job", metavar="NAME", help="Only findings in runs of this job.")
@click.option("--since", metavar="AGE|TIME",
              help="Only findings since then: an age (30m, 24h, 7d) or an ISO date or time.")
@click.option("--items", "each", is_flag=True,
              help="One row per item, instead of one line per group of findings.")
@JSON
@click.pass_obj
def audit(settings: Settings, run_id: int | None, job: str | None, since: str | None,
          each: bool, as_json: bool) -> None:
    """List every stranded run and item with the path that will move it, and since when.
    Findings of one kind, run, stage and path are one line that says how many items it
    holds (the oldest one's since); --items lists them one by one, and --json always does.
    Exits 1 when something needs a person now. Failures a person reviewed (acknowledged with
    `ack`, or within the tolerance of a finished run) are listed apart and do not make it
    exit 1, so a cron alert on it clears once each failure has been looked at. Uses --app
    when given, to name closing hooks not yet run and how each stage's expired leases will be
    settled; works without it."""
    cutoff = since_time(since) if since is not None else None
    findings = settings.ledger(app=True).audit(run_id=run_id, job=job, since=cutoff)
    if as_json:
        echo_json([finding_dict(f) for f in findings])
    elif not findings:
        click.echo("nothing stranded")
    else:
        lines = [_one(f) for f in findings] if each else group_findings(findings)
        now = [g for g in lines if g.reviewed is None]
        _findings_table("stranded, with who moves it" if now else "", now)
        _findings_table("reviewed (not alerting)", [g for g in lines if g.reviewed])
        if len(lines) < len(findings):
            click.echo(f"{len(findings):,} findings in {len(lines):,} "
                       f"line{'s' if len(lines) != 1 else ''}; --items lists each")
    if any(f.needs_person for f in findings):
        raise click.exceptions.Exit(1)


def _one(f: Finding) -> FindingGroup:
    return FindingGroup(f.kind, f.run_id, f.stage, f.path, f.needs_person, f.reviewed, (f,))


def _findings_table(title: str, groups: list[FindingGroup]) -> None:
    if not groups:
        return
    reviewed = any(g.reviewed for g in groups)
    table = Table("run", "what", "item", "since", "review" if reviewed else "who moves it",
                  "detail", title=title or None, title_justify="left")
    for g in groups:
        table.add_row(str(g.run_id), g.kind, show(g.items), g.since, show(g.reviewed or g.path),
                      show(one_line(g.detail or "")))
    console(width=160).print(table)


COMMANDS = (sweep, retry, resolve, ack, pause, resume, cancel, priority, tenant, history,
            reconcile, audit)
