"""``manage.py workledger ARGS...``: any workledger command on the project's ledger.

``manage.py workledger worker --until-idle``, ``manage.py workledger status 12``,
``manage.py workledger audit``: the arguments are the CLI's (``manage.py workledger --help``);
``--db`` and ``--app`` come from the project's settings (docs/django.md). The exit code is
the CLI's."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from workledger.cli import run
from workledger.contrib.django import command_line


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no type hints
    help = "Run a workledger command (worker, status, audit, ...) on the project's ledger."

    def run_from_argv(self, argv: list[str]) -> None:
        # every argument after `workledger` is the CLI's, its own --help and options included
        sys.exit(run(command_line(argv[2:])))

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER, help="a workledger command")

    def handle(self, *args: str, **options: Any) -> None:
        """For ``call_command("workledger", "status", "12")``."""
        code = run(command_line(args))
        if code:
            raise CommandError(f"workledger {' '.join(args[:1])} exited {code}",
                               returncode=code)
