"""The payslip e-mail and its delivery by SMTP.

:class:`Mailer` classifies every SMTP answer for the ledger: 4xx or an unreachable server is a
``Retry``, 5xx a ``Permanent`` failure, and a connection lost after the message was handed over
is :class:`Uncertain` (it may have been accepted), which the job turns into a verify or a stop.
"""

from __future__ import annotations

import smtplib
import threading
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import formatdate

from workledger import Permanent, Retry
from workledger.demos.payroll.config import COMPANY, SENDER


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

    def _data(self, conn: smtplib.SMTP, raw: bytes) -> None:
        try:
            code, reply = conn.data(raw)
        except smtplib.SMTPDataError as exc:  # DATA itself refused: nothing was handed over
            self._reset(conn)
            raise _refusal(exc.smtp_code, exc.smtp_error, "DATA") from exc
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
    """The e-mail, with CRLF line ends as SMTP wants them (``email.mime``: fast enough for
    thousands of messages a minute, unlike the newer ``EmailMessage`` API)."""
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
