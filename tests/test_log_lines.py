"""Log lines carry no raw control character: a message built from what a client sent (a
path, a header) cannot clear the operator's terminal nor forge a line of its own, in the text
format or the JSON one; a traceback keeps its line breaks."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from workledger.cli.logs import TEXT, JsonFormatter, MaskingFormatter

pytestmark = pytest.mark.unit
HOSTILE = "GET /runs/1/items/\x00/0 \x1b[2J\u202e\x9b\n2026-12-03 00:00:00 INFO workledger: forged"


def _record(message: str, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("bad \x00 value \x1b[31m")
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("workledger.http", logging.ERROR, __file__, 1, "request %s failed",
                             (message,), info)


def _raw_controls(text: str, keep: str = "") -> list[str]:
    return [c for c in text if c not in keep and (ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0
                                                  or c in "\u202e")]


def test_a_text_log_line_shows_control_characters_as_escapes_and_stays_one_line() -> None:
    line = MaskingFormatter(TEXT).format(_record(HOSTILE))
    assert _raw_controls(line) == [] and "\\x00" in line and "\\x1b" in line
    assert "\n" not in line  # no forged line
    with_traceback = MaskingFormatter(TEXT).format(_record(HOSTILE, exc=True))
    assert _raw_controls(with_traceback, keep="\n") == []
    assert "Traceback" in with_traceback and with_traceback.count("\n") >= 3


def test_a_json_log_line_holds_no_raw_control_character_either() -> None:
    line = JsonFormatter().format(_record(HOSTILE, exc=True))
    assert _raw_controls(line) == []
    fields = json.loads(line)
    assert "\x00" not in fields["message"] and "\\x00" in fields["message"]
    assert "\x00" not in fields["exception"] and "Traceback" in fields["exception"]
