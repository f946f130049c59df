"""``--profile``: one decomposition and one in-process workledger drain, under pyinstrument or
bare (``--profiler none``, for an outside sampler such as py-spy)."""

from __future__ import annotations

import sys
import time
from typing import Any

from systems import wl_decompose, wl_drain, wl_prepare, wl_verify


def profile_drain(backend: Any, items: int, chunk: int, tool: str, html: str | None) -> None:
    """One decomposition and one in-process drain (the main thread claims and completes, one
    handler thread). ``tool=none`` runs it bare, for an outside sampler such as
    ``py-spy record --idle --threads --format raw`` (keep the stacks containing ``wl_drain``)."""
    profiler = _profiler() if tool == "pyinstrument" else None
    with backend.fresh() as url:
        seconds, run_id, _ = wl_decompose(url, items)
        print(f"decomposed {items:,} items in {seconds:.2f} s ({items / seconds:,.0f}/s)")
        state = wl_prepare(url, chunk)
        t = time.perf_counter()
        if profiler:
            profiler.start()
        processed, _, _ = wl_drain(url, chunk, state)
        if profiler:
            profiler.stop()
        seconds = time.perf_counter() - t
        wl_verify(url, run_id, items)
    print(f"drained {processed:,} items with chunk {chunk} in {seconds:.2f} s "
          f"({processed / seconds:,.0f}/s{', under the profiler' if profiler else ''})")
    if not profiler:
        return
    print(profiler.output_text(unicode=False, color=False, show_all=False))
    if html:
        with open(html, "w") as f:
            f.write(profiler.output_html())
        print(f"html profile: {html}")


def _profiler() -> Any:
    try:
        from pyinstrument import Profiler
    except ImportError:
        sys.exit("--profiler pyinstrument: .venv/bin/pip install pyinstrument")
    return Profiler(interval=0.001)
