"""What the dashboard's templates show, computed from the facade's values: bars, ages, rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workledger.api import TERMINAL, ItemState, Ledger, RunStatus
from workledger.api import differences as diff_of
from workledger.progress import stage_order

SEGMENTS = tuple(s.value for s in (ItemState.PROCESSED, ItemState.FAILED, ItemState.SKIPPED,
                                    ItemState.UNKNOWN, ItemState.CLAIMED))


@dataclass(frozen=True)
class Bar:
    stage: str
    total: int  # units that reach this stage, at most
    done: int  # items of this stage in a terminal state
    parts: list[tuple[str, float, int]]  # (state, percent of the bar, items)
    counts: dict[str, int]


def bars(ledger: Ledger, st: RunStatus) -> list[Bar]:
    """One bar per stage: its items by state, against the units that can reach it (the run's
    units less those that ended in an earlier stage)."""
    out: list[Bar] = []
    ended = 0
    for stage in stage_order(ledger, st):
        counts = st.counts.get(stage, {})
        total = max(st.total - ended, sum(counts.values()), 1)
        parts = [(s, 100.0 * counts.get(s, 0) / total, counts.get(s, 0)) for s in SEGMENTS
                 if counts.get(s, 0)]
        done = sum(counts.get(s, 0) for s in TERMINAL)
        out.append(Bar(stage, total, done, parts, dict(counts)))
        ended += counts.get(ItemState.FAILED, 0) + counts.get(ItemState.SKIPPED, 0)
    return out


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def differences(result: Any) -> dict[str, tuple[object, object]]:
    return diff_of(result)


def event_row(e: Any) -> dict[str, Any]:
    detail = e.detail if isinstance(e.detail, dict) else ({} if e.detail is None else
                                                           {"detail": e.detail})
    trace = detail.get("traceback")
    shown = {k: v for k, v in detail.items() if k != "traceback"}
    return {"at": e.at, "kind": e.kind, "actor": e.actor or "", "token": e.lease_token,
            "detail": shown, "traceback": trace}


def int_or_none(text: str | None) -> int | None:
    if text is None or not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        return None
