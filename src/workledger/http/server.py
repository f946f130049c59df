"""``workledger serve``: the application under uvicorn, and the daily prune when asked."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import uvicorn

from workledger.api import Ledger
from workledger.errors import UsageError, WorkledgerError
from workledger.http.app import create_app
from workledger.http.auth import Tokens, is_loopback

log = logging.getLogger("workledger.http")
DAY = 86400.0


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
          announce: Callable[[str], None] = print) -> None:
    """Listen on ``host:port`` (port 0: any free port), say where, serve until SIGINT/SIGTERM."""
    check_bind(host, tokens)
    app = create_app(ledger, tokens, export_dir)
    sock = listen(host, port)
    shown = f"[{host}]" if ":" in host else host
    announce(f"http://{shown}:{sock.getsockname()[1]}/")
    pruner = DailyPrune(ledger, prune_after) if prune_after is not None else None
    if pruner is not None:
        pruner.start()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
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
