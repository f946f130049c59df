"""The sweeper of a SQLite ledger, in a process of its own beside a broker's worker:
``python -m workledger.contrib._sweeping module:attribute`` (started by ``_broker.start_sweeping``,
never by hand).

A broker worker that forks its task processes (``rq worker``'s work horses, Celery's prefork
pool) must never have a SQLite file open when it forks: SQLite keeps what it knows of the file's
locks in the process's memory, a fork copies that memory but not the locks, and a child forked
while the sweeper held the write lock waits on ``BEGIN IMMEDIATE`` for ever. This process is
started afresh (``subprocess``, not ``fork``), runs the ledger's sweeper loop exactly as a
thread of the worker would, and ends when it is told to (SIGTERM) or when the worker that
started it is gone (it looks every half second), so a killed worker never leaves it behind.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

PARENT_EVERY = 0.5  # seconds between looks at whether the worker that started this is alive


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m workledger.contrib._sweeping module:attribute", file=sys.stderr)
        return 2
    parent = os.getppid()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C reaches the worker, which stops this
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("workledger")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    from workledger.contrib._broker import ledger_named, sweep_here

    loop = sweep_here(ledger_named(argv[0]))
    try:
        while not stop.wait(PARENT_EVERY):
            if os.getppid() != parent:  # the worker is gone: this was its sweeper
                break
    finally:
        loop.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
