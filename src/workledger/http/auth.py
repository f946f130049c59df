"""Who may do what over HTTP: bearer tokens, a sign-in cookie, read-only tokens, same origin.

Tokens come from ``WORKLEDGER_TOKEN`` (full access, actor ``api``), ``WORKLEDGER_READ_TOKEN``
(GET only, actor ``read``) and a token file (``--token-file``): one ``name:token`` per line for
full access, ``name:token:read`` for reading only; blank lines and ``#`` comments are skipped.
The name is the actor recorded in ``wl_events`` for that token's actions. Without any token
the server answers everyone, so it refuses to listen beyond loopback (``server.py``).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from workledger.errors import BadInput

COOKIE = "workledger_token"
OPEN_ACTOR = "http"  # the actor of actions taken on a server without tokens (loopback only)


@dataclass(frozen=True)
class Principal:
    name: str
    can_write: bool


@dataclass(frozen=True)
class Tokens:
    """The tokens a server accepts; empty: no authentication (loopback only)."""

    by_token: tuple[tuple[str, Principal], ...] = ()

    @property
    def required(self) -> bool:
        return bool(self.by_token)

    def who(self, token: str | None) -> Principal | None:
        """The principal of ``token``, compared in constant time with every known token."""
        if not token:
            return None
        found = None
        for known, principal in self.by_token:
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        return found


def _parse_line(line: str, where: str) -> tuple[str, Principal]:
    parts = line.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1] or (
            len(parts) == 3 and parts[2] != "read"):
        raise BadInput(f"{where}: expected name:token or name:token:read")
    return parts[1], Principal(parts[0], can_write=len(parts) == 2)


def load_tokens(token_file: str | None = None) -> Tokens:
    """The tokens from the environment and, if given, a token file."""
    found: list[tuple[str, Principal]] = []
    if token := os.environ.get("WORKLEDGER_TOKEN"):
        found.append((token, Principal("api", True)))
    if token := os.environ.get("WORKLEDGER_READ_TOKEN"):
        found.append((token, Principal("read", False)))
    if token_file is not None:
        try:
            text = Path(token_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"cannot read token file {token_file}: {exc}") from exc
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if line and not line.startswith("#"):
                found.append(_parse_line(line, f"token file {token_file} line {n}"))
    return Tokens(tuple(found))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def same_origin(origin: str | None, fetch_site: str | None, host: str | None) -> bool:
    """Whether a browser's POST comes from this server's own pages. A request without
    ``Origin`` and ``Sec-Fetch-Site`` is not from a browser form (curl, scripts): allowed."""
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    if origin is None:
        return True
    return origin != "null" and urlsplit(origin).netloc == (host or "")
