"""``workledger sweep --lease``: a sweeper that dies inside a closing hook holds the closing
entry for its lease only, not for 30 seconds whatever the workers' lease is.

Found by the fault campaign (chaos/README.md): rounds whose ``sweep`` process was killed
inside a closing hook took 30 s to settle after their last fault, against a liveness bound of
the workers' lease (2 s) + 30 s, because the command line's sweeper always claimed with the
default lease of 30 s. On both backends."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workledger import Ledger
from workledger.core.status import CLOSE_STAGE

pytestmark = pytest.mark.integration

APPS = Path(__file__).resolve().parent / "apps"


def test_a_sweep_killed_in_a_closing_hook_holds_it_for_its_lease_only(db_url: str) -> None:
    sys.path.insert(0, str(APPS))
    try:
        from closing_app import ledger as app
    finally:
        sys.path.remove(str(APPS))
    app.use(db_url)
    run_id = app.job_named("closing").submit({"n": 2}).run_id
    worker = app.worker(concurrency=1, until_idle=True)
    worker.sweeper = None  # the closing hook is left to the sweep below
    worker.run()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get(
        "PYTHONPATH", "")]), "WORKLEDGER_FAILPOINTS": "closing.after_hook:1:exit"}
    killed = subprocess.run([sys.executable, "-m", "workledger.cli", "--db", db_url, "--app",
                             "closing_app:ledger", "sweep", "--grace", "0", "--lease", "1"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert killed.returncode == 137, killed.stderr
    reader = Ledger(db_url)
    (held,) = reader.items(run_id, stage=CLOSE_STAGE)
    assert held.state == "claimed"
    deadline = time.monotonic() + 15  # far below the 30 s the sweeper used to hold it for
    while held.id not in {i.id for i in reader.store.leases_expired()}:
        assert time.monotonic() < deadline, f"the closing entry is still leased: {held}"
        time.sleep(0.05)
    app.sweep(grace=0, lease=1)  # the next pass reclaims it and runs the hook
    (closed,) = reader.items(run_id, stage=CLOSE_STAGE)
    assert closed.state == "processed"
    reader.close()
    app.close()
