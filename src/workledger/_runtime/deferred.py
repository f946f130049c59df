"""Deferred runs: recorded inside the caller's transaction (``submit(..., conn=...)``), so no
submitting process decomposes them. Whoever sees one first after the commit (a worker, between
claims, or the sweeper) takes it and decomposes it at once, without the grace that protects a
slow original submitter (docs/design.md, "Submitting inside the caller's transaction").

Taking is one guarded UPDATE (``Store.run_take_deferred``), so of several workers woken by the
same commit one decomposes the run and the others claim its items. A taker that dies before it
marks the run decomposed leaves an ordinary undecomposed run, which the sweeper re-decomposes
after its grace, keeping the rows already written.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from workledger._runtime.decompose import decompose
from workledger.errors import DatabaseUnavailable, DecompositionFailed
from workledger.jobs import Job
from workledger.storage.port import Store

log = logging.getLogger("workledger.deferred")


def take_deferred(store: Store, jobs: Mapping[str, Job], actor: str) -> tuple[int, int]:
    """Take and decompose the deferred runs of ``jobs`` that nobody took yet.

    Returns (decomposed, failed). A decomposer that raised is recorded on its run (which the
    sweeper tries again, with its backoff); any other failure but a lost database is logged
    and left to the sweeper, so one bad run never stops a worker."""
    done = failed = 0
    for listed in store.runs_deferred(sorted(jobs)):
        run = store.run_take_deferred(listed.id)
        if run is None:
            continue  # another worker or the sweeper took it
        try:
            # rows written meanwhile (a plain submit of the same key resumes it) are checked
            decompose(store, jobs[run.job], run, check_existing=True, actor=actor)
            done += 1
        except DatabaseUnavailable:
            raise
        except DecompositionFailed as exc:
            log.warning("run %s: %s", run.id, exc)
            failed += 1
        except Exception:  # noqa: BLE001 - the sweeper decomposes it after its grace
            log.exception("run %s: its decomposition failed; the sweeper will try again",
                          run.id)
            failed += 1
    return done, failed
