"""A TCP proxy between a round's processes and PostgreSQL that can lose an acknowledgement.

The idea of tests/net_faults.py (``CommitCutter``), kept here so the campaign imports nothing
from the tests. Every connection is forwarded byte for byte; the client's side is read as the
frontend protocol (the untyped startup messages, then typed messages), so the proxy knows when
a client sends ``COMMIT`` (a simple ``Q`` query, as psycopg's ``commit()`` sends it, or a ``P``
parse followed by its sync). When armed (:meth:`CommitCutter.arm`), the next COMMIT of any
connection is forwarded, the server's reply is read and thrown away, and both sides are
closed: the transaction has committed, the client only sees its connection drop while it
waited for the answer. Everything else passes through untouched.
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
    replied: threading.Event = field(default_factory=threading.Event)


class CommitCutter:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._armed = 0  # COMMITs still to cut
        self.cuts = 0  # COMMITs cut so far
        self._links: list[_Link] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="commit-cutter").start()

    def url(self, dsn_url: str) -> str:
        """``dsn_url`` (a postgresql:// URL at the target) through this proxy instead."""
        host, port = self.target
        return dsn_url.replace(f"{host}:{port}", f"127.0.0.1:{self.port}", 1)

    def arm(self) -> None:
        """Lose the acknowledgement of the next COMMIT any client sends."""
        with self._lock:
            self._armed += 1

    def disarm(self) -> None:
        with self._lock:
            self._armed = 0

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
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)  # the server is down (a pg_restart): the client sees it so
                continue
            server.settimeout(None)
            link = _Link(client, server)
            self._links = [k for k in self._links if k.client.fileno() != -1] + [link]
            threading.Thread(target=self._upstream, args=(link,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(link,), daemon=True).start()

    def _take(self) -> bool:
        with self._lock:
            if self._armed <= 0:
                return False
            self._armed -= 1
            return True

    def _upstream(self, link: _Link) -> None:
        """Client to server, message by message."""
        try:
            self._startup(link)
            cutting = False  # a COMMIT was parsed: cut at its Sync
            while True:
                kind = _read_exact(link.client, 1)
                (length,) = struct.unpack("!i", _read_exact(link.client, 4))
                body = _read_exact(link.client, length - 4)
                message = kind + struct.pack("!i", length) + body
                if kind in (b"Q", b"P") and _is_commit(kind, body):
                    cutting = self._take()
                if cutting and kind in (b"Q", b"S"):
                    link.muted = True
                    link.server.sendall(message)
                    link.replied.wait(5.0)  # the server answered: it has committed
                    with self._lock:
                        self.cuts += 1
                    break
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


def _is_commit(kind: bytes, body: bytes) -> bool:
    if kind == b"P":  # statement name, then the query, each NUL-terminated
        body = body.split(b"\0", 1)[1] if b"\0" in body else b""
    query = body.split(b"\0", 1)[0].strip().rstrip(b";").strip().upper()
    return query in (b"COMMIT", b"END", b"COMMIT TRANSACTION", b"COMMIT WORK")


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
