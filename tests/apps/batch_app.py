"""An app for batch-handler tests: ``--app batch_app:ledger``.

``mail``: payload ``{"n": N, "bad": [seqs], "busy": [seqs], "gone": [seqs], "raise": bool,
"short": bool, "log": PATH}`` becomes N items. Stage ``send`` (idempotent, ``batch=10``)
receives up to 10 items at once and returns one entry per item: a result, ``Permanent`` for
``bad``, ``Retry`` (first attempt only) for ``busy``, ``Skip`` for ``gone``; ``raise`` makes the
whole call raise at its first attempt, ``short`` returns one entry too few at the first attempt.
Each call appends ``<pid> <count> <keys...>`` to ``log``. ``notify`` is the same, not idempotent.
"""

from __future__ import annotations

import os
from typing import Any

from workledger import BatchContext, Ledger, Permanent, Retry, Skip
from workledger import Item as NewItem

ledger = Ledger()


def _split(payload: dict[str, Any]) -> Any:
    for i in range(int(payload["n"])):
        yield NewItem(key=f"m{i}", data={"i": i, **{k: i in payload.get(k, [])
                                                     for k in ("bad", "busy", "gone")},
                                         "raise": bool(payload.get("raise")),
                                         "short": bool(payload.get("short")),
                                         "die": bool(payload.get("die")),
                                         "log": payload.get("log")})


def _send(items: list[Any], ctx: BatchContext) -> list[Any]:
    first = items[0].data
    if first["log"]:
        with open(first["log"], "a") as f:
            f.write(f"{os.getpid()} {len(items)} {' '.join(ctx.idempotency_keys)}\n")
    if first.get("die") and ctx.attempts[0] == 1 and any(i.data["i"] == 0 for i in items):
        os._exit(137)  # the handler process dies in the middle of the call
    if first["raise"] and ctx.attempts[0] == 1:
        raise ConnectionError("the mail server hung up")
    out: list[Any] = []
    for item, attempt in zip(items, ctx.attempts, strict=True):
        if item.data["bad"]:
            out.append(Permanent("550 no such mailbox"))
        elif item.data["busy"] and attempt == 1:
            out.append(Retry("451 try again later", delay=0.01))
        elif item.data["gone"]:
            out.append(Skip("unsubscribed"))
        else:
            out.append({"sent": ctx.run_id * 1000 + item.seq, "attempt": attempt})
    if first["short"] and ctx.attempts[0] == 1:
        out.pop()
    return out


mail = ledger.job("mail")
mail.decompose(_split)
mail.stage("send", idempotent=True, batch=10, base_delay=0.01)(_send)

notify = ledger.job("notify")
notify.decompose(_split)
notify.stage("send", batch=10, base_delay=0.01)(_send)
