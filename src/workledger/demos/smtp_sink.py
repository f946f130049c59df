"""A local SMTP server that keeps every message it accepts, for the payroll demo and its tests.

``MailSink`` is an aiosmtpd server on 127.0.0.1 (a free port) running in a thread of its own.
Each accepted message becomes one row in a SQLite file (``SinkRecords``): its Message-ID, its
recipient and the SHA-256 of its attachment. Rows are never merged, so a message sent twice is
two rows, which is exactly what the demo counts. Because the records are a file, any process
can ask ``accepted(message_id)``: that is what the payroll job's ``verify`` hook does.

>>> with MailSink("sink.db") as sink:                       # doctest: +SKIP
...     sink.outage(30)           # the next 30 s of deliveries are refused with 451
...     print(sink.host, sink.port)
"""

from __future__ import annotations

import errno
import hashlib
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable
from email import message_from_bytes
from email.policy import compat32
from pathlib import Path
from types import TracebackType

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from workledger.demos.local_db import LocalDb

HOST = "127.0.0.1"
TRANSIENT = "451 4.3.2 System not accepting network messages, try again later"
NO_MAILBOX = "550 5.1.1 Mailbox unavailable: no such user"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id          INTEGER PRIMARY KEY,
    message_id  TEXT NOT NULL,
    recipient   TEXT NOT NULL,
    attachment_sha256 TEXT,
    size        INTEGER NOT NULL,
    received_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
CREATE INDEX IF NOT EXISTS messages_by_id ON messages (message_id);
CREATE TABLE IF NOT EXISTS refusals (
    id          INTEGER PRIMARY KEY,
    recipient   TEXT NOT NULL,
    reply       TEXT NOT NULL,
    at          TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
"""


def _prefix_range(prefix: str) -> tuple[str, str]:
    """Bounds so that ``lo <= message_id < hi`` means "starts with prefix" (uses the index)."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\U0010ffff"


class SinkRecords:
    """The sink's SQLite file: what it accepted and what it refused. One connection per thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = LocalDb(self.path, _SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        return self._db.conn()

    def record(self, message_id: str, recipient: str, attachment_sha256: str | None,
               size: int) -> None:
        self._conn().execute(
            "INSERT INTO messages (message_id, recipient, attachment_sha256, size)"
            " VALUES (?, ?, ?, ?)", (message_id, recipient, attachment_sha256, size))

    def refused(self, recipient: str, reply: str) -> None:
        self._conn().execute("INSERT INTO refusals (recipient, reply) VALUES (?, ?)",
                             (recipient, reply))

    def accepted(self, message_id: str) -> bool:
        """Has a message with this Message-ID been accepted (250 after DATA)?"""
        row = self._conn().execute("SELECT 1 FROM messages WHERE message_id = ? LIMIT 1",
                                   (message_id,)).fetchone()
        return row is not None

    def count(self, prefix: str = "") -> int:
        """Messages accepted whose Message-ID starts with ``prefix`` (duplicates included)."""
        lo, hi = _prefix_range(prefix)
        row = self._conn().execute(
            "SELECT count(*) FROM messages WHERE message_id >= ? AND message_id < ?",
            (lo, hi)).fetchone()
        return int(row[0])

    def per_message_id(self, prefix: str = "") -> dict[str, int]:
        """How many times each Message-ID (starting with ``prefix``) was accepted."""
        lo, hi = _prefix_range(prefix)
        rows = self._conn().execute(
            "SELECT message_id, count(*) FROM messages WHERE message_id >= ? AND message_id < ?"
            " GROUP BY message_id", (lo, hi))
        return {mid: int(n) for mid, n in rows}

    def messages(self, prefix: str = "") -> list[tuple[str, str, str | None]]:
        """(Message-ID, recipient, attachment hash) of each accepted message, in arrival order."""
        lo, hi = _prefix_range(prefix)
        rows = self._conn().execute(
            "SELECT message_id, recipient, attachment_sha256 FROM messages"
            " WHERE message_id >= ? AND message_id < ? ORDER BY id", (lo, hi))
        return [(str(m), str(r), None if h is None else str(h)) for m, r, h in rows]

    def refusals(self) -> dict[str, int]:
        """How many recipients were refused, per reply code (``451``, ``550``)."""
        rows = self._conn().execute(
            "SELECT substr(reply, 1, 3), count(*) FROM refusals GROUP BY 1 ORDER BY 1")
        return {str(code): int(n) for code, n in rows}

    def close(self) -> None:
        self._db.close()


def attachment_digest(raw: bytes) -> tuple[str | None, str | None]:
    """(Message-ID, SHA-256 of the first attachment) of a raw RFC 5322 message."""
    msg = message_from_bytes(raw, policy=compat32)  # the fast parser; no header objects
    digest = None
    for part in msg.walk():
        if part.get_content_disposition() == "attachment":
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                digest = hashlib.sha256(payload).hexdigest()
                break
    mid = msg.get("Message-ID")
    return (None if mid is None else str(mid).strip()), digest


class _Handler:
    """aiosmtpd hooks: refuse during an outage or for rejected domains, store what is accepted."""

    def __init__(self, sink: MailSink) -> None:
        self.sink = sink

    async def handle_RCPT(  # noqa: N802 - the name aiosmtpd looks for
        self, server: SMTP, session: Session, envelope: Envelope, address: str,
        rcpt_options: list[str],
    ) -> str:
        if self.sink.refusing():
            self.sink.records.refused(address, TRANSIENT)
            return TRANSIENT
        if address.rpartition("@")[2].lower() in self.sink.reject_domains:
            self.sink.records.refused(address, NO_MAILBOX)
            return NO_MAILBOX
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(  # noqa: N802
        self, server: SMTP, session: Session, envelope: Envelope,
    ) -> str:
        raw = envelope.original_content or b""
        message_id, digest = attachment_digest(raw)
        if message_id is None:
            return "554 5.6.0 A Message-ID header is required here"
        for rcpt in envelope.rcpt_tos:
            self.sink.records.record(message_id, rcpt, digest, len(raw))
        return "250 2.0.0 Message accepted for delivery"


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class MailSink:
    """An aiosmtpd server on ``127.0.0.1`` storing each accepted message in ``path``.

    ``reject_domains``: recipients there are refused permanently (550). ``outage(seconds)``:
    refuse every recipient with 451 for that long, from now or (``on_first_delivery=True``)
    from the first delivery attempt that follows. ``port``: the port to listen on (0: a free
    one, found when it starts).
    """

    def __init__(self, path: str | Path, *, reject_domains: Iterable[str] = (),
                 port: int = 0) -> None:
        self.records = SinkRecords(path)
        self._port = port
        self.reject_domains = {d.lower() for d in reject_domains}
        self.host = HOST
        self.port = 0
        self._controller: Controller | None = None
        self._lock = threading.Lock()
        self._outage_seconds = 0.0
        self._outage_until: float | None = None  # monotonic deadline once the outage began

    # -- outage switch -----------------------------------------------------------------------

    def outage(self, seconds: float, *, on_first_delivery: bool = False) -> None:
        with self._lock:
            self._outage_seconds = max(0.0, seconds)
            self._outage_until = None if on_first_delivery else time.monotonic() + seconds

    def refusing(self) -> bool:
        with self._lock:
            if self._outage_seconds <= 0:
                return False
            now = time.monotonic()
            if self._outage_until is None:
                self._outage_until = now + self._outage_seconds
            if now < self._outage_until:
                return True
            self._outage_seconds = 0.0
            return False

    def outage_left(self) -> tuple[float, bool]:
        """(seconds of refusal left, whether the outage has begun)."""
        with self._lock:
            if self._outage_seconds <= 0:
                return 0.0, False
            if self._outage_until is None:
                return self._outage_seconds, False
            return max(0.0, self._outage_until - time.monotonic()), True

    # -- server ------------------------------------------------------------------------------

    def start(self) -> MailSink:
        self.records.count()  # create the file and its tables before anyone asks
        for attempt in range(20):
            port = self._port or free_port(self.host)
            controller = Controller(_Handler(self), hostname=self.host, port=port,
                                    server_hostname="sink.workledger.local", ready_timeout=10)
            try:
                controller.start()
            except OSError as exc:  # another process took the port between probe and bind
                if exc.errno != errno.EADDRINUSE or attempt == 19 or self._port:
                    raise
                continue
            self._controller, self.port = controller, port
            return self
        raise RuntimeError("no free port for the mail sink")

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None
        self.records.close()

    def __enter__(self) -> MailSink:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
