"""An app for the hostile-input corpus: ``--app hostile_app:ledger``, ``tests/apps`` on the path.

``echo``: payload ``{"items": [{"key": K, "data": D}, ...], "deep": N}`` becomes one item per
entry, keys and data as given (so a test can store any key), and with ``deep`` one more whose
data nests N levels; ``apply`` returns the item's data, or fails with ``data["fail"]``.
``idle``: never has work (a worker that exits at once). The attributes ``long_stage``,
``long_job`` and ``reserved_stage`` are ledgers whose definitions workledger refuses; they are
built only when asked for, so the module imports.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from workledger import Context, Item, ItemView, Ledger, Permanent

ledger = Ledger()

echo = ledger.job("echo")


@echo.decompose
def split(payload: dict[str, Any]) -> Iterator[Item]:
    for unit in payload.get("items", []):
        yield Item(key=unit.get("key"), data=unit.get("data"))
    if "deep" in payload:
        data: Any = "bottom"
        for _ in range(payload["deep"]):
            data = [data]
        yield Item(key="deep", data=data)


@echo.stage("apply", idempotent=True, max_attempts=1)
def apply(item: ItemView, ctx: Context) -> Any:
    if isinstance(item.data, dict) and "fail" in item.data:
        raise Permanent(item.data["fail"])
    return item.data


idle = ledger.job("idle")
idle.decompose(lambda payload: iter(()))
idle.stage("nothing", idempotent=True)(lambda item, ctx: None)


def _refused(job_name: str, stage_name: str) -> Ledger:
    refused = Ledger()
    job = refused.job(job_name)
    job.decompose(lambda payload: iter(()))
    job.stage(stage_name)(lambda item, ctx: None)
    return refused


def __getattr__(name: str) -> Ledger:
    if name == "long_stage":
        return _refused("long", "s" * 4000)
    if name == "long_job":
        return _refused("j" * 300, "apply")
    if name == "reserved_stage":
        return _refused("reserved", "@mine")
    raise AttributeError(name)
