"""The payroll job against the real SMTP sink (over TCP): every payslip generated once, sent once.

The numbers are checked against three independent witnesses: the ledger's item rows, the PDF
files (and the store's log of render calls), and the messages the sink accepted.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from workledger import Ledger
from workledger.demos import payroll
from workledger.demos.payroll import (
    BOUNCE_DOMAIN,
    DEFAULT_PERIOD,
    EmployeeStore,
    PayrollConfig,
    document_id,
    render_payslip,
    run_demo,
    seed_employee,
)
from workledger.demos.smtp_sink import MailSink, SinkRecords
from workledger.errors import PayloadMismatch

pytestmark = [pytest.mark.integration]

N = 200
PERIOD = DEFAULT_PERIOD
DEADLINE = 120.0  # seconds any one worker may take


@dataclass(frozen=True)
class Expected:
    n: int
    skipped: dict[str, str]  # employee id -> reason
    bounced: set[str]  # employee ids whose mailbox the sink refuses (550)

    @property
    def generated(self) -> int:
        return self.n - len(self.skipped)

    @property
    def delivered(self) -> int:
        return self.generated - len(self.bounced)


def expected(n: int = N) -> Expected:
    """What the seeded employees must lead to, read from the seed data itself."""
    skipped: dict[str, str] = {}
    bounced: set[str] = set()
    for i in range(1, n + 1):
        (emp, _, email, _), salaries = seed_employee(i, PERIOD)
        if email is None:
            skipped[emp] = "no e-mail address"
        elif all(s[1] > PERIOD for s in salaries):
            skipped[emp] = f"no salary for {PERIOD}"
        elif email.endswith("@" + BOUNCE_DOMAIN):
            bounced.add(emp)
    return Expected(n, skipped, bounced)


def quiet() -> Console:
    return Console(file=io.StringIO(), width=140)


def config_for(out: Path, sink: MailSink | None = None) -> PayrollConfig:
    return PayrollConfig(out, "127.0.0.1", sink.port if sink else 25,
                         out / "mail-sink.db" if sink else None)


def items(book: Ledger, run_id: int, stage: str, state: str | None = None) -> Iterator[Any]:
    after = 0
    while rows := book.items(run_id, stage=stage, state=state, limit=500, after_id=after):
        yield from rows
        after = rows[-1].id


def render_calls(out: Path, run_id: int) -> Counter[str]:
    """Render calls per document, from the store's log (one row per call, written or not)."""
    import sqlite3

    with sqlite3.connect(out / "employees.db") as conn:
        rows = conn.execute("SELECT document_id FROM renders WHERE run_id = ?", (run_id,))
        return Counter(str(r[0]) for r in rows)


def check_nothing_twice(url: str, out: Path, exp: Expected) -> int:
    """The full set of checks after a run has finished; returns the run id."""
    book = payroll.build(url, config_for(out))
    try:
        (run,) = book.runs()
        st = book.status(run.run_id)
        assert (st.state, st.total) == ("completed_with_failures", N)
        assert (st.skipped, st.failed, st.processed) == (
            len(exp.skipped), len(exp.bounced), exp.delivered)
        generated = {r.key: r.result for r in items(book, run.run_id, "generate", "processed")}
        assert len(generated) == exp.generated
        pdfs = sorted((out / PERIOD).glob("*.pdf"))
        assert len(pdfs) == exp.generated
        for key, result in generated.items():
            data = Path(result["path"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == result["sha256"]
            assert result["document_id"] == document_id(run.run_id, PERIOD, key)
        calls = render_calls(out, run.run_id)
        assert set(calls) == {r["document_id"] for r in generated.values()}
        delivered = {r.key: r.result["message_id"]
                     for r in items(book, run.run_id, "deliver", "processed")}
        assert len(delivered) == exp.delivered
        messages = SinkRecords(out / "mail-sink.db").messages(f"<{run.run_id}/deliver/")
        per_id = Counter(m for m, _, _ in messages)
        assert per_id and max(per_id.values()) == 1, "a Message-ID was accepted twice"
        assert set(per_id) == set(delivered.values())
        by_id = {m: digest for m, _, digest in messages}
        for key, mid in delivered.items():
            assert by_id[mid] == generated[key]["sha256"], "the attachment is not the payslip"
        failed = {r.key: r.error for r in items(book, run.run_id, "deliver", "failed")}
        assert set(failed) == exp.bounced
        assert all(e and e.startswith("SMTP 550") for e in failed.values())
        return run.run_id
    finally:
        book.close()


def test_full_run_yields_one_pdf_and_one_message_per_delivered_item(
    db_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    console = quiet()
    assert run_demo(db_url, employees=N, out_dir=out, console=console) == 0
    run_id = check_nothing_twice(db_url, out, expected())
    assert max(render_calls(out, run_id).values()) == 1
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "created=True" in text and "nothing generated or sent twice" in text


def test_json_summary_and_the_render_limit_beside_the_wall_time(
    sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    console = quiet()
    assert run_demo(sqlite_url, employees=N, out_dir=out, console=console, as_json=True) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    exp = expected()
    delivered = exp.generated - len(exp.bounced)
    assert (summary["generated"], summary["delivered"], summary["failed"]) == (
        exp.generated, delivered, len(exp.bounced))
    assert summary["render_calls"] == exp.generated == summary["stages"]["generate"]["items"]
    assert summary["sink_messages"] == delivered
    assert summary["wall_s"] > 0 and summary["render_limit_s"] > 0
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "render limit" in text or summary["wall_s"] < 1.0


def test_sigkill_of_the_worker_then_a_fresh_worker_sends_nothing_twice(
    db_url: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("WORKLEDGER_TEST_SEED", random.randrange(1 << 30)))
    exp = expected()
    kill_after = random.Random(seed).randint(1, exp.delivered - 20)
    out = tmp_path / "out"
    console = quiet()
    code = run_demo(db_url, employees=N, out_dir=out, crash_after=kill_after, console=console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert code == 0, f"seed {seed}, kill after {kill_after}:\n{text}"
    assert "worker 1 SIGKILLed" in text, f"seed {seed}: the kill never happened"
    run_id = check_nothing_twice(db_url, out, exp)
    written = Counter(k for k, n in render_calls(out, run_id).items() if n)
    assert written and max(written.values()) == 1


# -- a kill during generation: the idempotent stage picks up its own half-done work ----------


def start_worker(url: str, config: PayrollConfig) -> subprocess.Popen[bytes]:
    """The demo's worker entry point as a process of its own (verify hook only with a sink)."""
    cmd = [sys.executable, "-m", "workledger.demos.payroll", "worker", "--db", url,
           "--out", str(config.out_dir), "--smtp", f"{config.smtp_host}:{config.smtp_port}",
           "--lease", "2"]
    if config.sink is not None:
        cmd += ["--sink", str(config.sink)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def kill_when(what: str, done: Any, proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` as soon as ``done()`` holds (polled with a deadline)."""
    deadline = time.monotonic() + DEADLINE
    try:
        while not done():
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"the worker exited before {what}: {err}")
            assert time.monotonic() < deadline, f"no {what} within {DEADLINE:g}s"
            try:
                proc.wait(timeout=0.002)
            except subprocess.TimeoutExpired:
                pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def finish(url: str, config: PayrollConfig) -> None:
    """A fresh worker that runs until nothing is left it can do."""
    proc = start_worker(url, config)
    try:
        _, err = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()


def submit(url: str, config: PayrollConfig) -> int:
    EmployeeStore(config.store_path).seed(N, PERIOD)
    book = payroll.build(url, config)
    try:
        return book.submit("payroll", {"period": PERIOD, "employees": N}, key=PERIOD).run_id
    finally:
        book.close()


def test_sigkill_during_generation_renders_no_payslip_twice(db_url: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("WORKLEDGER_TEST_SEED", random.randrange(1 << 30)))
    exp = expected()
    kill_after = random.Random(seed).randint(1, exp.generated - 60)
    out = tmp_path / "out"
    with MailSink(out / "mail-sink.db", reject_domains=[BOUNCE_DOMAIN]) as sink:
        config = config_for(out, sink)
        run_id = submit(db_url, config)
        kill_when(f"{kill_after} renders",
                  lambda: sum(render_calls(out, run_id).values()) >= kill_after,
                  start_worker(db_url, config))
        finish(db_url, config)
    check_nothing_twice(db_url, out, exp)
    calls = render_calls(out, run_id)
    # A call cut short by the kill may be repeated; a finished PDF is never written again.
    assert sum(calls.values()) <= exp.generated + 4, f"seed {seed}"
    assert written_twice(out, run_id) == 0, f"seed {seed}"


def written_twice(out: Path, run_id: int) -> int:
    return EmployeeStore(out / "employees.db").render_counts(run_id)[2]


# -- an outage: deliveries back off and drain; nothing is rendered again ---------------------


def test_mail_outage_backs_off_and_drains_without_rendering_again(
    db_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    console = quiet()
    code = run_demo(db_url, employees=N, out_dir=out, mail_outage=2.0, console=console)
    assert code == 0, console.file.getvalue()  # type: ignore[attr-defined]
    run_id = check_nothing_twice(db_url, out, expected())
    calls = render_calls(out, run_id)
    assert sum(calls.values()) == expected().generated and max(calls.values()) == 1
    assert SinkRecords(out / "mail-sink.db").refusals().get("451", 0) > 0
    book = payroll.build(db_url, config_for(out))
    try:
        retries = [e for e in book.events(run_id) if e.kind == "retry_scheduled"]
        assert retries, "no delivery was refused and retried"
    finally:
        book.close()


# -- running the same command again ---------------------------------------------------------


def test_second_run_of_the_same_period_reports_the_run_and_sends_nothing_new(
    sqlite_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert run_demo(sqlite_url, employees=N, out_dir=out, console=quiet()) == 0
    sink = SinkRecords(out / "mail-sink.db")
    before = (sink.count(), render_calls(out, 1))
    again = quiet()
    assert run_demo(sqlite_url, employees=N, out_dir=out, console=again) == 0
    text = again.file.getvalue()  # type: ignore[attr-defined]
    assert "created=False" in text and "worker 1" not in text
    assert (sink.count(), render_calls(out, 1)) == before
    book = payroll.build(sqlite_url, config_for(out))
    try:
        assert [r.run_id for r in book.runs()] == [1]
        with pytest.raises(PayloadMismatch):
            book.submit("payroll", {"period": PERIOD, "employees": N + 1}, key=PERIOD)
    finally:
        book.close()


# -- decomposition and rendering ------------------------------------------------------------


def test_invalid_employees_are_skipped_with_their_reasons(db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    EmployeeStore(out / "employees.db").seed(N, PERIOD)
    book = payroll.build(db_url, config_for(out))
    try:
        sub = book.submit("payroll", {"period": PERIOD, "employees": N}, key=PERIOD)
        skipped = {r.key: r.error for r in items(book, sub.run_id, "generate", "skipped")}
        pending = list(items(book, sub.run_id, "generate", "pending"))
    finally:
        book.close()
    exp = expected()
    assert skipped == exp.skipped
    assert {"no e-mail address", f"no salary for {PERIOD}"} == set(skipped.values())
    assert sub.status.total == N and sub.status.skipped == len(exp.skipped)
    assert all(r.data == {"period": PERIOD} for r in pending), "items carry identity only"


def test_re_rendering_a_payslip_is_byte_identical(tmp_path: Path) -> None:
    store = EmployeeStore(tmp_path / "employees.db")
    store.seed(5, PERIOD)
    slip = store.payslip("E00003", PERIOD)
    assert slip is not None
    doc = document_id(7, PERIOD, "E00003")
    first = render_payslip(slip, doc)
    assert first.startswith(b"%PDF") and render_payslip(slip, doc) == first
    other = subprocess.run(
        [sys.executable, "-c",
         "import sys; from workledger.demos.payroll import EmployeeStore, render_payslip;"
         "from pathlib import Path; s = EmployeeStore(Path(sys.argv[1]));"
         "sys.stdout.buffer.write(render_payslip(s.payslip('E00003', sys.argv[2]), sys.argv[3]))",
         str(tmp_path / "employees.db"), PERIOD, doc], capture_output=True, check=True)
    assert other.stdout == first, "another process rendered different bytes"
    assert render_payslip(slip, document_id(8, PERIOD, "E00003")) != first


# -- without the built-in sink there is no verify hook: an uncertain delivery is unknown -----


def test_external_server_leaves_deliveries_in_flight_at_a_kill_unknown(
    sqlite_url: str, tmp_path: Path
) -> None:
    with MailSink(tmp_path / "external.db") as external:
        config = PayrollConfig(tmp_path / "out", external.host, external.port, None)
        run_id = submit(sqlite_url, config)
        # 30 is inside the first chunk of deliveries: the rest of that chunk is in flight
        kill_when("30 messages", lambda: external.records.count() >= 30,
                  start_worker(sqlite_url, config))
        finish(sqlite_url, config)
        per_id = Counter(m for m, _, _ in external.records.messages())
    book = Ledger(sqlite_url)
    try:
        st = book.status(run_id)
        unknown = list(items(book, run_id, "deliver", "unknown"))
    finally:
        book.close()
    assert st.state == "awaiting_repair"
    assert unknown and all("a person must resolve it" in (r.error or "") for r in unknown)
    assert max(per_id.values()) == 1, "a Message-ID was sent twice"
    assert len(per_id) == st.processed + sum(
        1 for r in unknown if f"<{r.run_id}/deliver/{r.seq}@workledger.local>" in per_id)


def test_demo_with_an_external_server_delivers_without_a_sink_check(
    sqlite_url: str, tmp_path: Path
) -> None:
    with MailSink(tmp_path / "external.db") as external:
        console = quiet()
        code = run_demo(sqlite_url, employees=50, out_dir=tmp_path / "out",
                        smtp_host=external.host, smtp_port=external.port, console=console)
        text = console.file.getvalue()  # type: ignore[attr-defined]
        assert code == 0, text
        assert "external" in text and external.records.count() == expected(50).delivered
