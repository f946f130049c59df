"""What the parent runs in threads while the workers drain: status latency, and a small run
submitted next to a big one (fairness). ``workers.run_workers`` begins them at the start event
and stops them once every worker reported."""

from __future__ import annotations

import statistics
import threading
import time
import traceback
from typing import Any

from systems import JOB, define

STATUS_EVERY = 0.1  # seconds between two status calls of the probe
FAIR_ITEMS = 10  # the small run submitted while a big one drains
FAIR_AFTER = 0.5  # seconds after the start event


class Probe:
    """Something the parent runs in a thread while the workers drain: ``begin`` starts
    ``_run`` at the start event, ``stop`` asks it to end and waits for it."""

    name = "probe"

    def __init__(self) -> None:
        self.t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, t0: float) -> None:
        self.t0 = t0
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=120)


class StatusProbe(Probe):
    """Calls ``ledger.status(run)`` from the parent every ``every`` seconds while the workers
    drain (its own Ledger, opened in the probe thread before the first timed call)."""

    name = "status-probe"

    def __init__(self, url: str, run_id: int, two_stage: bool = False,
                 every: float = STATUS_EVERY) -> None:
        super().__init__()
        self.url, self.run_id, self.two_stage, self.every = url, run_id, two_stage, every
        self.samples: list[tuple[float, float]] = []  # (monotonic at the call, ms)
        self.error: str | None = None

    def _run(self) -> None:
        ledger = define(self.url, self.two_stage)
        try:
            ledger.store  # noqa: B018 - connect outside the timed calls
            while not self._stop.is_set():
                t = time.monotonic()
                s = time.perf_counter()
                ledger.status(self.run_id)
                self.samples.append((t, (time.perf_counter() - s) * 1000))
                self._stop.wait(self.every)
        except Exception:  # noqa: BLE001 - reported with the cell
            self.error = traceback.format_exc().strip().splitlines()[-1]
        finally:
            ledger.close()

    def summary(self, until: float) -> dict[str, Any]:
        """The calls that started before ``until`` (the end of the drain)."""
        ms = [m for t, m in self.samples if t < until]
        if not ms:
            return {"status_calls": 0, "status_error": self.error}
        return {"status_calls": len(ms), "status_ms_median": round(statistics.median(ms), 2),
                "status_ms_max": round(max(ms), 2), "status_ms": [round(m, 2) for m in ms],
                "status_error": self.error}


class FairnessProbe(Probe):
    """Submits a ``FAIR_ITEMS``-item run of the same job ``FAIR_AFTER`` s after the start
    event, polls it until complete, and then reads the big run's progress."""

    name = "fairness"

    def __init__(self, url: str, big_run: int) -> None:
        super().__init__()
        self.url, self.big_run = url, big_run
        self.result: dict[str, Any] = {}

    def _run(self) -> None:
        ledger = define(self.url)
        try:
            ledger.store  # noqa: B018
            if self._stop.wait(max(0.0, self.t0 + FAIR_AFTER - time.monotonic())):
                return
            submitted = time.monotonic()
            sub = ledger.job(JOB).submit({"n": FAIR_ITEMS}, key="fairness-small-run")
            self.result.update(fair_run=sub.run_id, fair_submitted_s=round(
                submitted - self.t0, 3), fair_submit_s=round(time.monotonic() - submitted, 3))
            while not self._stop.is_set():
                if ledger.status(sub.run_id).complete:
                    self._done(ledger, submitted)
                    return
                self._stop.wait(0.02)
        except Exception:  # noqa: BLE001 - reported with the cell
            self.result["fair_error"] = traceback.format_exc().strip().splitlines()[-1]
        finally:
            ledger.close()

    def _done(self, ledger: Any, submitted: float) -> None:
        """The small run is complete: note when, and how far the big one got."""
        done = time.monotonic()
        big = ledger.status(self.big_run)
        self.result.update(fair_done_at=done, fair_complete_s=round(done - submitted, 3),
                           big_processed=big.processed, big_total=big.total)

    def summary(self, t0: float, drain_s: float) -> dict[str, Any]:
        """The result, with whether the big run still drained when the small one completed."""
        res = dict(self.result)
        done_at = res.pop("fair_done_at", None)
        if done_at is not None:
            res["big_still_draining"] = done_at < t0 + drain_s
            res["big_done_after_s"] = round(t0 + drain_s - done_at, 3)
        return res
