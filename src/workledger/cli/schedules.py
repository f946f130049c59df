"""Runs on a calendar: ``schedules`` lists them, ``schedule pause|resume|fire|backfill`` acts on
one. Schedules are declared in code (``@job.schedule``), so every command but ``schedules``
needs --app; the sweeper that leads (in any worker) fires them."""

from __future__ import annotations

from datetime import datetime

import click
from rich.table import Table

from workledger.api import Fired, Ledger
from workledger.cli.output import console, echo_json, show
from workledger.cli.settings import Settings
from workledger.errors import BadInput, UsageError
from workledger.shapes import fired_dict, schedule_dict

JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


def _app_ledger(settings: Settings) -> Ledger:
    ledger = settings.ledger(app=True)
    if not ledger.jobs:
        raise UsageError("this command needs the schedules' declarations: pass --app "
                         "module:attribute or set WORKLEDGER_APP")
    return ledger


@click.command()
@JSON
@click.pass_obj
def schedules(settings: Settings, as_json: bool) -> None:
    """List the schedules: name, job, spec, time zone, next and last firing, the last run and
    its state, paused or not. With --app, also those declared but not yet recorded by a
    sweeper, with their catch-up and overlap rules."""
    ledger = settings.ledger(app=True)
    found = ledger.schedules()
    if as_json:
        echo_json([schedule_dict(s) for s in found])
        return
    if not found:
        click.echo("no schedules" + ("" if ledger.jobs else " recorded (pass --app to list "
                                           "the declared ones)"))
        return
    table = Table("name", "job", "spec", "tz", "next", "last firing", "last run", "state",
                  "paused", title_justify="left")
    for s in found:
        state = s.last_run_state or ""
        if not s.declared and ledger.jobs:
            state = (state + " (not declared by the app)").strip()
        table.add_row(show(s.name), show(s.job), show(s.spec), s.tz, s.next_fire_at or "",
                      s.last_fire_at or "", "" if s.last_run_id is None else str(s.last_run_id),
                      state, f"since {s.paused_at} by {s.paused_by}" if s.paused else "no")
    console(width=180).print(table)


@click.group()
def schedule() -> None:
    """Act on one schedule: pause, resume, fire now, backfill."""


@schedule.command()
@click.argument("name")
@click.pass_obj
def pause(settings: Settings, name: str) -> None:
    """Stop firing NAME (recorded with who and when). Needs --app."""
    done = _app_ledger(settings).schedule_pause(name)
    click.echo(f"schedule {name}: {'paused' if done else 'already paused; nothing changed'}")


@schedule.command()
@click.argument("name")
@click.pass_obj
def resume(settings: Settings, name: str) -> None:
    """Fire NAME again; the firings it missed while paused follow its catch_up rule. Needs
    --app."""
    done = _app_ledger(settings).schedule_resume(name)
    click.echo(f"schedule {name}: {'resumed' if done else 'not paused; nothing changed'}")


def _line(name: str, fire: datetime, fired: Fired | None) -> str:
    when = fire.isoformat()
    if fired is None:
        return f"{name} {when}: would be recorded"
    if fired.state == "submitted":
        made = "created" if fired.created else "already named by its key"
        return f"{name} {when}: run {fired.run_id} ({made})"
    if fired.state in ("skipped", "waiting"):
        return f"{name} {when}: {fired.state}, run {fired.run_id} of the schedule is not complete"
    if fired.state == "recorded":
        run = f", run {fired.run_id}" if fired.run_id else ""
        return f"{name} {when}: recorded before ({fired.was}{run}); nothing written"
    if fired.state == "failed":
        return f"{name} {when}: failed: {fired.was}"
    return f"{name} {when}: {fired.state}"


@schedule.command()
@click.argument("name")
@JSON
@click.pass_obj
def fire(settings: Settings, name: str, as_json: bool) -> None:
    """Fire NAME once now, keyed by now (to the second), under its overlap rule. Needs --app."""
    when, fired = _app_ledger(settings).schedule_fire(name)
    if as_json:
        echo_json(fired_dict(name, when, fired))
    else:
        click.echo(_line(name, when, fired))
    if fired.state == "failed":
        raise click.exceptions.Exit(1)


def _when(text: str, what: str) -> datetime:
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        raise BadInput(f"{what} {text!r}: expected an ISO 8601 time with its zone, like "
                       "2026-01-25T06:00:00+01:00 or 2026-01-25T05:00Z") from None
    if found.tzinfo is None:
        raise BadInput(f"{what} {text!r}: give the time zone (2026-01-25T05:00Z)")
    return found


@schedule.command()
@click.argument("name")
@click.option("--from", "start", required=True, metavar="ISO", help="First time (included).")
@click.option("--to", "end", required=True, metavar="ISO", help="Last time (included).")
@click.option("--dry-run", is_flag=True, help="List the firings; record nothing.")
@click.option("--yes", is_flag=True, help="Record more than 10,000 firings.")
@JSON
@click.pass_obj
def backfill(settings: Settings, name: str, start: str, end: str, dry_run: bool, yes: bool,
             as_json: bool) -> None:
    """Record every planned firing of NAME from --from to --to, each at most once: a firing
    recorded before (by a sweeper or an earlier backfill) adds nothing, so a repeated backfill
    adds nothing. Backfilled runs do not wait for each other (overlap is not applied). --from
    after --to, or more than 10,000 firings without --yes, is refused (exit 2) with nothing
    written. Needs --app."""
    begin, finish = _when(start, "--from"), _when(end, "--to")
    done = _app_ledger(settings).schedule_backfill(name, begin, finish, dry_run=dry_run,
                                                  yes=yes)
    if as_json:
        echo_json([fired_dict(name, t, f) for t, f in done])
        return
    for t, f in done:
        click.echo(_line(name, t, f))
    made = sum(1 for _, f in done if f is not None and f.state == "submitted" and f.created)
    click.echo(f"{len(done):,} firing(s) from {begin.isoformat()} to {finish.isoformat()}"
               + ("" if dry_run else f"; {made:,} new run(s)"))


COMMANDS = (schedules, schedule)
