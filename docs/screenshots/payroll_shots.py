"""Take the README's screenshots of the payroll demo in the dashboard.

Run from the repository root after `make demo` (which leaves ./workledger.db):

    .venv/bin/python docs/screenshots/payroll_shots.py

It starts `workledger serve` on a free port over ./workledger.db, opens the runs page, the
payroll run and the audit page in Debian's Chromium, and writes PNGs beside this file.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main() -> None:
    server = subprocess.Popen([sys.executable, "-m", "workledger.cli", "serve", "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[2]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            for path, name in (("", "payroll-runs"), ("runs/1", "payroll-run"),
                               ("audit", "payroll-audit")):
                page.goto(url + path)
                if path.startswith("runs/"):  # the skips load after the page
                    page.wait_for_selector("table.skips")
                page.screenshot(path=str(HERE / f"{name}.png"), full_page=True)
            phone = browser.new_page(viewport={"width": 390, "height": 844})
            phone.goto(url + "runs/1")
            phone.wait_for_selector("table.skips")
            phone.screenshot(path=str(HERE / "payroll-run-phone.png"), full_page=True)
            browser.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
