"""Samples and what is printed from them: the table (workledger next to the raw loop and the
peers, with the ratios), the floors of issues 2 and 5 (reported, never asserted), the lines
under the table about status and the peers, and the ``--json`` file."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import peers
from probes import STATUS_EVERY

# Issue 2 floors (reported, never asserted).
FLOORS_ISSUE2 = {
    ("sqlite", "decompose", None): 50_000,
    ("postgres", "decompose", None): 50_000,
    ("sqlite", "drain", 1): 10_000,
    ("postgres", "drain", 1): 5_000,
}
# Issue 5 floors, reported only: workledger / raw, workledger / peer, end of drain / start.
RATIO_FLOORS_ISSUE5 = {"decompose": 0.70, "drain": 0.60}
PEER_FLOORS_ISSUE5 = {"procrastinate": 10.0, "pgqueuer": 3.0}
END_START_FLOOR = 0.8  # items/s over the last 10% within 20% of the first 10%
STATUS_FLOOR_MS = 50.0  # status while workers run, median (issue 5, 1M items)
RSS_GROWTH_FLOOR = 1.2  # worker peak RSS at 1M within 1.2x of 100k


@dataclass
class Sample:
    backend: str  # sqlite | postgres
    system: str  # workledger | raw | procrastinate | pgqueuer
    phase: str  # decompose | enqueue | drain | drain2 | drain+status | drain+fair | ...
    processes: int | None
    chunk: int | None  # a peer's setting: pgqueuer batch size, procrastinate concurrency
    rep: int
    items: int
    seconds: float
    rss_mib: float | None = None  # peak RSS of the largest worker process
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else float("inf")


PHASE_LABELS = {
    "decompose": "decompose",
    "drain": "claim+complete",
    "drain2": "2-stage claim+complete (units/s)",
    "drain-plain": "claim+complete, stage not idempotent",
    "drain+status": "claim+complete, status polled",
    "drain+fair": "claim+complete, status polled + 10-item run",
    "enqueue": "decompose vs enqueue",
}
PHASE_ORDER = ["decompose", "drain", "drain2", "drain-plain", "drain+status", "drain+fair"]
# in --json only: the 2-stage decomposition (the same rows as decompose) and the loads of the
# cells that poll status (their decomposition is measured by the plain cells)
HIDDEN_PHASES = {"decompose2", "decompose-plain", "decompose+probe"}
HEAD = ["backend", "phase", "N", "procs", "chunk", "workledger items/s [min-max]", "vs",
        "other items/s [min-max]", "wl/other", "claim ms start>end", "end/start 10%",
        "wl RSS MiB", "floors (not asserted)"]
LEFT = ("backend", "phase", "vs", "floors (not asserted)")  # left-aligned columns

Key = tuple[str, str, int, int | None, int | None]  # backend, phase, N, processes, chunk


def _fmt_rate(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:>9,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _floor_note(backend: str, phase: str, procs: int | None, chunk: int | None,
                wl: float | None, ratio: float | None, end_start: float | None) -> str:
    notes = []
    floor = FLOORS_ISSUE2.get((backend, phase, procs))
    if floor is not None and wl is not None:
        notes.append(f"i2 >={floor // 1000}k {'ok' if wl >= floor else 'BELOW'}")
    rfloor = RATIO_FLOORS_ISSUE5.get(phase)
    applies = phase == "decompose" or (chunk == 500 and (
        procs == 1 or (backend == "postgres" and procs == 2)))
    if rfloor is not None and ratio is not None and applies:
        notes.append(f"i5 >={rfloor:.0%} {'ok' if ratio >= rfloor else 'BELOW'}")
    if end_start is not None:
        notes.append(f"i5 end>={END_START_FLOOR:.0%} start "
                     f"{'ok' if end_start >= END_START_FLOOR else 'BELOW'}")
    return "; ".join(notes)


def _profile_cols(wl: list[Sample]) -> tuple[str, str, float | None]:
    """Claim ms over the first vs last 10% of chunks, and last/first 10% items/s (medians)."""
    first = [s.extra["claim_ms_first"] for s in wl if s.extra.get("claim_ms_first") is not None]
    last = [s.extra["claim_ms_last"] for s in wl if s.extra.get("claim_ms_last") is not None]
    ratios = [s.extra["end_start"] for s in wl if s.extra.get("end_start") is not None]
    claim = f"{statistics.median(first):.1f}>{statistics.median(last):.1f}" if first else "-"
    end_start = _med(ratios)
    return claim, "-" if end_start is None else f"{end_start:.2f}", end_start


# =============================================================================================
# The table
# =============================================================================================


def render_table(samples: list[Sample], main_n: int) -> str:
    """One row per (backend, phase, N, processes, chunk): workledger next to the raw loop,
    then one row per peer and process count (and workledger chunk) against workledger."""
    backends = list(dict.fromkeys(s.backend for s in samples))  # in the order measured
    keys = _own_keys(samples, backends)
    rows = [HEAD]
    for backend in backends:
        rows += [_own_row(samples, k) for k in keys if k[0] == backend]
        for peer in peers.PEERS:
            rows += _peer_rows(samples, backend, peer, main_n)
    if len({k[2] for k in keys}) <= 1:  # one N: no N column
        i = HEAD.index("N")
        rows = [r[:i] + r[i + 1:] for r in rows]
    return _align(rows)


def _pick(samples: list[Sample], system: str, backend: str, phase: str, procs: int | None,
          chunk: int | None, items: int | None = None) -> list[Sample]:
    return [s for s in samples if (s.system, s.backend, s.phase, s.processes) ==
            (system, backend, phase, procs) and (chunk is None or s.chunk == chunk)
            and (items is None or s.items == items)]


def _own_keys(samples: list[Sample], backends: list[str]) -> list[Key]:
    """The (backend, phase, N, processes, chunk) of workledger's and the raw loop's rows."""
    keys: list[Key] = []
    for s in samples:
        if s.system in ("workledger", "raw") and s.phase not in HIDDEN_PHASES:
            k = (s.backend, s.phase, s.items, s.processes, s.chunk)
            if k not in keys:
                keys.append(k)
    order = {p: i for i, p in enumerate(PHASE_ORDER)}
    keys.sort(key=lambda k: (backends.index(k[0]), k[2], order.get(k[1], 9), k[3] or 0,
                             k[4] or 0))
    return keys


def _own_row(samples: list[Sample], key: Key) -> list[str]:
    """workledger next to the raw loop in one (backend, phase, N, processes, chunk)."""
    backend, phase, items, procs, chunk = key
    wl = [s for s in _pick(samples, "workledger", backend, phase, procs, None, items)
          if s.chunk == chunk]
    raw = [s for s in _pick(samples, "raw", backend, phase, procs, None, items)
           if s.chunk == chunk]
    wl_med = _med([s.rate for s in wl])
    ratio = _ratio(wl_med, _med([s.rate for s in raw]))
    rss = [s.rss_mib for s in wl if s.rss_mib is not None]
    claim, end_start_txt, end_start = _profile_cols(wl)
    return [
        backend, PHASE_LABELS.get(phase, phase), f"{items:,}",
        "-" if procs is None else str(procs), "-" if chunk is None else str(chunk),
        _fmt_rate([s.rate for s in wl]), "raw SQL" if raw else "-",
        _fmt_rate([s.rate for s in raw]), "-" if ratio is None else f"{ratio:.2f}",
        claim, end_start_txt, f"{max(rss):.0f}" if rss else "-",
        _floor_note(backend, phase if phase in ("decompose", "drain") else "",
                    procs, chunk, wl_med, ratio, end_start),
    ]


def _peer_rows(samples: list[Sample], backend: str, peer: str, main_n: int
               ) -> list[list[str]]:
    """The peer's enqueue against workledger's decomposition, then its drain per process
    count against workledger's at the same P (one row per workledger chunk)."""
    mine = [s for s in samples if (s.backend, s.system) == (backend, peer)]
    if not mine:
        return []
    label = _peer_label(peer, mine, main_n)
    rows = []
    enq = [s for s in mine if s.phase == "enqueue"]
    if enq:
        wl = [s for s in samples if (s.backend, s.system, s.phase, s.items)
              == (backend, "workledger", "decompose", main_n)]
        ratio = _ratio(_med([s.rate for s in wl]), _med([s.rate for s in enq]))
        rows.append([backend, PHASE_LABELS["enqueue"], f"{main_n:,}", "-", "-",
                     _fmt_rate([s.rate for s in wl]), label, _fmt_rate([s.rate for s in enq]),
                     "-" if ratio is None else f"{ratio:.2f}", "", "", "", ""])
    for procs in sorted({s.processes or 0 for s in mine if s.phase == "drain"}):
        p_rates = [s.rate for s in mine if s.phase == "drain" and s.processes == procs]
        rows += _peer_drain_rows(samples, backend, peer, procs, p_rates, label, main_n)
    return rows


def _peer_drain_rows(samples: list[Sample], backend: str, peer: str, procs: int,
                     p_rates: list[float], label: str, main_n: int) -> list[list[str]]:
    chunks = sorted({s.chunk or 0 for s in samples if (
        s.backend, s.system, s.phase, s.processes, s.items)
        == (backend, "workledger", "drain", procs, main_n)}) or [None]
    rows = []
    for chunk in chunks:
        wl = _pick(samples, "workledger", backend, "drain", procs, chunk, main_n)
        ratio = _ratio(_med([s.rate for s in wl]), _med(p_rates))
        floor = PEER_FLOORS_ISSUE5[peer]
        note = "" if ratio is None else (
            f"i5 >={floor:.0f}x {peer} {'ok' if ratio >= floor else 'BELOW'}")
        rows.append([backend, PHASE_LABELS["drain"], f"{main_n:,}", str(procs),
                     "-" if chunk is None else str(chunk),
                     _fmt_rate([s.rate for s in wl]), label, _fmt_rate(p_rates),
                     "-" if ratio is None else f"{ratio:.2f}", "", "", "", note])
    return rows


def _peer_label(peer: str, mine: list[Sample], main_n: int) -> str:
    setting = next((s.chunk for s in mine if s.chunk), 0) or 0
    label = peers.short(peer, setting)
    ns = sorted({s.items for s in mine})
    if ns and ns != [main_n]:
        label += f", N={'/'.join(f'{n:,}' for n in ns)}"
    return label


def _align(rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, a rule under the head."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    left = {rows[0].index(c) for c in LEFT}
    lines = []
    for n, r in enumerate(rows):
        cells = [c.ljust(w) if i in left or not n else c.rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# =============================================================================================
# Lines under the table
# =============================================================================================


def status_lines(samples: list[Sample], backends: list[Any]) -> list[str]:
    lines = []
    for b in backends:
        for n in sorted({s.items for s in samples if s.backend == b.name}):
            lines += _pending_status_line(samples, b.name, n)
            lines += _polled_status_lines(samples, b.name, n)
    return lines


def _pending_status_line(samples: list[Sample], backend: str, n: int) -> list[str]:
    ms = [s.extra["status_ms_pending"] for s in samples
          if (s.backend, s.system, s.phase, s.items) == (backend, "workledger", "decompose", n)]
    if not ms:
        return []
    return [f"{backend}: ledger.status(run) right after decomposition ({n:,} pending): median "
            f"{statistics.median(ms):.0f} ms [{min(ms):.0f}-{max(ms):.0f}]"]


def _polled_status_lines(samples: list[Sample], backend: str, n: int) -> list[str]:
    """Status latency while the workers drained, the drain rate meanwhile and without."""
    polled = [s for s in samples if s.backend == backend and s.items == n
              and s.phase in ("drain+status", "drain+fair")]
    calls = [m for s in polled for m in s.extra.get("status_ms", ())]
    lines = []
    if calls:
        s = polled[0]
        clean = [x.rate for x in samples if (x.backend, x.system, x.phase, x.processes,
                 x.chunk, x.items) == (backend, "workledger", "drain", s.processes, s.chunk, n)]
        med = statistics.median(calls)
        lines.append(
            f"{backend}: ledger.status(run) from the parent every "
            f"{STATUS_EVERY * 1000:.0f} ms while {s.processes} worker process(es) "
            f"drain {n:,} items (C={s.chunk}): median {med:.0f} ms, max "
            f"{max(calls):.0f} ms over {len(calls)} calls; drain meanwhile "
            f"{statistics.median(x.rate for x in polled):,.0f}/s"
            + (f" (without polling {statistics.median(clean):,.0f}/s)" if clean else "")
            + f"; i5 <{STATUS_FLOOR_MS:.0f} ms {'ok' if med < STATUS_FLOOR_MS else 'BELOW'}")
    for s in polled:
        if s.extra.get("status_error"):
            lines.append(f"{backend}: status probe failed: {s.extra['status_error']}")
    return lines


def peer_lines(samples: list[Sample], main_n: int) -> list[str]:
    lines = []
    for peer in peers.PEERS:
        mine = [s for s in samples if s.system == peer and s.phase == "drain"]
        if not mine:
            continue
        ns = sorted({s.items for s in mine})
        tail = statistics.median(s.extra["returned_s"] - s.seconds for s in mine)
        slow = statistics.median(s.items / s.extra["returned_s"] for s in mine)
        note = (f"{peer}: drained {'/'.join(f'{n:,}' for n in ns)} jobs per cell"
                + (f" (--peer-items; workledger {main_n:,}: rates are compared)"
                   if ns != [main_n] else "")
                + f"; timed to its last handler call (in its favour); its workers returned "
                  f"a median {tail * 1000:,.0f} ms later ({slow:,.0f} jobs/s to that point)")
        lines.append(note)
    return lines


# =============================================================================================
# The whole report on stdout, and --json
# =============================================================================================


def print_report(args: argparse.Namespace, header: list[str], samples: list[Sample],
                 lines: list[str]) -> None:
    """The title, the header (machine, backends, peers), the other processes' load, the
    table and ``lines`` under it."""
    mode = (f"scale run: N={args.items:,} next to N={max(1, args.items // 10):,}, once"
            if args.scale else f"N={args.items:,} no-op items, median of {args.repeat}")
    print(f"workledger benchmark: {mode} [min-max], items/s; drain = claim+complete by P "
          f"worker processes, concurrency=1 each")
    for line in header:
        print(line)
    if args.quiet_wait:
        loads = [v for s in samples if s.phase.startswith("drain")
                 for v in (s.extra["foreign_cpu_before"], s.extra["foreign_cpu_after"])]
        if loads:
            print(f"other processes' CPU load next to each cell (idle-time probe, share of "
                  f"all CPUs): median {statistics.median(loads):.0%}, max {max(loads):.0%}")
    print()
    print(render_table(samples, args.items))
    for line in lines:
        print(line)


def write_json(path: str, header: list[str], notes: list[str], samples: list[Sample],
               failures: list[str]) -> None:
    with open(path, "w") as f:
        json.dump({"argv": sys.argv, "header": header, "notes": notes,
                   "samples": [asdict(s) | {"rate": s.rate} for s in samples],
                   "failures": failures}, f, indent=1)
