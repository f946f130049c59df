"""Text and JSON that both databases can store: no NUL characters, no lone surrogates, no NaN.

PostgreSQL refuses NUL in ``text`` and ``\\u0000`` or unpaired surrogates in ``jsonb``; SQLite
would take them. Refusing them the same way on both backends keeps the backends equivalent.
"""

from __future__ import annotations

import json
from typing import Any


class Unstorable(ValueError):
    pass


def json_text(value: Any, *, sort_keys: bool = False) -> str:
    """``value`` as compact JSON text, or :class:`Unstorable` saying why it cannot be stored."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, sort_keys=sort_keys,
                          separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise Unstorable(f"not JSON-serialisable: {exc}") from exc
    if "\\u0000" in text:
        raise Unstorable("contains a NUL character (\\u0000)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Unstorable("contains invalid Unicode (an unpaired surrogate)") from exc
    return text


def safe_text(text: str) -> str:
    """A reason or key made storable: NUL and unpaired surrogates become visible escapes."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
