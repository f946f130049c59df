"""The ``payroll`` job, written the way a user writes a job of their own: the public API only.

Decomposition gives one item per employee (identity only: the employee id and the period), some
of them ``skipped`` with a reason; stage ``generate`` (idempotent) renders a byte-identical PDF
to a deterministic path; stage ``deliver`` (not idempotent) sends it by SMTP with a Message-ID
derived from ``ctx.idempotency_key`` and, when the built-in mail sink is the server, declares a
``verify`` hook that asks the sink.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workledger import BatchContext, Context, Item, ItemView, Ledger, Permanent, Retry, Skip
from workledger.demos.payroll.config import (
    JOB,
    TEMPLATE_VERSION,
    TOLERATE,
    PayrollConfig,
    document_id,
    message_id,
)
from workledger.demos.payroll.mail import Mailer, Uncertain, build_message
from workledger.demos.payroll.render import render_payslip, write_all_atomically
from workledger.demos.payroll.store import EmployeeStore
from workledger.demos.smtp_sink import SinkRecords

DELIVER_BATCH = 25  # payslips per call of the delivery handler (one SMTP connection)
GENERATE_BATCH = 25  # payslips per call of the render handler (two writes to the store)


class Payroll:
    """The job's handlers and the resources they use. Items carry identity only (employee id and
    period): every handler fetches the current data from the store when it runs."""

    def __init__(self, config: PayrollConfig) -> None:
        self.config = config
        self.store = EmployeeStore(config.store_path)
        self.mailer = Mailer(config.smtp_host, config.smtp_port)
        self.sink = SinkRecords(config.sink) if config.sink is not None else None

    def pdf_path(self, doc: str, period: str) -> Path:
        return self.config.out_dir / period / f"{doc}.pdf"

    def split(self, payload: dict[str, Any]) -> Iterator[Item | Skip]:
        period = str(payload["period"])
        for emp, email, paid in self.store.roster(period, int(payload["employees"])):
            if email is None:
                yield Skip(key=emp, reason="no e-mail address")
            elif not paid:
                yield Skip(key=emp, reason=f"no salary for {period}")
            else:
                yield Item(key=emp, data={"period": period})

    def generate_batch(self, items: list[ItemView], ctx: BatchContext) -> list[Any]:
        """Render a batch of payslips; the store is written once before and once after the
        batch, not per payslip, and the PDFs are flushed to disk together; each item keeps
        its own outcome."""
        out: list[Any] = [None] * len(items)
        todo: list[tuple[int, str, str, str, Path, Any]] = []
        for i, item in enumerate(items):
            period, emp = str(item.data["period"]), str(item.key)
            doc = document_id(ctx.run_id, period, emp)
            path = self.pdf_path(doc, period)
            pdf = self._existing(path, doc)
            if pdf is not None:
                out[i] = self._result(doc, pdf, path)
                continue
            slip = self.store.payslip(emp, period)
            if slip is None:
                out[i] = Permanent(f"no salary for {period} (changed since the run was "
                                   "submitted)")
                continue
            todo.append((i, doc, emp, period, path, slip))
        renders = self.store.renders_started([(doc, ctx.run_id, emp, period)
                                              for _, doc, emp, period, _, _ in todo])
        pdfs = [render_payslip(slip, doc) for _, doc, _, _, _, slip in todo]
        try:
            write_all_atomically([(path, pdf) for (_, _, _, _, path, _), pdf
                                  in zip(todo, pdfs, strict=True)])
        except OSError as exc:  # none of the batch is known to be on disk: all tried again
            for i, *_ in todo:
                out[i] = Retry(f"cannot write the payslips of {self.config.out_dir}: {exc}")
            return out
        for (i, doc, _, _, path, _), pdf in zip(todo, pdfs, strict=True):
            out[i] = self._result(doc, pdf, path)
        if todo:
            self.store.renders_written([(render, doc, hashlib.sha256(pdf).hexdigest())
                                        for (_, doc, *_), render, pdf
                                        in zip(todo, renders, pdfs, strict=True)])
        return out

    @staticmethod
    def _result(doc: str, pdf: bytes, path: Path) -> dict[str, Any]:
        return {"document_id": doc, "sha256": hashlib.sha256(pdf).hexdigest(),
                "template_version": TEMPLATE_VERSION, "path": str(path)}

    def _existing(self, path: Path, doc: str) -> bytes | None:
        """A payslip already written by an earlier attempt (whose result was never recorded)."""
        try:
            pdf = path.read_bytes()
        except FileNotFoundError:
            return None
        recorded = self.store.recorded_sha(doc)
        if recorded is not None:
            return pdf if hashlib.sha256(pdf).hexdigest() == recorded else None
        return pdf if pdf.rstrip().endswith(b"%%EOF") else None  # renamed, not yet recorded

    def deliver(self, item: ItemView, ctx: Context) -> dict[str, Any]:
        period, emp = str(item.data["period"]), str(item.key)
        doc = document_id(ctx.run_id, period, emp)
        mid = message_id(ctx.idempotency_key)
        result = {"message_id": mid, "document_id": doc}
        if ctx.attempt > 1 and self.sink is not None and self.sink.accepted(mid):
            return {**result, "verified": "accepted by an earlier attempt"}
        email = self.store.email_of(emp)
        if email is None:
            raise Permanent("no e-mail address (removed since the run was submitted)")
        try:
            pdf = self.pdf_path(doc, period).read_bytes()
        except FileNotFoundError as exc:
            raise Permanent(f"payslip {doc} is missing from {self.config.out_dir}") from exc
        try:
            self.mailer.send(email, build_message(email, doc, period, mid, pdf))
        except Uncertain as exc:
            if self.sink is not None:
                raise Retry(f"{exc}; the next attempt asks the sink first") from exc
            raise Permanent(f"delivery uncertain, not re-sent: {exc}; check the mailbox of "
                            f"{email} for {mid} before redriving") from exc
        return {**result, "recipient": email, "sha256": hashlib.sha256(pdf).hexdigest()}

    def deliver_batch(self, items: list[ItemView], ctx: BatchContext) -> list[Any]:
        """Deliver a batch over this thread's one SMTP connection; each message keeps its own
        Message-ID and its own outcome (a refused mailbox fails only its own item)."""
        out: list[Any] = []
        for item, attempt, key in zip(items, ctx.attempts, ctx.idempotency_keys, strict=True):
            one = Context(ctx.run_id, ctx.job, ctx.stage, attempt, key, ctx.worker_id,
                          ctx.lease_token)
            try:
                out.append(self.deliver(item, one))
            except (Retry, Permanent) as exc:
                out.append(exc)
        return out

    def verify(self, item: ItemView, ctx: Context) -> Any:
        """Asked by the sweeper about a delivery whose worker vanished: did the sink accept it?"""
        assert self.sink is not None
        mid = message_id(ctx.idempotency_key)
        if self.sink.accepted(mid):
            return "done", {"message_id": mid, "verified": "accepted by the mail sink"}
        return "not_done"


def build(url: str | None = None, config: PayrollConfig | None = None, *,
          dispatch: Any = None) -> Ledger:
    """A ledger at ``url`` with the ``payroll`` job defined for ``config`` (default: the
    environment). ``deliver`` has a verify hook only when ``config.sink`` names the sink.
    ``dispatch``: a broker to run it through (``examples/celery_payroll/``)."""
    payroll = Payroll(config or PayrollConfig.from_env())
    book = Ledger(url, dispatch=dispatch)
    job = book.job(JOB, tolerate=TOLERATE)
    job.decompose(payroll.split)
    job.stage("generate", idempotent=True, max_attempts=3,
              batch=GENERATE_BATCH)(payroll.generate_batch)
    verify = payroll.verify if payroll.sink is not None else None
    # rendering is CPU-bound: it runs in the worker's handler processes when it has them;
    # delivering waits on the network: it stays in the worker's threads
    job.stage("deliver", after="generate", max_attempts=20, base_delay=0.5, max_delay=5.0,
              verify=verify, executor="thread", batch=DELIVER_BATCH)(payroll.deliver_batch)
    return book


ledger = build()
