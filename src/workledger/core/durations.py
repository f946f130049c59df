"""Durations as people write them: a number and a unit, ``30s``, ``5m``, ``2h``, ``7d``, ``2w``
(a fraction, ``1.5h``, spaces around and between, and upper-case units are read too).

The one parser behind every duration the ledger reads: prune's ``--finished-before`` and
``serve --prune-after``, the ages of ``audit --since``, and the units of a stage's
``rate_limit``. Plain values in and out: a caller turns :class:`BadDuration` into its own kind
of error, keeping the message (one line, with the accepted forms).
"""

from __future__ import annotations

import re

# Seconds in each unit a duration or a rate may name.
UNIT_SECONDS: dict[str, float] = {
    "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)


class BadDuration(ValueError):
    """Text that is not a duration; the message names the accepted forms."""


def seconds_of(text: object) -> float | None:
    """The seconds ``text`` names (``"90m"`` -> 5400.0); None when it is not a duration."""
    found = _DURATION.match(text) if isinstance(text, str) else None
    if found is None:
        return None
    return float(found.group(1)) * UNIT_SECONDS[found.group(2).lower()]


def parse_duration(text: object) -> float:
    """The seconds ``text`` names; :class:`BadDuration` for anything that is not a duration."""
    seconds = seconds_of(text)
    if seconds is None:
        raise BadDuration(f"bad duration {text!r}: expected a number and a unit, like 30d, "
                          "12h, 90m or 45s")
    return seconds
