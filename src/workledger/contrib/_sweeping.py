"""The sweeper of a SQLite ledger, in a process of its own beside a broker's worker:
``python -P -m workledger.contrib._sweeping --parent PID module:attribute`` (started and
supervised by ``_broker.SweepProcess``, never by hand).

A broker worker that forks its task processes (``rq worker``'s work horses, Celery's prefork
pool) must never have a SQLite file open when it forks: SQLite keeps what it knows of the file's
locks in the process's memory, a fork copies that memory but not the locks, and a child forked
while the sweeper held the write lock waits on ``BEGIN IMMEDIATE`` for ever. This process is
started afresh (``subprocess``, not ``fork``), runs the ledger's sweeper loop exactly as a
thread of the worker would, and ends when it is told to (SIGTERM) or when the worker that
started it (``--parent``, its pid) is gone: it looks every half second, the first time before it
imports anything, so a killed worker never leaves it behind.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading

PARENT_EVERY = 0.5  # seconds between looks at whether the worker that started this is alive


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "--parent" or not argv[1].isdigit():
        print("usage: python -P -m workledger.contrib._sweeping --parent PID module:attribute",
              file=sys.stderr)
        return 2
    parent, app = int(argv[1]), argv[2]
    if os.getppid() != parent:  # the worker died while this process started
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C reaches the worker, which stops this
    from workledger.contrib._broker import SWEEP_PATH, ledger_named, sweep_here

    # the worker's import path, after this interpreter's own (-P: no directory put first);
    # the working directory is searched for the app only, after them (import_app)
    sys.path.extend(p for p in json.loads(os.environ.pop(SWEEP_PATH, "[]")) if p not in sys.path)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("workledger")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    loop = sweep_here(ledger_named(app))
    try:
        while not stop.wait(PARENT_EVERY):
            if os.getppid() != parent:  # the worker is gone: this was its sweeper
                break
    finally:
        loop.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
