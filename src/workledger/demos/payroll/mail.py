"""The payslip e-mail and its delivery by SMTP.

:class:`Mailer` classifies every SMTP answer for the ledger: 4xx or an unreachable server is a
``Retry``, 5xx a ``Permanent`` failure, and a connection lost after the message was handed over
is :class:`Uncertain` (it may have been accepted), which the job turns into a verify or a stop.
"""

from __future__ import annotations

import base64
import re
import smtplib
import threading
from collections.abc import Callable
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import formatdate

from workledger import Permanent, Retry
from workledger.demos.payroll.config import COMPANY, SENDER

_DOT = re.compile(rb"(?m)^\.")  # a line starting with a dot gets another (RFC 5321 4.5.2)


class Uncertain(Exception):  # noqa: N818
    """The connection was lost after the message was handed over: it may have been accepted."""


def _refusal(code: int, reply: bytes | str, step: str) -> Exception:
    text = reply.decode(errors="replace") if isinstance(reply, bytes) else reply
    reason = f"SMTP {code} at {step}: {text}".strip()
    return Retry(reason) if 400 <= code < 500 else Permanent(reason)


class Mailer:
    """One SMTP connection per handler thread, reused across messages."""

    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._local = threading.local()

    def _connection(self) -> smtplib.SMTP:
        conn: smtplib.SMTP | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
                conn.ehlo("payroll.workledger.local")
            except (OSError, smtplib.SMTPException) as exc:
                raise Retry(f"SMTP server {self.host}:{self.port} unreachable: {exc}") from exc
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn: smtplib.SMTP | None = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass

    def send(self, recipient: str, raw: bytes) -> None:
        """Send one message. Raises Retry (4xx, unreachable), Permanent (5xx) or Uncertain."""
        conn = self._connection()
        if conn.has_extn("pipelining"):
            self._pipelined(conn, recipient, raw)
            return
        try:
            code, reply = conn.mail(SENDER)
        except (smtplib.SMTPServerDisconnected, OSError):
            self._drop()  # an idle pooled connection the server closed; nothing was sent
            conn = self._connection()
            code, reply = conn.mail(SENDER)
        try:
            if code != 250:
                raise _refusal(code, reply, "MAIL FROM")
            code, reply = conn.rcpt(recipient)
            if code not in (250, 251):
                raise _refusal(code, reply, "RCPT TO")
        except (Retry, Permanent):
            self._reset(conn)
            raise
        self._data(conn, raw)

    def _pipelined(self, conn: smtplib.SMTP, recipient: str, raw: bytes,
                   again: bool = True) -> None:
        """MAIL, RCPT and DATA in one write, their three replies read after (RFC 2920), then
        the message: one round trip fewer per step, where the server allows it."""
        try:
            conn.send(f"MAIL FROM:<{SENDER}>\r\nRCPT TO:<{recipient}>\r\nDATA\r\n")
            replies = [conn.getreply() for _ in range(3)]
        except (smtplib.SMTPServerDisconnected, OSError) as exc:
            self._drop()  # nothing was handed over yet
            if again:  # an idle pooled connection the server closed: once more, afresh
                self._pipelined(self._connection(), recipient, raw, again=False)
                return
            raise Retry(f"SMTP server {self.host}:{self.port} closed the connection: "
                        f"{exc}") from exc
        (mail, mail_reply), (rcpt, rcpt_reply), (data, data_reply) = replies
        refusal = (_refusal(mail, mail_reply, "MAIL FROM") if mail != 250 else
                   _refusal(rcpt, rcpt_reply, "RCPT TO") if rcpt not in (250, 251) else
                   _refusal(data, data_reply, "DATA") if data != 354 else None)
        if refusal is not None:
            if data == 354:  # the server took DATA all the same: end it empty, then reset
                self._end_data(conn, b"")
            self._reset(conn)
            raise refusal
        self._end_data(conn, raw)

    def _end_data(self, conn: smtplib.SMTP, raw: bytes) -> None:
        """The message after a 354, dot-stuffed, and the server's answer to it."""
        body = _DOT.sub(b"..", raw)
        if body and not body.endswith(b"\r\n"):
            body += b"\r\n"

        def hand_over() -> tuple[int, bytes]:
            conn.send(body + b".\r\n")
            return conn.getreply()

        self._answered(conn, hand_over)

    def _data(self, conn: smtplib.SMTP, raw: bytes) -> None:
        try:
            self._answered(conn, lambda: conn.data(raw))
        except smtplib.SMTPDataError as exc:  # DATA itself refused: nothing was handed over
            self._reset(conn)
            raise _refusal(exc.smtp_code, exc.smtp_error, "DATA") from exc

    def _answered(self, conn: smtplib.SMTP, hand_over: Callable[[], tuple[int, bytes]]
                  ) -> None:
        """Hand the message over; a connection lost meanwhile leaves it ``Uncertain``."""
        try:
            code, reply = hand_over()
        except (smtplib.SMTPServerDisconnected, OSError) as exc:
            self._drop()
            raise Uncertain(f"connection lost during DATA: {exc}") from exc
        if code != 250:
            self._reset(conn)
            raise _refusal(code, reply, "end of DATA")

    def _reset(self, conn: smtplib.SMTP) -> None:
        try:
            conn.rset()
        except (smtplib.SMTPException, OSError):
            self._drop()

    def close(self) -> None:
        self._drop()


def build_message(recipient: str, doc: str, period: str, mid: str, pdf: bytes) -> bytes:
    """The e-mail (multipart/mixed: a line of text and the PDF, base64), with CRLF line ends
    as SMTP wants them. Written out directly: ``email.mime`` costs half a millisecond a
    message, as much as rendering the payslip. A header that is not plain ASCII goes through
    ``email.mime``, which encodes it."""
    fields = (recipient, doc, period, mid)
    if not all(f.isascii() and "\r" not in f and "\n" not in f for f in fields):
        return _mime_message(recipient, doc, period, mid, pdf)
    boundary = f"=_payslip_{doc}_="
    body = base64.encodebytes(pdf).replace(b"\n", b"\r\n")
    head = (f"Content-Type: multipart/mixed; boundary=\"{boundary}\"\r\n"
            "MIME-Version: 1.0\r\n"
            f"From: {COMPANY} Payroll <{SENDER}>\r\n"
            f"To: {recipient}\r\n"
            f"Subject: Your payslip for {period}\r\n"
            f"Message-ID: {mid}\r\n"
            f"Date: {formatdate(usegmt=True)}\r\n"
            f"X-Document-Id: {doc}\r\n\r\n"
            f"--{boundary}\r\n"
            "Content-Type: text/plain; charset=\"us-ascii\"\r\n"
            "MIME-Version: 1.0\r\nContent-Transfer-Encoding: 7bit\r\n\r\n"
            f"Hello,\r\n\r\nyour payslip for {period} ({doc}) is attached.\r\n\r\n"
            f"{COMPANY}\r\n\r\n"
            f"--{boundary}\r\n"
            "Content-Type: application/pdf\r\nMIME-Version: 1.0\r\n"
            "Content-Transfer-Encoding: base64\r\n"
            f"Content-Disposition: attachment; filename=\"{doc}.pdf\"\r\n\r\n")
    return head.encode() + body + f"\r\n--{boundary}--\r\n".encode()


def _mime_message(recipient: str, doc: str, period: str, mid: str, pdf: bytes) -> bytes:
    msg = MIMEMultipart(boundary=f"=_payslip_{doc}_=")
    msg["From"] = f"{COMPANY} Payroll <{SENDER}>"
    msg["To"] = recipient
    msg["Subject"] = f"Your payslip for {period}"
    msg["Message-ID"] = mid
    msg["Date"] = formatdate(usegmt=True)
    msg["X-Document-Id"] = doc
    msg.attach(MIMEText(f"Hello,\n\nyour payslip for {period} ({doc}) is attached.\n\n"
                        f"{COMPANY}\n"))
    part = MIMEApplication(pdf, "pdf")
    part.add_header("Content-Disposition", "attachment", filename=f"{doc}.pdf")
    msg.attach(part)
    return msg.as_bytes().replace(b"\n", b"\r\n")
