"""The log output of long-lived commands (``worker``, ``serve``): stdlib :mod:`logging` to
stderr, as text a person reads or as one JSON object per line for a log collector.

Every record passes through :func:`~workledger.core.text.mask_secrets`, so no password in a
database URL reaches a log line whatever the message was built from, and through
:func:`~workledger.core.text.visible`, so no control character does either: a message built
from what a client sent cannot clear the terminal or forge a line (a traceback keeps its line
breaks).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click

from workledger.api import mask_secrets, visible

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

FORMAT_OPTION = click.option("--log-format", type=click.Choice(FORMATS), default="text",
                             show_default=True,
                             help="Log lines as text, or as one JSON object per line.")
LEVEL_OPTION = click.option("--log-level", type=click.Choice(LEVELS), default="info",
                            show_default=True,
                            help="The least severe log lines shown (debug shows each sweep).")


class MaskingFormatter(logging.Formatter):
    def __init__(self, fmt: str | None = None, secrets: Sequence[str] = ()) -> None:
        super().__init__(fmt)
        self.secrets = tuple(secrets)

    def format(self, record: logging.LogRecord) -> str:
        shown = logging.makeLogRecord(record.__dict__)
        shown.msg, shown.args = self.message(record), None
        return mask_secrets(visible(super().format(shown), newlines=True), self.secrets)

    def message(self, record: logging.LogRecord) -> str:
        """The message on one line, control characters as escapes, no password."""
        return mask_secrets(visible(record.getMessage()), self.secrets)

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        return visible(super().formatException(ei), newlines=True)


class JsonFormatter(MaskingFormatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message (and the
    exception, when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": self.message(record),
        }
        if record.exc_info:
            line["exception"] = mask_secrets(self.formatException(record.exc_info), self.secrets)
        return json.dumps(line, ensure_ascii=False)


def configure(fmt: str = "text", level: str = "info", secrets: Sequence[str] = ()) -> None:
    """Send workledger's log records to stderr in ``fmt`` at ``level``, with ``secrets`` (and
    every password it recognises) masked; replaces any handler an earlier call installed."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(secrets=secrets) if fmt == "json"
                         else MaskingFormatter(TEXT, secrets))
    logger = logging.getLogger("workledger")
    for old in [h for h in logger.handlers if getattr(h, "_workledger", False)]:
        logger.removeHandler(old)
    handler._workledger = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
