"""Fault injection: each planned fault (plan.py) done to the round's real processes and server.

``inject`` returns ``"done"``, ``"later"`` (no target right now: try again on the next tick) or
``"dropped"`` (the fault cannot apply: never counted). A fault is counted when it happens; a
failpoint counts when its process dies there (rounds.py sees it exit with 137).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import sink as sinkmod
from backend import Db
from plan import Fault
from processes import Proc
from target import Target

SEASONED = 1.5  # seconds: a worker needs about that long to start and claim


def inject(rnd: Target, fault: Fault, index: int) -> str:
    outcome = _inject(rnd, fault, index)
    if outcome != "later":
        rnd.log(f"fault {index} {fault.kind} {fault.role} {fault.point}:{fault.nth} "
                f"{fault.mode} {fault.duration:.2f}: {outcome}")
    return outcome


def _inject(rnd: Target, fault: Fault, index: int) -> str:
    kind = fault.kind
    if kind == "kill":
        return _kill(rnd, fault)
    if kind == "failpoint":
        return _arm(rnd, fault, index)
    if kind == "stop":
        return _stop(rnd, fault)
    if kind == "refuse":
        rnd.refuse_for(fault.duration)
        rnd.counted(kind, time.monotonic() + fault.duration)
        return "done"
    if kind == "pg_terminate":
        return _terminate(rnd, fault)
    if kind == "pg_restart":
        return _restart(rnd, fault)
    if kind == "hang":
        (rnd.control / f"hang.{index}").write_text("hang")
        rnd.counted(kind, time.monotonic() + rnd.hang_seconds)
        return "done"
    if kind == "slow_hook":
        _token(rnd, f"slowhook-{fault.mode}.{index}", f"{fault.duration:.3f}")
        rnd.counted(kind, time.monotonic() + fault.duration, fault.mode)
        return "done"
    if kind == "skew":
        rnd.start_worker(skew=fault.mode)
        rnd.counted(kind, time.monotonic(), fault.mode[0])
        return "done"
    if kind == "reader":
        return _reader(rnd, fault)
    if kind == "partition":
        return _partition(rnd, fault)
    if kind == "broker_dup":
        return _duplicate(rnd, fault)
    if kind == "broker_delay":
        return _delay(rnd, fault)
    if kind == "lost_ack":
        if rnd.proxy is None or not rnd.backend.up():
            return "dropped" if rnd.proxy is None else "later"
        rnd.proxy.arm()  # counted when the proxy cuts a COMMIT (rounds.py)
        return "done"
    raise ValueError(f"unknown fault kind {kind!r}")


def _token(rnd: Target, name: str, text: str) -> None:
    """A control file that appears whole: a hook never reads it half written."""
    draft = rnd.control / f"draft.{name}"
    draft.write_text(text)
    draft.rename(rnd.control / name)


def _reader(rnd: Target, fault: Fault) -> str:
    """A reader holding one transaction open (BEGIN; SELECT ...) for the fault's seconds, in a
    thread of the campaign: on SQLite no checkpoint can pass its snapshot meanwhile."""
    if not rnd.backend.up():
        return "later"
    thread = threading.Thread(target=_read_long, args=(rnd, fault.duration), daemon=True,
                              name="long-reader")
    rnd.threads.append(thread)
    thread.start()
    rnd.counted("reader", time.monotonic() + fault.duration)
    return "done"


def _read_long(rnd: Target, seconds: float) -> None:
    db = Db(rnd.url, application="chaos-reader")
    try:
        db.hold_snapshot(seconds)
        rnd.log(f"reader held a transaction for {seconds:.2f} s")
    except Exception as exc:  # noqa: BLE001 - a terminated session or a restart: the fault ends
        rnd.log(f"reader ended early: {str(exc).strip().splitlines()[:1]}")
    finally:
        db.close()


def _seasoned(procs: list[Proc]) -> list[Proc]:
    """Processes up long enough to hold work, when there are any: a process killed while it
    is still importing its modules tells nothing about the ledger."""
    now = time.monotonic()
    return [p for p in procs if now - p.started > SEASONED] or procs


def _kill(rnd: Target, fault: Fault) -> str:
    live = _seasoned(rnd.live(fault.role) or rnd.live("worker"))
    if not live:
        return "later"
    target = live[int(fault.pick * len(live))]
    target.killed = True
    rnd.log(f"SIGKILL {target.name}")
    if target.signal(signal.SIGKILL):
        rnd.counted("kill", time.monotonic(), target.role)
        return "done"
    return "later"


def _stop(rnd: Target, fault: Fault) -> str:
    live = _seasoned([p for p in (rnd.live(fault.role) or rnd.live("worker"))
                      if p.stopped_until is None])
    if not live:
        return "later"
    target = live[int(fault.pick * len(live))]
    if not target.signal(signal.SIGSTOP):
        return "later"
    target.stopped_until = time.monotonic() + fault.duration
    rnd.log(f"SIGSTOP {target.name} for {fault.duration:.2f} s")
    rnd.counted("stop", target.stopped_until, target.role)
    return "done"


def _arm(rnd: Target, fault: Fault, index: int) -> str:
    """A failpoint kills the process that passes it: start one that carries it."""
    spec = f"{fault.point}:{fault.nth}:exit"
    if fault.role == "worker":
        rnd.start_worker(failpoint=spec)
    elif fault.role == "sweeper":
        rnd.sweeper_slot.failpoint = spec  # its next passes carry it until it fires
    else:
        base = rnd.plan.runs[index % len(rnd.plan.runs)]
        rnd.submit(base, f"{base.key}-fp{index}", 0, failpoint=spec)
    rnd.armed += 1
    return "done"


def _partition(rnd: Target, fault: Fault) -> str:
    """A worker started in the partition's namespace holds work for a moment, then its veth
    goes down for the fault's seconds and comes up again (netns.py); one at a time."""
    part = getattr(rnd.backend, "partition", None)
    if part is None:
        return "dropped"
    if part.down or any(t.name == "partition" and t.is_alive() for t in rnd.threads) \
            or not rnd.backend.up():
        return "later"
    worker = rnd.start_worker(partitioned=True)
    thread = threading.Thread(target=_cut_off, args=(rnd, fault, part, worker),
                              name="partition", daemon=True)
    rnd.threads.append(thread)
    thread.start()
    rnd.counted("partition", time.monotonic(), fault.mode)  # and again when it heals
    return "done"


def _cut_off(rnd: Target, fault: Fault, part: Any, worker: Proc) -> None:
    """The cut comes once the worker is connected (its holder session and its own: a worker
    that cannot connect at start exits with one line, a fault of another kind) and has had a
    moment to claim, or after 10 s whatever it does."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and worker.alive \
            and rnd.backend.sessions_from(part.guest) < 2:
        time.sleep(0.1)
    time.sleep(0.5)
    began = time.time()
    part.cut()
    rnd.log(f"partition: {worker.name} cut off from the server for {fault.duration:.2f} s")
    try:
        time.sleep(fault.duration)  # the partition itself
    finally:
        part.heal()
        rnd.counted("partition", time.monotonic(), count=False)
        rnd.log(f"partition healed ({fault.mode})")
        if fault.mode == "long":  # long enough for the server to end the worker's sessions
            sinkmod.cut(str(rnd.sink), "partition", began, time.time())


def _duplicate(rnd: Target, fault: Fault) -> str:
    """Copies of messages published again (broker.py): none to copy yet is ``later``."""
    if rnd.broker is None:
        return "dropped"
    mode, n = rnd.broker.duplicate(fault.mode, fault.pick)
    if n == 0:
        return "later"
    rnd.log(f"broker: {n} {mode} messages published again (drawn: {fault.mode})")
    rnd.counted("broker_dup", time.monotonic(), mode)
    return "done"


def _delay(rnd: Target, fault: Fault) -> str:
    """The messages waiting in the queue taken out for the fault's seconds, then put back;
    one delay at a time."""
    if rnd.broker is None:
        return "dropped"
    if any(t.name == "broker-delay" and t.is_alive() for t in rnd.threads):
        return "later"
    taken = rnd.broker.take_out()
    if not taken:
        return "later"
    rnd.log(f"broker: {len(taken)} messages held back for {fault.duration:.2f} s")

    def put_back() -> None:
        time.sleep(fault.duration)
        rnd.broker.put_back(taken)
        rnd.log(f"broker: {len(taken)} held messages put back")

    thread = threading.Thread(target=put_back, name="broker-delay", daemon=True)
    rnd.threads.append(thread)
    thread.start()
    rnd.counted("broker_delay", time.monotonic() + fault.duration)
    return "done"


def _terminate(rnd: Target, fault: Fault) -> str:
    if not rnd.backend.up():
        return "later"
    try:
        n = rnd.backend.terminate(rnd.url, fault.mode, fault.pick)
    except Exception:  # noqa: BLE001 - the server went away meanwhile: try again
        return "later"
    if n == 0:
        return "later"
    now = time.time()
    sinkmod.cut(str(rnd.sink), "pg_terminate", now, now)
    rnd.counted("pg_terminate", time.monotonic())
    return "done"


def _restart(rnd: Target, fault: Fault) -> str:
    if not rnd.backend.up():
        return "later"

    def restart() -> None:
        began = time.time()
        try:
            rnd.backend.restart(fault.mode, fault.duration)
        finally:
            sinkmod.cut(str(rnd.sink), "pg_restart", began, time.time())
            rnd.counted("pg_restart", time.monotonic(), count=False)

    rnd.counted("pg_restart", time.monotonic() + fault.duration)
    thread = threading.Thread(target=restart, name="pg-restart", daemon=True)
    rnd.threads.append(thread)
    thread.start()
    return "done"
