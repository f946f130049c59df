"""Operating from a browser and keeping the ledger small: serve, prune."""

from __future__ import annotations

import logging
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from workledger.api import open_private, parse_duration, url_secrets
from workledger.cli import logs
from workledger.cli.output import echo_json
from workledger.cli.settings import Settings
from workledger.errors import BadInput, UsageError

SERVE_RETRY_FOR = 10.0  # seconds a request waits for the database before it answers 503
WEB_EXTRA = "pip install 'workledger[web]'"


def _server() -> Any:
    """The HTTP layer; it needs FastAPI, uvicorn, Jinja2 and prometheus-client (the ``web``
    extra), which the library itself does not."""
    try:
        from workledger.http import load_tokens, server
    except ImportError as exc:
        missing = exc.name or "a dependency"
        raise UsageError(f"serve needs {missing}, which is not installed: {WEB_EXTRA} "
                         "(make demo does it)") from exc
    return load_tokens, server


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Beyond loopback only with a token.")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8080, show_default=True,
              help="Port to listen on (0: any free port, printed).")
@click.option("--token-file", metavar="PATH",
              help="Tokens, one 'name:token' (full) or 'name:token:read' (GET only) per line; "
                   "the name is the actor recorded for its actions. Also WORKLEDGER_TOKEN "
                   "(actor api) and WORKLEDGER_READ_TOKEN (read only). With none, serve "
                   "makes one and prints it, and a sign-in address that works once.")
@click.option("--no-token", is_flag=True,
              help="With no token configured, answer anyone who reaches the port instead of "
                   "making one (loopback only).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME[:PORT]",
              help="A name clients may give in the Host header besides the addresses serve "
                   "listens on (the name a proxy or a browser uses). Repeatable.")
@click.option("--forwarded-allow-ips", metavar="IPS",
              help="The proxies (comma-separated addresses or networks) whose X-Forwarded-For "
                   "and X-Forwarded-Proto are believed: HTTPS behind such a proxy gets Secure "
                   "__Host- session cookies. Default: nobody's.")
@click.option("--read-timeout", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True, metavar="SECONDS",
              help="A client that has not sent a whole request by then is disconnected.")
@click.option("--prune-after", metavar="DURATION",
              help="Prune runs finished longer ago than this (e.g. 30d), at start and daily.")
@click.option("--export-dir", metavar="DIR",
              help="Where POST /api/prune may write its export files.")
@logs.FORMAT_OPTION
@logs.LEVEL_OPTION
@click.pass_obj
def serve(settings: Settings, host: str, port: int, token_file: str | None, no_token: bool,
          allowed_hosts: tuple[str, ...], forwarded_allow_ips: str | None,
          read_timeout: float, prune_after: str | None,
          export_dir: str | None, log_format: str, log_level: str) -> None:
    """Serve the JSON API (/api), the dashboard (/), /metrics and /healthz over HTTP.

    Prints the address, then serves until SIGINT or SIGTERM. With no token configured it
    makes one for its lifetime and prints it, with a sign-in address that works once within
    10 minutes; --no-token answers anyone instead, on loopback only. Requests must name this
    server in Host (an address it listens on, or an --allowed-host). Jobs for POST
    /api/jobs/JOB/runs come from --app (loaded; the current directory is searched for that
    module only, not for what is imported later); like a worker, it creates the ledger when
    there is none. docs/http.md, Deploying, says what a reverse proxy must add beyond
    loopback.
    """
    logs.configure(log_format, log_level, url_secrets(settings.url))
    mask_uvicorn_logs()
    warn_of_a_visible_password(settings)
    warn_of_believing_everyone(forwarded_allow_ips)
    load_tokens, server = _server()
    server.check_allowed_hosts(allowed_hosts)
    older = parse_duration(prune_after) if prune_after is not None else None
    folder = Path(export_dir) if export_dir is not None else None
    if folder is not None and not folder.is_dir():
        raise BadInput(f"--export-dir {export_dir}: no such folder")
    tokens = load_tokens(token_file)
    server.check_bind(host, tokens)  # beyond loopback only with a token of one's own
    if not tokens.required and not no_token:
        tokens = tokens.make()
    ledger = settings.ledger(app=True, create=True)  # it takes submissions, like a worker
    ledger.ping()
    # a request waits out a short outage (a restart, a failover), then answers 503
    ledger.wait_out_outages(SERVE_RETRY_FOR)
    server.serve(ledger, host=host, port=port, tokens=tokens, prune_after=older,
                 export_dir=folder, allowed_hosts=allowed_hosts,
                 forwarded_allow_ips=forwarded_allow_ips,
                 limits=server.Limits(read_timeout=read_timeout),
                 announce=lambda line: click.echo(
                     line if line.startswith(("sign in:", "token:"))
                     else f"workledger serve: {line} ({ledger.where})"))


def warn_of_a_visible_password(settings: Settings) -> None:
    """A password in ``--db`` on serve's command line shows in ``ps`` to every user of the
    machine for as long as it runs: said once, at start (the environment does not show)."""
    db = settings.db
    root = click.get_current_context().find_root()
    if db and url_secrets(db) and db in sys.argv and (
            root.get_parameter_source("db") is ParameterSource.COMMANDLINE):
        click.echo("warning: --db holds a password, which anyone on this machine can read in "
                   "the process list (ps): give the URL in WORKLEDGER_DB instead", err=True)


def warn_of_believing_everyone(forwarded_allow_ips: str | None) -> None:
    """``*`` believes X-Forwarded-For from any client, which then names its own address: it
    can dodge the sign-in throttle, or have another address counted. Said once, at start."""
    if forwarded_allow_ips is not None and "*" in forwarded_allow_ips.split(","):
        click.echo("warning: --forwarded-allow-ips '*' believes X-Forwarded-For from every "
                   "client: safe only when every client comes through a proxy that overwrites "
                   "that header; give the proxy's address instead", err=True)


def mask_uvicorn_logs() -> None:
    """uvicorn's own loggers (a bad request, an error in the application) through the same
    masking handler as workledger's, never straight to stderr."""
    ours = logging.getLogger("workledger")
    theirs = logging.getLogger("uvicorn")
    theirs.handlers = [h for h in ours.handlers if getattr(h, "_workledger", False)]
    theirs.setLevel(logging.WARNING)
    theirs.propagate = False
    errors = logging.getLogger("uvicorn.error")
    for kind in (NoWebsocketNews, RepeatedNews):
        if not any(isinstance(f, kind) for f in errors.filters):
            errors.addFilter(kind())


class NoWebsocketNews(logging.Filter):
    """serve answers no websocket by design (``ws="none"``): uvicorn's two warnings for each
    upgrade request would only let any client write lines to the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return not text.startswith(("Unsupported upgrade request",
                                    "No supported WebSocket library"))


class RepeatedNews(logging.Filter):
    """uvicorn writes a line for each malformed request and each one past the concurrency
    limit: any client could flood the log. Each such line at most once every ``every``
    seconds, saying how many it stands for."""

    LINES = ("Invalid HTTP request received.", "Exceeded concurrency limit.")

    def __init__(self, every: float = 10.0) -> None:
        super().__init__()
        self.every = every
        self._last: dict[str, tuple[float, int]] = {}  # line -> (when written, left out since)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text not in self.LINES:
            return True
        written, left_out = self._last.get(text, (float("-inf"), 0))
        if record.created - written < self.every:
            self._last[text] = (written, left_out + 1)
            return False
        self._last[text] = (record.created, 0)
        if left_out:
            record.msg, record.args = f"{text} ({left_out:,} more since the last, not logged)", None
        return True


@click.command()
@click.option("--finished-before", "finished_before", required=True, metavar="DURATION",
              help="Prune runs finished longer ago than this: 30d, 12h, 90m, 45s.")
@click.option("--job", help="Only runs of this job.")
@click.option("--dry-run", is_flag=True, help="List what would go; delete nothing.")
@click.option("--export", "export", metavar="FILE",
              help="First append each run, item and event to FILE as JSON Lines.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def prune(settings: Settings, finished_before: str, job: str | None, dry_run: bool,
          export: str | None, as_json: bool) -> None:
    """Delete runs finished before the cutoff with their items, counts and events.

    A run counts as finished when every item is terminal (a cancelled run's are, once its
    pending items were skipped); a run with unknown items is never pruned, nor one whose
    closing hook has not run yet (recorded at submit; for runs older than that record,
    declared by --app when given). Deletes in short batches, safe while workers run.
    """
    older = parse_duration(finished_before)
    ledger = settings.ledger(app=True)
    with ExitStack() as stack:
        out = None
        if export is not None and not dry_run:
            try:
                out = stack.enter_context(open_private(export))
            except OSError as exc:
                raise BadInput(f"cannot write export file {export}: {exc.strerror}") from exc
        report = ledger.prune(older, job=job, dry_run=dry_run, export=out)
    if as_json:
        echo_json(report.to_dict())
        return
    verb = "would prune" if dry_run else "pruned"
    click.echo(f"{verb} {len(report.runs)} run{'s' if len(report.runs) != 1 else ''}"
               f" ({report.items} items" + ("" if dry_run else f", {report.events} events")
               + ")" + (f": {', '.join(map(str, report.runs[:20]))}" if report.runs else "")
               + (" ..." if len(report.runs) > 20 else ""))
    if report.resumed:
        click.echo(f"finished {len(report.resumed)} prune(s) left part-way earlier")
    if report.closing:
        click.echo(f"kept {len(report.closing)} run(s) whose closing hook has not run yet: "
                   + _ids(report.closing))
    if report.kept:
        click.echo(f"kept {len(report.kept)} run(s) that changed meanwhile: "
                   + _ids(report.kept))


def _ids(run_ids: list[int]) -> str:
    return ", ".join(map(str, run_ids[:20])) + (" ..." if len(run_ids) > 20 else "")


COMMANDS = (serve, prune)
