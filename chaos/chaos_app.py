"""The chaos campaign's app, loaded by every process of a round with ``--app chaos_app:ledger``.

Two jobs, so that every declaration of a stage is under fire:

- ``relay``: ``prepare`` (idempotent: its effect is keyed by ``ctx.idempotency_key``), then
  ``deliver`` (not idempotent, with a ``verify`` hook that asks the sink), then a closing hook;
- ``charge``: one stage ``charge``, not idempotent and without a hook: an item whose holder
  vanished after it started waits in ``unknown`` for a person.

Every handler records its start, asks the downstream (which refuses while a ``refuse`` fault
lasts), sleeps a little, records its effect in the sink (sink.py) and returns. Nothing can
raise after the effect, so a retry never repeats an effect that happened.

The environment says where things are: ``CHAOS_SINK`` (the sink file), ``CHAOS_CONTROL`` (a
folder: ``refusing`` exists while the downstream refuses; each ``hang.*`` file makes one
handler hang; each ``slowhook-close.*`` or ``slowhook-verify.*`` file makes one closing or
verify hook sleep for the seconds it holds, longer than the lease, before it makes its effect
or gives its answer). In a round through a broker (broker.py), ``CHAOS_QUEUE`` and
``CHAOS_BROKER_URL`` name the RQ queue the ledger dispatches through, with the round's lease,
chunk and concurrency (``CHAOS_LEASE``, ``CHAOS_CHUNK``, ``CHAOS_CONCURRENCY``).
"""

from __future__ import annotations

import inspect
import os
import random
import time
from pathlib import Path
from typing import Any

from sink import Sink

from workledger import Item, Ledger, Retry, Skip

SINK = Sink(os.environ.get("CHAOS_SINK", "chaos-sink.db"))
CONTROL = Path(os.environ.get("CHAOS_CONTROL", "."))
HANDLER_TIMEOUT = float(os.environ.get("CHAOS_HANDLER_TIMEOUT", "1.5"))
RETRY = {"max_attempts": 6, "base_delay": 0.2, "max_delay": 1.0}
# a hang overruns the time limit by 0.5-3 s and then makes its effect: the late effect lands,
# so a verify hook asked, or a rerun started, while it still ran would show as a second effect
OVERRUN = (0.5, 3.0)



def _dispatch() -> Any:
    """The round's broker, when it goes through one (broker.py); else None."""
    queue = os.environ.get("CHAOS_QUEUE")
    if not queue:
        return None
    from redis import Redis

    from workledger.contrib.rq import RQDispatch

    return RQDispatch(Redis.from_url(os.environ["CHAOS_BROKER_URL"]), queue,
                      chunk=int(os.environ.get("CHAOS_CHUNK", "4")),
                      lease=float(os.environ.get("CHAOS_LEASE", "2")),
                      concurrency=int(os.environ.get("CHAOS_CONCURRENCY", "3")),
                      app="chaos_app:ledger")


# the URL comes from --db, or (an rq worker's work horse) from WORKLEDGER_DB
ledger = Ledger(dispatch=_dispatch())
relay = ledger.job("relay", tolerate=0.5, batch_size=4)
charge = ledger.job("charge", batch_size=4)


def timeouts_supported() -> bool:
    """Whether this workledger bounds a handler's time (``@job.stage(..., timeout=)``)."""
    return "timeout" in inspect.signature(type(relay).stage).parameters


def _options() -> dict[str, Any]:
    return {**RETRY, "timeout": HANDLER_TIMEOUT} if timeouts_supported() else dict(RETRY)


def refusing() -> bool:
    """While a ``refuse`` fault lasts the campaign keeps a file ``refusing`` in the control
    folder: no clock is compared, so a worker whose clock is skewed sees the same window."""
    return (CONTROL / "refusing").exists()


def _maybe_hang() -> None:
    """Take one hang token, if any, and run past the stage's time limit by 0.5-3 s."""
    for token in sorted(CONTROL.glob("hang.*")):
        try:
            token.rename(token.with_name(f"taken.{os.getpid()}.{token.name}"))
        except OSError:
            continue  # another handler took it
        time.sleep(HANDLER_TIMEOUT + random.uniform(*OVERRUN))
        return


def _maybe_slow_hook(hook: str) -> None:
    """Take one slow-hook token for ``hook`` (close | verify), if any, and sleep its seconds:
    a hook that outlives its lease, which must not be taken back and run again meanwhile."""
    for token in sorted(CONTROL.glob(f"slowhook-{hook}.*")):
        try:
            taken = token.with_name(f"taken.{os.getpid()}.{token.name}")
            token.rename(taken)
            seconds = float(taken.read_text() or 0)
        except (OSError, ValueError):
            continue  # another hook took it
        time.sleep(seconds)
        return


def work(item: Any, ctx: Any) -> dict[str, Any]:
    SINK.start(ctx.idempotency_key, ctx.lease_token, ctx.attempt)
    if refusing():
        raise Retry("downstream refuses (chaos)")
    _maybe_hang()
    time.sleep(random.uniform(0.02, 0.2))
    SINK.effect(ctx.idempotency_key, ctx.lease_token, ctx.attempt)
    time.sleep(random.uniform(0.0, 0.1))
    return {"token": ctx.lease_token}


def split(payload: dict[str, Any]) -> Any:
    every = int(payload.get("skip_every") or 0)
    for i in range(int(payload["units"])):
        if every and i % every == every - 1:
            yield Skip(reason="chaos: skipped at decomposition", key=f"u{i}")
        else:
            yield Item(key=f"u{i}", data={"i": i})


def delivered(item: Any, ctx: Any) -> str:
    """The verify hook: a downstream that is down cannot be asked (the item goes to a person).
    It fences the downstream at the item's token before it looks, as docs/reliability.md
    recommends: a handler of that token still running (its worker paused while its session was
    cut) can then no longer make its effect after the answer ``not_done``."""
    if refusing():
        raise ConnectionRefusedError("downstream refuses (chaos): cannot tell")
    _maybe_slow_hook("verify")
    SINK.fence(ctx.idempotency_key, ctx.lease_token)
    return "done" if SINK.has_effect(ctx.idempotency_key) else "not_done"


relay.decompose(split)
relay.stage("prepare", idempotent=True, **_options())(work)
relay.stage("deliver", after="prepare", verify=delivered, **_options())(work)
charge.decompose(split)
charge.stage("charge", **_options())(work)


@relay.on_complete(base_delay=0.1)
def closed(status: Any, ctx: Any) -> None:
    """The closing hook fences the downstream below its own entry's token before it acts
    (docs/reliability.md): a run of it by an earlier holder that only looked gone (paused while
    its session was ended) can then no longer make its effect."""
    key = ctx.idempotency_key  # "<run>/@close/0"
    SINK.start(key, ctx.lease_token, ctx.attempt)
    SINK.fence(key, ctx.lease_token - 1)
    _maybe_slow_hook("close")
    SINK.effect(key, ctx.lease_token, ctx.attempt)
