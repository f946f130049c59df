"""An app for ``worker --processes N`` tests: ``--app process_app:ledger``.

``cpu``: payload ``{"n": N, "poison": [seqs], "hang": [seqs], "marks": DIR}`` becomes N items.
Stage ``burn`` (idempotent, in child processes) does a little pure-Python work and returns the
pid and parent pid of the process that ran it; an item in ``poison`` kills its process at its
first attempt; an item in ``hang`` never returns. ``marks``, when given, gets a file per
handler process (named by its pid). ``send`` (not idempotent) does the same for the items of
job ``once``; ``local`` (``executor="thread"``) runs in the worker's own threads.

``relay``: stage ``make`` in child processes, then ``ship`` in the worker's threads; each notes
in its result when it started and ended (wall clock), so a test can see them overlap.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from workledger import Item, Ledger

ledger = Ledger()


def _split(payload: dict[str, Any]) -> Any:
    for i in range(int(payload["n"])):
        yield Item(key=f"c{i}", data={"poison": i in payload.get("poison", []),
                                      "hang": i in payload.get("hang", []),
                                      "marks": payload.get("marks")})


def _work(item: Any, ctx: Any) -> dict[str, int]:
    if item.data["marks"]:
        Path(item.data["marks"], str(os.getpid())).touch()
    if item.data["poison"] and ctx.attempt == 1:
        os._exit(137)
    while item.data["hang"]:
        time.sleep(0.1)
    total = 0
    for k in range(20_000):
        total += k * k
    return {"pid": os.getpid(), "ppid": os.getppid()}


cpu = ledger.job("cpu")
cpu.decompose(_split)
cpu.stage("burn", idempotent=True, max_attempts=2, base_delay=0.01)(_work)

once = ledger.job("once")
once.decompose(_split)
once.stage("send")(_work)

local = ledger.job("local")
local.decompose(_split)
local.stage("inline", idempotent=True, executor="thread")(_work)


def _timed(item: Any, ctx: Any) -> dict[str, float]:
    start = time.time()
    time.sleep(0.01)
    return {"start": start, "end": time.time(), "pid": os.getpid()}


relay = ledger.job("relay")
relay.decompose(_split)
relay.stage("make", idempotent=True)(_timed)
relay.stage("ship", idempotent=True, after="make", executor="thread")(_timed)
