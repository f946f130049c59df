"""Who may do what over HTTP: bearer tokens, a sign-in cookie, read-only tokens, same origin.

Tokens come from ``WORKLEDGER_TOKEN`` (full access, actor ``api``), ``WORKLEDGER_READ_TOKEN``
(GET only, actor ``read``) and a token file (``--token-file``): one ``name:token`` per line for
full access, ``name:token:read`` for reading only; blank lines and ``#`` comments are skipped.
The name is the actor recorded in ``wl_events`` for that token's actions. Without any token
``serve`` makes one for its lifetime and prints it, with a sign-in address whose code works
once, within minutes (``sessions.py``: the address stays in the browser's history, the token
must not); ``--no-token`` answers everyone instead, on loopback only (``server.py``).

Whatever the tokens, a request must name this server in its ``Host`` header (an address it
listens on, or a name given with ``--allowed-host``), and a browser's POST must come from such
an origin: a web page whose name was rebound to 127.0.0.1 is neither.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from workledger.errors import BadInput

log = logging.getLogger("workledger.http")
OPEN_ACTOR = "http"  # the actor of actions taken on a server without tokens (loopback only)
SHORT_TOKEN = 16  # characters: a token shorter than this is warned about (serve makes 32)


@dataclass(frozen=True)
class Principal:
    name: str
    can_write: bool


@dataclass(frozen=True)
class Tokens:
    """The tokens a server accepts; empty: no authentication (loopback only)."""

    by_token: tuple[tuple[str, Principal], ...] = ()
    made: bool = False  # made by serve for its lifetime: none was configured

    @classmethod
    def make(cls) -> Tokens:
        """One random full-access token for a server started without any (actor ``http``, as
        for an open server), to be shown to the operator who started it."""
        return cls(((secrets.token_urlsafe(24), Principal(OPEN_ACTOR, True)),), made=True)

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
    _warn_if_short(parts[1], where)
    return parts[1], Principal(parts[0], can_write=len(parts) == 2)


def _warn_if_short(token: str, where: str) -> None:
    """The throttle only slows a guesser down; a token's length is what stops one."""
    if len(token) < SHORT_TOKEN:
        log.warning("the token in %s is %d characters long: a short token can be guessed, "
                    "give one of %d random characters or more (python -c 'import secrets; "
                    "print(secrets.token_urlsafe(24))')", where, len(token), SHORT_TOKEN)


def load_tokens(token_file: str | None = None) -> Tokens:
    """The tokens from the environment and, if given, a token file."""
    found: list[tuple[str, Principal]] = []
    for variable, principal in (("WORKLEDGER_TOKEN", Principal("api", True)),
                                ("WORKLEDGER_READ_TOKEN", Principal("read", False))):
        if token := os.environ.get(variable):
            _warn_if_short(token, variable)
            found.append((token, principal))
    if token_file is not None:
        try:
            text = Path(token_file).read_text()
            mode = os.stat(token_file).st_mode
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"cannot read token file {token_file}: {exc}") from exc
        if mode & (stat.S_IRGRP | stat.S_IROTH | stat.S_IWGRP | stat.S_IWOTH):
            log.warning("token file %s is readable or writable by others (mode %o): "
                        "chmod 600 it", token_file, stat.S_IMODE(mode))
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


# A name or an address literal and an optional port, nothing else: no path, query, fragment,
# user or space, which urlsplit would read past (``127.0.0.1:8080/healthz?`` has host and port)
HOST_SYNTAX = re.compile(r"([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")


def check_allowed_host(given: str) -> None:
    """An ``--allowed-host`` that could match no Host header is refused at start."""
    split = _split_host(given)
    if split is None or not split[0]:
        raise BadInput(f"--allowed-host {given!r}: give a host name or address, with :PORT "
                       "if it must be that port (wl.example.com, wl.example.com:443, "
                       "[::1]:8080)")


def _split_host(host: str) -> tuple[str, int | None] | None:
    """``name`` and port of a Host header (``[::1]:8080``, ``localhost``); None if malformed."""
    if not HOST_SYNTAX.fullmatch(host):
        return None
    try:
        parts = urlsplit(f"//{host}")
        return (parts.hostname or ""), parts.port
    except ValueError:
        return None


WILDCARDS = ("0.0.0.0", "::")  # listening on every address


@dataclass(frozen=True)
class Hosts:
    """The names a request may give in ``Host`` (and a browser's POST in ``Origin``): the
    loopback addresses and the one the server listens on, with its port; the names given with
    ``--allowed-host`` (``name``: any port, ``name:port``: that one). On a server listening
    on every address, a Host may be any address literal (no DNS name, so nothing to rebind),
    an Origin only the address the request arrived at (another machine's page on the same
    port is not this server's). ``port`` None: any port. ``anywhere``: any Host, and an Origin
    only the Host's (an application that someone else's server runs, which must check Host
    itself)."""

    port: int | None = None
    listen: str = "127.0.0.1"
    names: tuple[str, ...] = ()
    anywhere: bool = False

    def allows(self, host: str | None, *, arrived_at: str | None = None,
               any_address: bool = True) -> bool:
        """Whether ``host`` (``name[:port]``) names this server. ``any_address`` False: an
        address literal on a wildcard listener only if it is ``arrived_at``."""
        if self.anywhere:
            return True
        split = _split_host(host or "")
        if split is None or not split[0]:
            return False
        name, port = split[0].lower(), split[1]
        for given in self.names:
            wanted = _split_host(given.lower())
            if wanted is not None and wanted[0] == name and wanted[1] in (None, port):
                return True
        if self.port is not None and port not in (self.port,
                                                  None if self.port == 80 else self.port):
            return False
        if is_loopback(name) or name == self.listen.strip("[]").lower():
            return True
        return self.listen in WILDCARDS and _is_address(name) and (
            any_address or _same_address(name, arrived_at))

    def allows_origin(self, origin: str, host: str | None, arrived_at: str | None = None
                      ) -> bool:
        """A browser's ``Origin``: ``http(s)://`` and one of the server's own names, of which
        on a wildcard listener the address ``arrived_at`` (the connection's own end)."""
        try:
            parts = urlsplit(origin)
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or parts.path:
            return False
        if self.anywhere:
            return parts.netloc == (host or "")
        return self.allows(parts.netloc, arrived_at=arrived_at, any_address=False)


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _same_address(name: str, other: str | None) -> bool:
    """Two address literals for one address (``::ffff:192.0.2.2`` is ``192.0.2.2``, as an
    IPv6 socket sees an IPv4 client)."""
    try:
        one, two = (ipaddress.ip_address(a.strip("[]")) for a in (name, other or ""))
    except ValueError:
        return False
    unwrapped = [getattr(a, "ipv4_mapped", None) or a for a in (one, two)]
    return unwrapped[0] == unwrapped[1]


def same_origin(origin: str | None, fetch_site: str | None, hosts: Hosts,
                host: str | None, arrived_at: str | None = None) -> bool:
    """Whether a browser's POST comes from this server's own pages: its ``Origin`` must be one
    of the server's own (never compared with ``Host``, which the page's author may choose).
    ``arrived_at``: the address the connection reached. A request without ``Origin`` and
    ``Sec-Fetch-Site`` is not from a browser form (curl, scripts): allowed."""
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    if origin is None:
        return True
    return origin != "null" and hosts.allows_origin(origin, host, arrived_at)


def navigated_here(fetch_site: str | None) -> bool:
    """Whether a GET that would sign in was typed, opened from the terminal or a bookmark, or
    followed from this server's own pages: a page of another site can make the browser load
    any address (an image, a navigation) but not choose its ``Sec-Fetch-Site``. A request
    without the header is not from a current browser (curl, scripts): allowed."""
    return fetch_site in (None, "none", "same-origin")
