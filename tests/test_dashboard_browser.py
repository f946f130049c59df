"""The dashboard in a real browser: Debian's Chromium driven by Playwright, on a real
``workledger serve`` with a real worker, on both backends.

It signs in, watches a run's bars move while the worker drains it, pauses and resumes it,
retries a failed item, resolves an unknown one, and checks the ledger after each action; no
script or style is refused by the security policy; signing out ends the session (its cookie,
replayed, opens nothing). A
screenshot of every page is saved under ``.artifacts/screenshots/<backend>/`` (or
``$WORKLEDGER_ARTIFACTS``); ``docs/screenshots/`` holds a committed set.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from web_support import WEB_APP, build, cli_env, make_unknown, wait_for

from workledger import Ledger

pytestmark = [pytest.mark.integration, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[1]
TOKEN = "browser-test-token"
READ_TOKEN = "browser-read-token-0123456789"
# A page of another site (localhost is not the site 127.0.0.1): twenty sign-ins with wrong
# tokens as images (to lock the operator out), then a navigation that would sign its visitor
# in with a read token its author holds (login CSRF)
LURE = """<!doctype html><title>lure</title><script>
const target = "%s";
let left = 20;
for (let i = 0; i < 20; i++) {
  const image = new Image();
  image.onload = image.onerror = () => {
    if (--left === 0) location = target + "signin?token=%s";
  };
  image.src = target + "signin?token=wrong-" + i;
}
</script>"""

if not CHROMIUM.exists():
    pytest.skip("needs Debian's chromium at /usr/bin/chromium: apt-get install chromium "
                "(.ci/run installs it)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


def shots_dir(db_url: str) -> Path:
    base = Path(os.environ.get("WORKLEDGER_ARTIFACTS", ROOT / ".artifacts"))
    folder = base / "screenshots" / ("sqlite" if db_url.startswith("sqlite") else "postgres")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Procs:
    """The server and the worker, stopped with SIGTERM at the end of the test."""

    def __init__(self, db_url: str, cwd: Path, fail_off: Path) -> None:
        self.env = cli_env(WORKLEDGER_TOKEN=TOKEN, WEB_APP_FAIL_OFF=str(fail_off))
        self.base = [sys.executable, "-m", "workledger.cli", "--db", db_url, "--app", WEB_APP]
        self.cwd = cwd
        self.running: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([*self.base, *args], cwd=self.cwd, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.running.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.running:
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


@pytest.fixture
def setup(db_url: str, tmp_path: Path) -> Iterator[tuple[Ledger, Procs, str, Path]]:
    ledger = build(db_url)
    ledger.submit("numbers", {"n": 80, "fail": [3], "sleep": 0.25}, key="payroll-like")
    sends = ledger.submit("sends", {"n": 2}, key="deliveries").run_id
    make_unknown(ledger, sends)
    procs = Procs(db_url, tmp_path, tmp_path / "fixed")
    server = procs.start("serve", "--port", "0")
    assert server.stdout is not None
    line = server.stdout.readline()
    assert line.startswith("workledger serve: http://127.0.0.1:"), server.stderr
    try:
        yield ledger, procs, line.split()[2], tmp_path
    finally:
        procs.stop()
        ledger.close()


def accept_next_dialog(page: Any) -> None:
    page.once("dialog", lambda dialog: dialog.accept())


def test_operate_a_run_from_the_dashboard(setup: tuple[Ledger, Procs, str, Path],
                                          db_url: str) -> None:
    ledger, procs, url, tmp = setup
    shots = shots_dir(db_url)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp / "profile"), executable_path=str(CHROMIUM), headless=True, args=FLAGS,
            viewport={"width": 1200, "height": 900})
        try:
            page = browser.new_page()
            blocked: list[str] = []  # what the security policy refused, as the browser says
            page.on("console", lambda m: blocked.append(m.text)
                    if "Content Security Policy" in m.text else None)
            drive(page, ledger, procs, url, shots, tmp)
            assert blocked == []
            phone = browser.new_page()
            phone.set_viewport_size({"width": 390, "height": 844})
            phone.goto(url + "runs/1")
            phone.screenshot(path=str(shots / "run-phone.png"), full_page=True)
            sign_out(page, url, browser)
        finally:
            browser.close()


def drive(page: Any, ledger: Ledger, procs: Procs, url: str, shots: Path, tmp: Path) -> None:
    page.goto(url)
    assert page.locator("input[name=token]").is_visible()  # 401: the sign-in form
    page.screenshot(path=str(shots / "signin.png"))
    page.fill("input[name=token]", TOKEN)
    page.click("form.signin button")
    page.wait_for_selector(".run-card")
    worker = procs.start("worker", "--job", "numbers", "--concurrency", "2", "--chunk", "4")
    watch_the_bars_move(page, url)
    page.goto(url)
    page.screenshot(path=str(shots / "runs.png"), full_page=True)
    pause_and_resume(page, ledger, url)
    wait_for(lambda: ledger.status(1).complete, timeout=120, what="run 1 to drain")
    retry_the_failed_item(page, ledger, url, tmp, shots)
    resolve_the_unknown_item(page, ledger, url, shots)
    page.goto(url + "runs/1/items?state=processed")
    page.screenshot(path=str(shots / "items.png"), full_page=True)
    page.goto(url + "audit")
    assert page.locator("table.audit").count() == 0  # nothing stranded any more
    page.screenshot(path=str(shots / "audit.png"), full_page=True)
    assert worker.poll() is None


def test_a_page_of_another_site_can_neither_lock_the_operator_out_nor_sign_them_in(
        sqlite_url: str, tmp_path: Path) -> None:
    build(sqlite_url).submit("numbers", {"n": 2}, key="k")
    procs = Procs(sqlite_url, tmp_path, tmp_path / "fixed")
    procs.env["WORKLEDGER_READ_TOKEN"] = READ_TOKEN
    server = procs.start("serve", "--port", "0")
    assert server.stdout is not None
    url = server.stdout.readline().split()[2]
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                         args=FLAGS)
            try:
                page = browser.new_page()
                page.route("http://localhost:9/**", lambda route: route.fulfill(
                    content_type="text/html", body=LURE % (url, READ_TOKEN)))
                page.goto("http://localhost:9/lure")
                page.wait_for_url(lambda address: address.startswith(url), timeout=30_000)
                page.goto(url)  # later, typed by the operator
                assert page.locator("input[name=token]").is_visible()  # no session started
                assert not [c for c in page.context.cookies() if "session" in c["name"]]
                page.fill("input[name=token]", TOKEN)
                page.click("form.signin button")
                page.wait_for_selector(".run-card")  # the right token is not refused
            finally:
                browser.close()
    finally:
        procs.stop()


def sign_out(page: Any, url: str, browser: Any) -> None:
    """Signing out ends the session on the server: its cookie, replayed, opens nothing."""
    [session] = [c for c in browser.cookies() if c["name"] == "workledger_session"]
    assert session["value"] != TOKEN and session["httpOnly"]
    page.goto(url)
    page.click("header form button")
    page.wait_for_url(url + "signin")
    page.goto(url)
    assert page.locator("input[name=token]").is_visible()
    replayed = httpx.get(url, cookies={"workledger_session": session["value"]})
    assert replayed.status_code == 401 and 'name="token"' in replayed.text


def watch_the_bars_move(page: Any, url: str) -> None:
    """The page is loaded once; htmx refreshes it. The processed count must rise twice."""
    page.goto(url + "runs/1")
    seen = [int(page.locator("#processed").inner_text())]

    def rose() -> bool:
        now = int(page.locator("#processed").inner_text())
        if now > seen[-1]:
            seen.append(now)
        return len(seen) >= 3

    wait_for(rose, timeout=60, what="the bars to move")
    width = page.locator(".seg.processed").first.evaluate("e => e.style.width")
    assert width.endswith("%") and float(width[:-1]) > 0


def pause_and_resume(page: Any, ledger: Ledger, url: str) -> None:
    page.goto(url + "runs/1")
    accept_next_dialog(page)
    page.click("button[data-action=pause]")
    page.wait_for_selector("button[data-action=resume]")
    assert ledger.status(1).state == "paused"
    assert [e.actor for e in ledger.events(1) if e.kind == "paused"] == ["api"]
    accept_next_dialog(page)
    page.click("button[data-action=resume]")
    page.wait_for_selector("button[data-action=pause]")
    assert [e.actor for e in ledger.events(1) if e.kind == "resumed"] == ["api"]


def retry_the_failed_item(page: Any, ledger: Ledger, url: str, tmp: Path, shots: Path) -> None:
    page.goto(url + "runs/1")
    assert "odd one out" in page.locator("table.failures").inner_text()
    page.screenshot(path=str(shots / "run.png"), full_page=True)
    (tmp / "fixed").write_text("the cause is fixed")
    accept_next_dialog(page)
    page.click('tr[data-item="double/3"] button.retry-one')
    page.wait_for_url(url + "runs/1")
    assert [e.actor for e in ledger.events(1) if e.kind == "redriven"] == ["api"]
    wait_for(lambda: ledger.status(1).state == "completed", timeout=60, what="the retry")
    assert ledger.item(1, "double", 3).result == {"double": 6}  # type: ignore[union-attr]
    page.goto(url + "runs/1/items/double/3")
    history = page.locator("table.history").inner_text()
    assert "failed" in history and "redriven" in history and "api" in history
    page.screenshot(path=str(shots / "item.png"), full_page=True)


def resolve_the_unknown_item(page: Any, ledger: Ledger, url: str, shots: Path) -> None:
    page.goto(url + "runs/2")
    card = page.locator(".unknown-item").first
    stage, seq = card.get_attribute("data-item").split("/")
    assert "attempts 1" in card.inner_text()
    page.screenshot(path=str(shots / "run-unknown.png"), full_page=True)
    card.locator("select[name=as]").select_option("processed")
    card.locator("input[name=note]").fill("in the server log")
    accept_next_dialog(page)
    card.locator("button").click()
    page.wait_for_url(url + "runs/2")
    assert page.locator(".unknown-item").count() == 0
    item = ledger.item(2, stage, int(seq))
    assert item is not None and item.state == "processed"
    resolved = [e for e in ledger.events(2) if e.kind == "resolved"]
    assert [(e.actor, e.detail["note"]) for e in resolved] == [("api", "in the server log")]
