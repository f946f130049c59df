"""A worker process for the overrun tests (issue 21): handlers and hooks that outlive their
time limit or their lease, with every effect appended to a log the ledger does not own.

Run as a script, this file is one worker process::

    python tests/concurrency/overrun_app.py --url URL --log EFFECTS.log [--lease 4] ...

Job ``late``, payload ``{"n": N}``: items ``k0..k{N-1}`` of one stage ``send``, whose handler
logs ``start``, sleeps ``--effect-at`` seconds, logs ``effect`` (the non-idempotent effect) and
returns. ``--verify`` gives the stage a hook that answers ``done`` exactly when the item's
effect is in the log; with ``--fence`` the hook first fences the log at the item's lease token
(docs/reliability.md, "Durability assumptions"), and an effect of a fenced-out token is
logged as ``refused`` instead. ``--hook-for S`` gives the job a closing hook (3 attempts at most)
that logs ``close`` and takes S seconds, or kills its process inside it (``hook_crash``).
Each log line is ``<what> <key or run> <lease token> <pid> <time>``, written with one
``write`` on a file opened for appending, so lines of several processes never mix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

JOB = "late"
STAGE = "send"


def log_line(path: str | os.PathLike[str], what: str, key: str, token: int) -> None:
    line = f"{what} {key} {token} {os.getpid()} {time.time():.3f}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_log(path: str | os.PathLike[str]) -> list[tuple[str, str, int, int, float]]:
    """The log's lines as (what, key, token, pid, time)."""
    if not Path(path).exists():
        return []
    rows = []
    for line in Path(path).read_text().splitlines():
        what, key, token, pid, at = line.split()
        rows.append((what, key, int(token), int(pid), float(at)))
    return rows


def fenced_write(path: str | os.PathLike[str], key: str, token: int) -> bool:
    """The effect, unless ``key`` is fenced at or above ``token`` (then ``refused`` is logged):
    the check and the write under one lock, as a fencing downstream does it."""
    import fcntl

    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fence = Path(f"{path}.fence.{key}")
        if fence.exists() and token <= int(fence.read_text() or 0):
            log_line(path, "refused", key, token)
            return False
        log_line(path, "effect", key, token)
        return True


def fence_at(path: str | os.PathLike[str], key: str, token: int) -> None:
    """Refuse from now on every effect of ``key`` whose token is ``token`` or lower."""
    import fcntl

    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fence = Path(f"{path}.fence.{key}")
        old = int(fence.read_text() or 0) if fence.exists() else 0
        fence.write_text(str(max(old, token)))


def effects(path: str | os.PathLike[str], what: str = "effect") -> dict[str, int]:
    """How many times each key's ``what`` happened."""
    seen: dict[str, int] = {}
    for kind, key, *_ in read_log(path):
        if kind == what:
            seen[key] = seen.get(key, 0) + 1
    return seen


def build_ledger(url: str, log: str, *, effect_at: float = 0.0, timeout: float | None = None,
                 verify: bool = False, idempotent: bool = False, hook_for: float | None = None,
                 executor: str | None = None, max_attempts: int = 5,
                 hook_crash: bool = False, chdir: str | None = None,
                 hook_timeout: float | None = None, fence: bool = False,
                 hang_first: float | None = None, fail_first: bool = False) -> Any:
    from workledger import Item, Ledger

    ledger = Ledger(url)
    job = ledger.job(JOB)

    @job.decompose
    def split(payload: dict[str, Any]) -> Any:
        for i in range(int(payload["n"])):
            yield Item(key=f"k{i}", data={"i": i})

    def was_done(item: Any, ctx: Any) -> str:
        if fence:
            fence_at(log, item.key, ctx.lease_token)
        return "done" if effects(log).get(item.key) else "not_done"

    @job.stage(STAGE, idempotent=idempotent, timeout=timeout, max_attempts=max_attempts,
               verify=was_done if verify else None, executor=executor,
               base_delay=1.0, max_delay=1.0)
    def send(item: Any, ctx: Any) -> dict[str, Any]:
        log_line(log, "start", item.key, ctx.lease_token)
        if fail_first and ctx.attempt == 1:
            raise RuntimeError(f"{item.key}: its first attempt fails, before any effect")
        if chdir is not None:
            os.chdir(chdir)  # a handler that moves the process's working directory
        if hang_first is None:
            time.sleep(effect_at)
        else:  # in twenty steps: a handler resumed after SIGSTOP still runs a moment
            for _ in range(20):
                time.sleep((hang_first if item.key == "k0" else effect_at) / 20)
        if fence:
            if not fenced_write(log, item.key, ctx.lease_token):
                raise RuntimeError(f"{item.key}: fenced out downstream")
        else:
            log_line(log, "effect", item.key, ctx.lease_token)
        return {"pid": os.getpid()}

    if hook_for is not None and fence:
        @job.on_complete(max_attempts=3, timeout=hook_timeout)
        def fencing_closing(status: Any, ctx: Any) -> None:
            """The defence docs/reliability.md gives: a hook fences the downstream below its
            own entry's token before it acts, so an earlier holder's run of it (paused, its
            session ended) can no longer make its effect."""
            key = f"close-{status.run_id}"
            log_line(log, "close", str(status.run_id), ctx.lease_token)
            fence_at(log, key, ctx.lease_token - 1)
            time.sleep(hook_for)
            if not fenced_write(log, key, ctx.lease_token):
                raise RuntimeError(f"{key}: fenced out downstream")
            log_line(log, "closed", str(status.run_id), ctx.lease_token)
    elif hook_for is not None:
        @job.on_complete(max_attempts=3, timeout=hook_timeout)
        def closing(status: Any) -> None:
            log_line(log, "close", str(status.run_id), 0)
            if hook_crash:
                os._exit(137)  # its process dies inside the hook, every time
            time.sleep(hook_for)
            log_line(log, "closed", str(status.run_id), 0)

    return ledger


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--lease", type=float, default=30.0)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--chunk", type=int, default=25)
    p.add_argument("--effect-at", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--verify", action="store_true")
    p.add_argument("--fence", action="store_true")
    p.add_argument("--hang-first", type=float, default=None, help="item k0 sleeps this long")
    p.add_argument("--idempotent", action="store_true")
    p.add_argument("--hook-for", type=float, default=None)
    p.add_argument("--executor", default=None)
    p.add_argument("--max-attempts", type=int, default=5)
    p.add_argument("--forever", action="store_true")
    p.add_argument("--chdir", default=None)
    p.add_argument("--hook-crash", action="store_true")
    p.add_argument("--fail-first", action="store_true",
                   help="every item's first attempt raises before its effect (a retry)")
    p.add_argument("--sweep", action="store_true",
                   help="one sweeper pass instead of a worker; prints to_pending to_unknown")
    a = p.parse_args(argv)
    log = str(Path(a.log).resolve())  # the handler may move the working directory
    ledger = build_ledger(a.url, log, effect_at=a.effect_at, timeout=a.timeout,
                          verify=a.verify, idempotent=a.idempotent, hook_for=a.hook_for,
                          executor=a.executor, max_attempts=a.max_attempts, chdir=a.chdir,
                          hook_crash=a.hook_crash, fence=a.fence,
                          hang_first=a.hang_first, fail_first=a.fail_first)
    if a.sweep:
        swept = ledger.sweep(lease=a.lease)
        print(swept.to_pending, swept.to_unknown, flush=True)
        ledger.close()
        return 0
    report = ledger.work(concurrency=a.concurrency, chunk=a.chunk, lease=a.lease,
                         until_idle=not a.forever, db_retry_for=60.0)
    ledger.close()
    print(json.dumps({"pid": os.getpid(), **asdict(report)}), flush=True)
    return 0


def command(url: str, log: str | os.PathLike[str], **options: Any) -> list[str]:
    """The argv of one worker process running this file; ``options`` as the flags' names
    with underscores (True for a switch)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--url", url, "--log", str(log)]
    for name, value in options.items():
        if value is None or value is False:
            continue
        argv.append("--" + name.replace("_", "-"))
        if value is not True:
            argv.append(str(value))
    return argv


if __name__ == "__main__":
    sys.exit(main())
