"""A real TCP proxy between PostgreSQL and its clients that can lose an acknowledgement: the
fault campaign's ``lost_ack`` (every process of a round that draws it connects through one) and
the tests' (tests/net_faults.py imports it from here, so the campaign imports nothing from the
tests and there is one proxy).

``CommitCutter`` listens on a free port of 127.0.0.1 and forwards every connection to the
server byte for byte. It reads the client's side as the frontend protocol (the untyped startup
messages, then typed messages), so it knows when a client sends ``COMMIT`` (a simple ``Q``
query, as psycopg's ``commit()`` sends it, or a ``P`` parse followed by a sync). When armed, it
acts on the next COMMIT of any connection:

- ``"after"`` (a lost acknowledgement): the COMMIT is forwarded, the server's reply is read and
  thrown away, then both sides are closed. The transaction has committed; the client only sees
  its connection drop while it waited for the answer.
- ``"before"`` (a commit that never arrived): the COMMIT is not forwarded and the client's side
  is closed, while the server's side stays open, so the server's session sits idle in its
  transaction ('in progress' to everyone else) until it is terminated or times out.

Each :meth:`CommitCutter.arm` acts on one COMMIT; :meth:`CommitCutter.disarm` drops the arms
not used yet. Everything else passes through untouched, including the connections opened
afterwards.
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass, field

# the startup-phase request codes that are answered and followed by another untyped message
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104


@dataclass
class _Link:
    client: socket.socket
    server: socket.socket
    muted: bool = False  # the server's bytes are no longer passed to the client
    wrote: bool = False  # the open transaction sent a statement that writes
    replied: threading.Event = field(default_factory=threading.Event)


class CommitCutter:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._mode = "after"
        self._armed = 0  # COMMITs still to act on
        self._then_refuse = False
        self._writes_only = False
        self.cuts = 0  # COMMITs acted on
        self._cut = threading.Condition(self._lock)
        self._links: list[_Link] = []
        self._closed = False
        self.refusing = False  # new connections are closed at once (the server unreachable)
        threading.Thread(target=self._accept, daemon=True, name="commit-cutter").start()

    def url(self, dsn_url: str) -> str:
        """``dsn_url`` (a postgresql:// URL at the target) through this proxy instead."""
        host, port = self.target
        return dsn_url.replace(f"{host}:{port}", f"127.0.0.1:{self.port}", 1)

    def arm(self, mode: str = "after", then_refuse: bool = False,
            writes_only: bool = False) -> None:
        """Act on one more COMMIT any client sends (``"after"`` or ``"before"``, above);
        ``then_refuse``: from that moment on, refuse every new connection; ``writes_only``:
        only the COMMIT of a transaction that sent an INSERT, UPDATE, DELETE or WITH."""
        assert mode in ("after", "before")
        with self._lock:
            self._armed += 1
            self._mode = mode
            self._then_refuse = then_refuse
            self._writes_only = writes_only

    def disarm(self) -> None:
        """The arms not used yet are dropped (a campaign's chaos has ended)."""
        with self._lock:
            self._armed = 0

    def wait_cut(self, count: int, timeout: float = 10.0) -> bool:
        with self._cut:
            return self._cut.wait_for(lambda: self.cuts >= count, timeout)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for link in list(self._links):
            _close(link.client)
            _close(link.server)

    # -- plumbing --------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _addr = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)  # the server is down (a restart): the client sees it so
                continue
            server.settimeout(None)
            link = _Link(client, server)
            self._links = [k for k in self._links if k.client.fileno() != -1] + [link]
            threading.Thread(target=self._upstream, args=(link,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(link,), daemon=True).start()

    def _take(self, wrote: bool) -> str | None:
        """The armed mode, one arm used: only one COMMIT is acted on per ``arm``."""
        with self._lock:
            if self._armed <= 0 or (self._writes_only and not wrote):
                return None
            self._armed -= 1
            if self._then_refuse:
                self.refusing = True
            return self._mode

    def _counted(self) -> None:
        with self._cut:
            self.cuts += 1
            self._cut.notify_all()

    def _upstream(self, link: _Link) -> None:
        """Client to server, message by message."""
        try:
            self._startup(link)
            pending: str | None = None  # the mode of a COMMIT parsed, acted on at its Sync
            while True:
                kind = _read_exact(link.client, 1)
                (length,) = struct.unpack("!i", _read_exact(link.client, 4))
                body = _read_exact(link.client, length - 4)
                message = kind + struct.pack("!i", length) + body
                if kind in (b"Q", b"P"):
                    query = _query(kind, body)
                    if query in _COMMITS:
                        pending = self._take(link.wrote)
                    if query in _COMMITS or query.startswith(b"ROLLBACK"):
                        link.wrote = False
                    elif query.startswith((b"INSERT", b"UPDATE", b"DELETE", b"WITH")):
                        link.wrote = True
                if pending == "before":  # neither the COMMIT nor what follows it is sent
                    if kind in (b"Q", b"S"):
                        self._counted()
                        _close(link.client)  # the server never sees this COMMIT
                        return
                    continue
                if pending == "after" and kind in (b"Q", b"S"):
                    link.muted = True
                    link.server.sendall(message)
                    link.replied.wait(5.0)  # the server answered: it has committed
                    self._counted()
                    _close(link.client)
                    _close(link.server)
                    return
                link.server.sendall(message)
        except OSError:
            pass
        _close(link.client)
        _close(link.server)

    def _startup(self, link: _Link) -> None:
        """The untyped messages: an SSL or GSS request (answered by the server with one byte,
        passed down by ``_downstream``) and then the startup message itself."""
        while True:
            head = _read_exact(link.client, 4)
            (length,) = struct.unpack("!i", head)
            body = _read_exact(link.client, length - 4)
            link.server.sendall(head + body)
            code = struct.unpack("!i", body[:4])[0] if len(body) >= 4 else 0
            if code not in (_SSL_REQUEST, _GSSENC_REQUEST):
                return

    def _downstream(self, link: _Link) -> None:
        try:
            while True:
                data = link.server.recv(65536)
                if not data:
                    break
                if link.muted:
                    link.replied.set()
                    continue
                link.client.sendall(data)
        except OSError:
            pass
        link.replied.set()
        if not link.muted:
            _close(link.client)


_COMMITS = (b"COMMIT", b"END", b"COMMIT TRANSACTION", b"COMMIT WORK")


def _query(kind: bytes, body: bytes) -> bytes:
    """The query text of a Q or P message, upper case, comments before it left out."""
    if kind == b"P":  # statement name, then the query, each NUL-terminated
        body = body.split(b"\0", 1)[1] if b"\0" in body else b""
    text = body.split(b"\0", 1)[0].strip()
    while text.startswith(b"--"):  # a statement's leading comment lines
        text = text.split(b"\n", 1)[1].strip() if b"\n" in text else b""
    return text.rstrip(b";").strip().upper()


def _read_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        data = sock.recv(n)
        if not data:
            raise OSError("closed")
        chunks.append(data)
        n -= len(data)
    return b"".join(chunks)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
