"""The payroll demo's mail path over real TCP: the pipelined sender (``Mailer``) against the
demo's SMTP sink, and a plain ``smtplib`` client against the same sink, so neither side is only
checked against itself."""

from __future__ import annotations

import hashlib
import smtplib
from pathlib import Path

import pytest

from workledger import Permanent, Retry
from workledger.demos.payroll.mail import Mailer, _mime_message, build_message
from workledger.demos.smtp_sink import MailSink, attachment_digest

pytestmark = pytest.mark.integration

PDF = b"%PDF-1.4\n.a line that starts with a dot\n..and two\n" + bytes(range(256)) * 8


@pytest.fixture
def sink(tmp_path: Path) -> MailSink:
    s = MailSink(tmp_path / "sink.db", reject_domains=["gone.example"]).start()
    yield s  # type: ignore[misc]
    s.stop()


def test_a_pipelined_message_arrives_whole_and_its_attachment_is_hashed_by_the_sink(
        sink: MailSink) -> None:
    mailer = Mailer(sink.host, sink.port)
    raw = build_message("ada@staff.example", "PS-1", "2026-11", "<1/deliver/0@w>", PDF)
    for _ in range(3):  # one connection, reused
        mailer.send("ada@staff.example", raw)
    mailer.close()
    assert sink.records.messages() == [
        ("<1/deliver/0@w>", "ada@staff.example", hashlib.sha256(PDF).hexdigest())] * 3


def test_refusals_are_classified_and_the_connection_goes_on(sink: MailSink) -> None:
    mailer = Mailer(sink.host, sink.port)
    raw = build_message("x@gone.example", "PS-2", "2026-11", "<1/deliver/1@w>", PDF)
    with pytest.raises(Permanent, match="SMTP 550 at RCPT TO"):
        mailer.send("x@gone.example", raw)
    sink.outage(60)
    with pytest.raises(Retry, match="SMTP 451 at RCPT TO"):
        mailer.send("ada@staff.example", raw)
    sink.outage(0)
    mailer.send("ada@staff.example", raw)  # the same connection, after two refusals
    assert [m for m, _, _ in sink.records.messages()] == ["<1/deliver/1@w>"]
    assert sink.records.refusals() == {"451": 1, "550": 1}


def test_a_plain_client_without_pipelining_is_served_the_same(sink: MailSink) -> None:
    raw = _mime_message("bo@staff.example", "PS-3", "2026-11", "<1/deliver/2@w>", PDF)
    with smtplib.SMTP(sink.host, sink.port) as client:
        client.helo("plain.example")  # HELO: no extensions, one command at a time
        client.sendmail("payroll@example", ["bo@staff.example"], raw)
        with pytest.raises(smtplib.SMTPDataError, match="Message-ID"):
            client.sendmail("payroll@example", ["bo@staff.example"], b"Subject: x\r\n\r\nhi\r\n")
    ((mid, rcpt, digest),) = sink.records.messages()
    assert (mid, rcpt, digest) == ("<1/deliver/2@w>", "bo@staff.example",
                                   hashlib.sha256(PDF).hexdigest())


def test_the_direct_message_and_the_email_package_give_the_same_attachment() -> None:
    direct = build_message("a@b.example", "PS-4", "2026-11", "<m@w>", PDF)
    mime = _mime_message("a@b.example", "PS-4", "2026-11", "<m@w>", PDF)
    assert attachment_digest(direct) == attachment_digest(mime) == (
        "<m@w>", hashlib.sha256(PDF).hexdigest())
    # a header that is not plain ASCII goes through the email package, which encodes it
    assert build_message("zoë@b.example", "PS-4", "2026-11", "<m@w>", PDF).isascii()
