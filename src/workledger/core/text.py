"""Text and JSON that both databases store and return alike, and text that is safe to show.

PostgreSQL refuses NUL in ``text`` and ``\\u0000`` or unpaired surrogates in ``jsonb``, and
keeps a number as the plain decimal it names (``1e20`` comes back as ``100000000000000000000``);
SQLite would take and keep anything. :func:`json_text` writes JSON both keep identically and
refuses what either would refuse, :func:`read_json` reads back whatever a row holds without
letting one row break a reader, :func:`mask_secrets` takes passwords out of anything shown,
and :func:`visible` keeps control characters from reaching a terminal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from workledger.core.limits import DEPTH, DOCUMENT_BYTES


class Unstorable(ValueError):
    pass


# -- writing JSON ------------------------------------------------------------------------------

# A real NUL is written \u0000 after an even number of backslashes (an odd number escapes the
# backslash: a literal "\u0000" in a string is not a NUL).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# A JSON string, or a number in the two forms Python writes and PostgreSQL does not keep:
# an exponent (1e+20, 1e-07) and negative zero.
_NUMBER_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?e[-+]\d+|-0\.0(?!\d)')


def json_text(value: Any, *, sort_keys: bool = False, max_bytes: int = DOCUMENT_BYTES) -> str:
    """``value`` as compact JSON text, or :class:`Unstorable` saying why it cannot be stored.

    Numbers are written the way PostgreSQL's jsonb returns them (plain decimals), so the
    text reads back the same from both databases."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, sort_keys=sort_keys,
                          separators=(",", ":"))
    except RecursionError as exc:
        raise Unstorable(f"is nested deeper than {DEPTH} levels") from exc
    except (TypeError, ValueError) as exc:
        raise Unstorable(f"not JSON-serialisable: {exc}") from exc
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise Unstorable("contains a NUL character (\\u0000)")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise Unstorable("contains invalid Unicode (an unpaired surrogate)") from exc
    if size > max_bytes:
        raise Unstorable(f"is {size:,} bytes of JSON; the limit is {max_bytes:,} bytes")
    if too_deep(value, text):
        raise Unstorable(f"is nested deeper than {DEPTH} levels")
    if "e+" in text or "e-" in text or "-0.0" in text:
        text = _NUMBER_TOKEN.sub(_plain_number, text)
    return text


def _plain_number(match: re.Match[str]) -> str:
    token = match.group()
    if token[0] == '"':
        return token
    if token == "-0.0":
        return "0.0"  # numeric has no negative zero
    return format(Decimal(token), "f")


_CONTAINERS = (dict, list, tuple)


def too_deep(value: Any, text: str | bytes | None = None, limit: int = DEPTH) -> bool:
    """Whether ``value`` nests deeper than ``limit`` levels (a scalar is 0, ``{"a": 1}`` is 1).
    ``text``, its JSON, answers at once for most documents: no more brackets than the limit,
    no deeper. Iterative, so it never recurses however deep the value is."""
    if text is not None:
        if isinstance(text, str):
            brackets = text.count("[") + text.count("{")
        else:
            brackets = text.count(b"[") + text.count(b"{")
        if brackets <= limit:
            return False
    depth = 0
    level = [value] if isinstance(value, _CONTAINERS) else []
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for v in level:
            below.extend(c for c in (v.values() if isinstance(v, dict) else v)
                         if isinstance(c, _CONTAINERS))
        level = below
    return False


def safe_text(text: str) -> str:
    """A reason or key made storable: NUL and unpaired surrogates become visible escapes."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def storable_json(text: str) -> str:
    """JSON text written by ``json.dumps`` (an event's detail) made storable: a NUL or an
    unpaired surrogate in its strings (a note typed with a byte that is not UTF-8) becomes a
    visible escape, which both databases keep, instead of what PostgreSQL refuses."""
    if "\\u0000" not in text and "\\ud" not in text:
        return text
    return json.dumps(_storable_strings(json.loads(text)))


def _storable_strings(value: Any) -> Any:
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_text(k): _storable_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable_strings(v) for v in value]
    return value


def reason_text(text: str) -> str:
    """A reason (a failure, a skip, a traceback) as stored: storable, with passwords masked,
    since reasons are shown by every listing and kept in events."""
    return mask_secrets(safe_text(text))


# -- reading JSON ------------------------------------------------------------------------------


class Undecodable(str):
    """What a reader gets instead of a JSON value it cannot decode (nested deeper than the
    limit, written by something other than workledger): a string saying so, so listings and
    JSON output show it and go on."""

    __slots__ = ()


def read_json(text: str | bytes) -> Any:
    """Decode a stored JSON value; one that is too deep or unreadable becomes :class:`Undecodable`
    rather than an exception that would stop a whole listing."""
    try:
        value = json.loads(text)
    except RecursionError:
        return Undecodable(f"<undecodable JSON: nested deeper than {DEPTH} levels>")
    except ValueError as exc:
        return Undecodable(f"<undecodable JSON: {str(exc).split(';')[0]}>")
    if too_deep(value, text):
        return Undecodable(f"<undecodable JSON: nested deeper than {DEPTH} levels>")
    return value


# -- showing text ------------------------------------------------------------------------------

# user:password@ in a URL of any scheme, even a mistyped one: the password runs to the last @
# of the word (a raw @ or / in a password is still masked; a few characters too many may be).
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s/@:]*:)[^\s]*@")
# password=... in a URL's query or a libpq key=value string (also sslpassword, PGPASSWORD=).
_KEY_PASSWORD = re.compile(
    r"""(?i)(\b\w*password\s*=\s*)('(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|[^\s&;,'"]*)""")


def mask_secrets(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with every password we can recognise replaced by ``***``: ``user:pw@`` in a URL,
    ``password=...`` in a query or a key=value connection string, and each of ``known`` (from
    :func:`url_secrets`) wherever it appears."""
    for secret in known:  # a short one only as a word of its own, not inside other words
        if len(secret) >= 6:
            text = text.replace(secret, "***")
        else:
            text = re.sub(rf"(?<![^\W_]){re.escape(secret)}(?![^\W_])", "***", text)
    if "@" in text:
        text = _URL_PASSWORD.sub(r"\1***@", text)
    if "=" in text:
        text = _KEY_PASSWORD.sub(r"\1***", text)
    return text


def url_secrets(url: str) -> list[str]:
    """The password a database URL may hold, in every reading of it, and its pieces around a
    raw ``@`` or ``/`` (a driver may read ``u:pw@rd@host`` as password ``pw`` and host
    ``rd@host``, and print the host): what must never appear in a message, whatever the
    message's shape. Single characters are left out."""
    found: list[str] = []
    head = url.rpartition("@")[0]
    start = head.find("://") + 3 if "://" in head else head.rfind("/") + 1
    _, colon, password = head[start:].partition(":")
    if colon:
        found.append(password)
    for match in _KEY_PASSWORD.finditer(url):
        found.append(match.group(2).strip("'\""))
    pieces = {p for secret in found for p in re.split(r"[@/]", secret)} | set(found)
    return sorted((p for p in pieces if len(p) >= 2), key=len, reverse=True)


def mask_url(url: str) -> str:
    """A database URL safe to print: :func:`mask_secrets`, and ``user:pw@`` even without a
    ``scheme://`` (``u:pw@host/db``, ``postgresql//u:pw@host``)."""
    text = mask_secrets(url)
    if "://" not in text and "@" in text:
        head, _, tail = text.rpartition("@")
        start = head.rfind("/") + 1
        user, colon, _ = head[start:].partition(":")
        if colon:
            text = f"{head[:start]}{user}:***@{tail}"
    return text


# C0 and C1 control characters and DEL (terminal escapes start with ESC or CSI), the marks that
# reorder text on screen (bidirectional overrides), and lone surrogates.
_UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                         "\ud800-\udfff]")
_UNSHOWABLE_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f"
                                     "\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, newlines: bool = False) -> str:
    """``text`` for a terminal: control characters as visible escapes (``\\x1b``), so a key or
    a reason cannot move the cursor, retitle the window or clear the screen. ``newlines``:
    keep line breaks (a traceback)."""
    pattern = _UNSHOWABLE_BUT_NEWLINE if newlines else _UNSHOWABLE
    return pattern.sub(_escape, text)
