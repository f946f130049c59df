"""The tests' way to lose an acknowledgement: the fault campaign's proxy, ``chaos/proxy.py``
(``CommitCutter``), one proxy for both."""

from __future__ import annotations

import sys
from pathlib import Path

_CHAOS = str(Path(__file__).resolve().parents[1] / "chaos")
sys.path.insert(0, _CHAOS)
try:
    from proxy import CommitCutter
finally:
    sys.path.remove(_CHAOS)

__all__ = ["CommitCutter"]
