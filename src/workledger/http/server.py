"""``workledger serve``: the application under uvicorn, and the daily prune when asked."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from workledger.api import Ledger
from workledger.errors import UsageError, WorkledgerError
from workledger.http.app import create_app
from workledger.http.auth import Hosts, Tokens, check_allowed_host, is_loopback
from workledger.http.protocol import bounded

log = logging.getLogger("workledger.http")
DAY = 86400.0
HEAD_BYTES = 32 * 1024  # a request's line and headers, at most (h11 answers 400 past it)
KEEP_ALIVE = 5.0  # seconds an idle kept-alive connection stays open
RESERVED_FILES = 64  # descriptors kept for the database, the log, the listening socket
# uvicorn's 503 counts requests in progress, and a connection closed to make room counts until
# its task has seen the close (an iteration of the loop later): room for as many being closed
CLOSING_ROOM = 64


@dataclass(frozen=True)
class Limits:
    """How much of the machine clients may hold: ``read_timeout`` seconds to send a request,
    at most ``connections`` open at once (the file descriptor limit less a reserve, at most)."""

    read_timeout: float = 10.0
    connections: int = 1000

    def within_descriptors(self) -> Limits:
        try:
            import resource  # POSIX only
        except ImportError:
            return self
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        room = soft - RESERVED_FILES if soft != resource.RLIM_INFINITY else self.connections
        return Limits(self.read_timeout, max(min(self.connections, room), 8))


def check_allowed_hosts(names: tuple[str, ...]) -> None:
    for name in names:
        check_allowed_host(name)


def check_bind(host: str, tokens: Tokens) -> None:
    """Without a token anyone who reaches the port may act: only on loopback."""
    if not tokens.required and not is_loopback(host):
        raise UsageError(f"refusing to listen on {host} without a token: set WORKLEDGER_TOKEN "
                         "(or --token-file), or listen on 127.0.0.1")


class DailyPrune(threading.Thread):
    """Prunes runs finished more than ``older_than`` seconds ago: at start, then every day."""

    def __init__(self, ledger: Ledger, older_than: float, every: float = DAY) -> None:
        super().__init__(name="workledger-prune", daemon=True)
        self.ledger, self.older_than, self.every = ledger, older_than, every
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                report = self.ledger.prune(self.older_than)
                log.info("pruned %d runs (%d items, %d events)", len(report.runs),
                         report.items, report.events)
            except WorkledgerError as exc:  # the next day tries again
                log.error("prune failed: %s", exc)
            self.stopped.wait(self.every)


def _stopped(signum: int, _frame: object) -> None:
    log.info("stopped by %s", signal.Signals(signum).name)


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a port in use is one clear error. It is made
    with proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets, and without it a
    response written in two parts waits for the client's delayed ACK (about 40 ms)."""
    try:
        family, _, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)[0]
        sock = socket.socket(family, socket.SOCK_STREAM, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(512)
        except OSError:
            sock.close()
            raise
        return sock
    except OSError as exc:
        raise WorkledgerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def serve(ledger: Ledger, *, host: str, port: int, tokens: Tokens,
          prune_after: float | None = None, export_dir: Path | None = None,
          allowed_hosts: tuple[str, ...] = (), forwarded_allow_ips: str | None = None,
          limits: Limits = Limits(), announce: Callable[[str], None] = print) -> None:
    """Listen on ``host:port`` (port 0: any free port), say where, serve until SIGINT/SIGTERM.
    ``forwarded_allow_ips``: the proxies whose X-Forwarded-For/-Proto are believed (none: no
    one's, so a client cannot claim another address to dodge the sign-in throttle)."""
    check_bind(host, tokens)
    check_allowed_hosts(allowed_hosts)
    sock = listen(host, port)
    bound = sock.getsockname()[1]
    app = create_app(ledger, tokens, export_dir, Hosts(bound, host, allowed_hosts))
    shown = f"[{host}]" if ":" in host else host
    announce(f"http://{shown}:{bound}/")
    if tokens.made:  # the address goes to a browser's history: a code that works once
        address = "127.0.0.1" if host in ("0.0.0.0", "::") else shown
        token, principal = tokens.by_token[0]
        code = app.state.codes.issue(principal)
        minutes = app.state.codes.lifetime / 60
        announce(f"sign in: http://{address}:{bound}/signin?code={code} (works once, "
                 f"within {minutes:.0f} minutes)")
        announce(f"token: {token} (for Authorization: Bearer, or the sign-in form)")
    pruner = DailyPrune(ledger, prune_after) if prune_after is not None else None
    if pruner is not None:
        pruner.start()
    calendar = ledger.schedule_loop()  # the app's schedules, fired here too (safe twice over)
    if calendar is not None:
        calendar.start()
    limits = limits.within_descriptors()
    server = uvicorn.Server(uvicorn.Config(
        app, log_level="warning", access_log=False, log_config=None, ws="none",
        http=bounded(limits.read_timeout, limits.connections),
        h11_max_incomplete_event_size=HEAD_BYTES,
        limit_concurrency=limits.connections + CLOSING_ROOM,
        timeout_keep_alive=int(KEEP_ALIVE), proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips, server_header=False))
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again for the
    # handler it found: a quiet one here, so a requested stop exits 0
    previous = {s: signal.signal(s, _stopped) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pruner is not None:
            pruner.stopped.set()
        if calendar is not None:
            calendar.stop()
