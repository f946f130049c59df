"""A local SMTP server that keeps every message it accepts, for the payroll demo and its tests.

``MailSink`` is a small SMTP server (asyncio, RFC 5321 with PIPELINING) on 127.0.0.1 (a free
port) running in a thread of its own.
Each accepted message becomes one row in a SQLite file (``SinkRecords``): its Message-ID, its
recipient and the SHA-256 of its attachment. Rows are never merged, so a message sent twice is
two rows, which is exactly what the demo counts. Because the records are a file, any process
can ask ``accepted(message_id)``: that is what the payroll job's ``verify`` hook does.

>>> with MailSink("sink.db") as sink:                       # doctest: +SKIP
...     sink.outage(30)           # the next 30 s of deliveries are refused with 451
...     print(sink.host, sink.port)
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable
from email import message_from_bytes
from email.policy import compat32
from pathlib import Path
from types import TracebackType

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


_MESSAGE_ID = re.compile(rb"^Message-ID:[ \t]*(.+?)[ \t]*\r?$", re.IGNORECASE | re.MULTILINE)
_ATTACHMENT = re.compile(rb"^Content-Disposition:[ \t]*attachment", re.IGNORECASE | re.MULTILINE)
_BASE64 = re.compile(rb"^Content-Transfer-Encoding:[ \t]*base64", re.IGNORECASE | re.MULTILINE)


def attachment_digest(raw: bytes) -> tuple[str | None, str | None]:
    """(Message-ID, SHA-256 of the first attachment) of a raw RFC 5322 message: the part's
    bytes are decoded and hashed here, independently of what the sender says they are."""
    head, _, _ = raw.partition(b"\r\n\r\n")
    found = _MESSAGE_ID.search(head)
    mid = found.group(1).decode(errors="replace") if found else None
    return mid, _fast_digest(raw) if mid is not None else None


def _fast_digest(raw: bytes) -> str | None:
    """A base64 attachment found by its headers, decoded in C; any other shape goes through
    the email package's parser (slower, and the same answer)."""
    at = _ATTACHMENT.search(raw)
    if at is not None:
        start = raw.rfind(b"\r\n--", 0, at.start())
        body = raw.find(b"\r\n\r\n", at.start())
        end = raw.find(b"\r\n--", body)
        if start >= 0 and body >= 0 and end >= 0 and _BASE64.search(raw, start, body):
            try:
                return hashlib.sha256(binascii.a2b_base64(raw[body + 4:end])).hexdigest()
            except binascii.Error:
                pass
    msg = message_from_bytes(raw, policy=compat32)
    for part in msg.walk():
        if part.get_content_disposition() == "attachment":
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                return hashlib.sha256(payload).hexdigest()
    return None


class _Session(asyncio.Protocol):
    """One SMTP connection (RFC 5321: EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP, QUIT, with
    PIPELINING): refuse during an outage or for rejected domains, store what is accepted."""

    def __init__(self, sink: MailSink) -> None:
        self.sink = sink
        self.buffer = b""
        self.recipients: list[str] = []
        self.sender: str | None = None
        self.in_data = False
        self.transport: asyncio.Transport | None = None
        self.replies: list[bytes] = []
        self.receiving = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._reply("220 sink.workledger.local ESMTP workledger mail sink")

    def _reply(self, line: str) -> None:
        self.replies.append(line.encode() + b"\r\n")
        if not self.receiving:
            self._send()

    def _send(self) -> None:
        if self.transport is not None and self.replies:
            self.transport.write(b"".join(self.replies))
        self.replies = []

    def data_received(self, data: bytes) -> None:
        # the replies to pipelined commands go back in one write, not one each
        self.receiving = True
        try:
            self._received(data)
        finally:
            self.receiving = False
            self._send()

    def _received(self, data: bytes) -> None:
        self.buffer += data
        while self.buffer:
            if self.in_data:
                # the message ends at a line holding one dot; "\r\n" before it, to find one
                # that ends an empty message too, and to undo the dot-stuffing of line one
                end = (b"\r\n" + self.buffer).find(b"\r\n.\r\n")
                if end < 0:
                    return
                message = (b"\r\n" + self.buffer[:end]).replace(b"\r\n..", b"\r\n.")[2:]
                self.buffer = self.buffer[end + 3:]
                self.in_data = False
                self._reply(self._accept(message))
                continue
            line, sep, rest = self.buffer.partition(b"\r\n")
            if not sep:
                return
            self.buffer = rest
            self._command(line.decode("utf-8", errors="replace"))

    def _command(self, line: str) -> None:
        verb, _, arg = line.partition(" ")
        verb = verb.upper()
        if verb == "EHLO":
            self._reply("250-sink.workledger.local\r\n250-PIPELINING\r\n250-8BITMIME\r\n"
                        "250 SMTPUTF8")
        elif verb == "HELO":
            self._reply("250 sink.workledger.local")
        elif verb == "MAIL":
            self.sender, self.recipients = _address(arg), []
            self._reply("250 OK")
        elif verb == "RCPT":
            self._reply(self._recipient(_address(arg)))
        elif verb == "DATA":
            if self.sender is None or not self.recipients:
                self._reply("503 5.5.1 Error: need RCPT command")
            else:
                self.in_data = True
                self._reply("354 End data with <CR><LF>.<CR><LF>")
        elif verb in ("RSET", "NOOP"):
            if verb == "RSET":
                self.sender, self.recipients = None, []
            self._reply("250 OK")
        elif verb == "QUIT":
            self._reply("221 Bye")
            if self.transport is not None:
                self.transport.close()
        else:
            self._reply("502 5.5.2 Error: command not recognized")

    def _recipient(self, address: str) -> str:
        if self.sender is None:
            return "503 5.5.1 Error: need MAIL command"
        if self.sink.refusing():
            self.sink.records.refused(address, TRANSIENT)
            return TRANSIENT
        if address.rpartition("@")[2].lower() in self.sink.reject_domains:
            self.sink.records.refused(address, NO_MAILBOX)
            return NO_MAILBOX
        self.recipients.append(address)
        return "250 OK"

    def _accept(self, raw: bytes) -> str:
        recipients, self.sender, self.recipients = self.recipients, None, []
        message_id, digest = attachment_digest(raw)
        if message_id is None:
            return "554 5.6.0 A Message-ID header is required here"
        for rcpt in recipients:
            self.sink.records.record(message_id, rcpt, digest, len(raw))
        return "250 2.0.0 Message accepted for delivery"


def _address(arg: str) -> str:
    """``FROM:<a@b> SIZE=1`` -> ``a@b``."""
    _, _, rest = arg.partition(":")
    rest = rest.strip()
    if rest.startswith("<"):
        return rest[1:rest.find(">")] if ">" in rest else rest[1:]
    return rest.split(" ", 1)[0]


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class MailSink:
    """An SMTP server on ``127.0.0.1`` storing each accepted message in ``path``.

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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
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
        """Listen on 127.0.0.1 (the port given, else a free one), served by an event loop in a
        thread of its own."""
        self.records.count()  # create the file and its tables before anyone asks
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failed: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                server = loop.run_until_complete(loop.create_server(
                    lambda: _Session(self), self.host, self._port))
            except BaseException as exc:  # told to the thread that started the sink
                failed.append(exc)
                ready.set()
                return
            self.port = int(server.sockets[0].getsockname()[1])
            ready.set()
            loop.run_forever()
            server.close()
            loop.run_until_complete(server.wait_closed())
            self.records.close()  # this thread's connection
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=serve, name="wl-mail-sink", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failed:
            raise failed[0]
        return self

    def stop(self) -> None:
        if self._thread is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = self._loop = None
        self.records.close()

    def __enter__(self) -> MailSink:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
