"""The ``workledger`` command line: a thin layer over :class:`workledger.Ledger`.

Every error is one line on stderr and a documented exit code (see ``workledger --help``);
no traceback unless ``WORKLEDGER_DEBUG=1``. The reference in ``docs/cli.md`` is generated
from this module by ``make docs`` (:func:`reference`) and checked by ``tests/test_docs.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence

import click
from click.core import ParameterSource

from workledger.api import mask_secrets, url_secrets
from workledger.cli import demo, read, repair, schedules, web, work
from workledger.cli.output import one_line, show
from workledger.cli.settings import Settings
from workledger.errors import WorkledgerError

EXIT_CODES = """\b
Exit codes:
  0  success
  1  operational failure: database unreachable, app failed to load or raised
  2  bad usage or bad input: unknown job or run, payload not a JSON object,
     unknown URL scheme, same key with a different payload, an input over
     its limit, no ledger at --db (only init, submit, worker and serve
     create one), a --db naming another ledger than --app's
  3  worker: more handlers stuck past their time limit than
     --concurrency; restart it

\b
With --app, the ledger is the one the app's Ledger names, for every command;
a --db or WORKLEDGER_DB naming another is refused (exit 2). An app whose
Ledger() names no URL takes --db's. The app's code runs only in the commands
that run your code or need what a job declares: submit, worker, sweep, serve
and resolve --as processed (audit and prune use it when given). Every other command
imports the app only to learn the ledger's URL.
"""


@click.group(epilog=EXIT_CODES)
@click.option("--db", envvar="WORKLEDGER_DB", metavar="URL",
              help="Ledger database: sqlite:///relative.db, sqlite:////abs.db (the path is "
                   "percent-decoded; a leading ~ is your home folder) or "
                   "postgresql://user@host:5432/db. With --app, the app's Ledger names it: "
                   "--db may only name the same one. [env WORKLEDGER_DB; default "
                   "sqlite:///workledger.db]")
@click.option("--app", envvar="WORKLEDGER_APP", metavar="MODULE:ATTR",
              help="The Ledger object holding your job definitions, e.g. myjobs:ledger (a "
                   "module name: the current directory is searched for it after the installed "
                   "packages, while it loads only). [env WORKLEDGER_APP]")
@click.version_option(package_name="workledger")
@click.pass_context
def cli(ctx: click.Context, db: str | None, app: str | None) -> None:
    """workledger: make large batches of work complete, resumable and countable.

    Every unit of a run is a durable ledger row before anything is dispatched; workers claim
    rows in chunks under leases; a run's state is derived from its items.
    """
    source = ctx.get_parameter_source("db")
    settings = Settings(db or None, app or None,
                        "WORKLEDGER_DB" if source is ParameterSource.ENVIRONMENT else "--db",
                        _secrets)
    ctx.obj = settings
    ctx.call_on_close(settings.close)


for _command in (*work.COMMANDS, *read.COMMANDS, *repair.COMMANDS, *schedules.COMMANDS,
                 *web.COMMANDS, demo.demo):
    cli.add_command(_command)


# -- reference docs ------------------------------------------------------------------------------


def _walk(cmd: click.Command, ctx: click.Context) -> Iterator[tuple[click.Command, click.Context]]:
    yield cmd, ctx
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, click.Context(sub, info_name=name, parent=ctx,
                                                    terminal_width=100, max_content_width=100))


def reference() -> str:
    """The CLI reference in Markdown, generated from the click commands (``make docs``)."""
    root = click.Context(cli, info_name="workledger", terminal_width=100, max_content_width=100)
    out = ["# CLI reference", "",
           "Generated from `src/workledger/cli/` by `make docs`; do not edit by hand.", ""]
    for cmd, ctx in _walk(cli, root):
        out += [f"## `{ctx.command_path}`", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(out)


# -- entry point ---------------------------------------------------------------------------------


# The passwords the --db URL of this process holds, however a driver reads it: no error line
# may show them, even in pieces (see fail).
_secrets: list[str] = []


def fail(message: str, code: int) -> int:
    """Print one line on stderr: never a password, never a raw control character."""
    click.echo(f"error: {show(mask_secrets(one_line(message), _secrets))}", err=True)
    return code


def _db_urls(args: Sequence[str]) -> list[str]:
    """What --db (or WORKLEDGER_DB) says on this command line, read before click parses it."""
    found = [os.environ.get("WORKLEDGER_DB", "")]
    for i, arg in enumerate(args):
        if arg == "--db" and i + 1 < len(args):
            found.append(args[i + 1])
        elif arg.startswith("--db="):
            found.append(arg[len("--db="):])
    return [url for url in found if url]


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code; every failure is one line on stderr."""
    args = list(sys.argv[1:] if argv is None else argv)
    _secrets[:] = [s for url in _db_urls(args) for s in url_secrets(url)]
    try:
        rv = cli.main(args=args, prog_name="workledger", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.exceptions.UsageError as exc:
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        return fail(exc.format_message() + where, 2)
    except click.ClickException as exc:
        return fail(exc.format_message(), exc.exit_code)
    except WorkledgerError as exc:
        return fail(str(exc) or type(exc).__name__, exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        return fail("interrupted", 130)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        if os.environ.get("WORKLEDGER_DEBUG") == "1":
            raise
        return fail(f"unexpected {type(exc).__name__}: {exc} (WORKLEDGER_DEBUG=1 shows a "
                    "traceback)", 1)


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(argv))


