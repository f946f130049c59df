"""A small app for the CLI tests: ``--app sample_app:ledger`` with ``tests/apps`` on the path.

``numbers``: payload ``{"n": N, "skip": [...], "fail": [...], "sleep": seconds}`` becomes N items;
those in ``skip`` are skipped at decomposition, those in ``fail`` fail permanently, the rest
are doubled. ``explodes``: yields ``good`` items, then its decomposer raises.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from workledger import Context, Item, ItemView, Ledger, Permanent, Skip

ledger = Ledger()

numbers = ledger.job("numbers")


@numbers.decompose
def split(payload: dict[str, Any]) -> Iterator[Item | Skip]:
    for i in range(payload.get("n", 10)):
        if i in payload.get("skip", []):
            yield Skip(key=f"n{i}", reason="unwanted number")
        else:
            yield Item(key=f"n{i}", data={"i": i, "sleep": payload.get("sleep", 0),
                                          "fail": i in payload.get("fail", [])})


@numbers.stage("double", idempotent=True)
def double(item: ItemView, ctx: Context) -> dict[str, int]:
    if item.data["sleep"]:
        time.sleep(item.data["sleep"])
    if item.data["fail"]:
        raise Permanent("odd one out")
    return {"double": item.data["i"] * 2}


explodes = ledger.job("explodes")


@explodes.decompose
def split_then_raise(payload: dict[str, Any]) -> Iterator[Item]:
    for i in range(payload.get("good", 3)):
        yield Item(key=f"g{i}")
    raise ValueError(f"event {payload.get('good', 3)} is malformed")


@explodes.stage("work", idempotent=True)
def work(item: ItemView, ctx: Context) -> None:
    return None


class ExplodingLedger(Ledger):
    """A ledger whose audit has a bug: the CLI must still print one line, no traceback."""

    def audit(self, **where: Any) -> Any:
        raise RuntimeError("a bug in the app")


exploding = ExplodingLedger()


sends = ledger.job("sends")


@sends.decompose
def split_sends(payload: dict[str, Any]) -> Iterator[Item]:
    for i in range(payload.get("n", 3)):
        yield Item(key=f"s{i}")


@sends.stage("send")  # not idempotent, no verify hook: a lost lease means "unknown"
def send(item: ItemView, ctx: Context) -> dict[str, str]:
    return {"sent": ctx.idempotency_key}


tolerant = ledger.job("tolerant", tolerate=2)  # up to 2 failed units: completed_with_failures


@tolerant.decompose
def split_tolerant(payload: dict[str, Any]) -> Iterator[Item]:
    for i in range(payload.get("n", 5)):
        yield Item(key=f"t{i}", data={"fail": i in payload.get("fail", [])})


@tolerant.stage("first", idempotent=True)
def first(item: ItemView, ctx: Context) -> None:
    return None


@tolerant.stage("second", after="first", idempotent=True)
def second(item: ItemView, ctx: Context) -> None:
    if item.data["fail"]:
        raise Permanent("mailbox refused")


@tolerant.on_complete
def closed(status: Any) -> None:
    return None


broken = ledger.job("broken")  # its decomposer always raises: a person must fix it


@broken.decompose
def split_broken(payload: dict[str, Any]) -> Iterator[Item]:
    raise ConnectionError("the upstream API is down")
    yield Item()  # a generator, as decomposers usually are


@broken.stage("work", idempotent=True)
def broken_work(item: ItemView, ctx: Context) -> None:
    return None
