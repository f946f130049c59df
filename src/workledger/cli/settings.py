"""What the top-level options say (``--db``, ``--app``) and how the app is loaded."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from workledger.api import DEFAULT_URL, Ledger
from workledger.errors import AppError, BadInput


@dataclass
class Settings:
    """What the top-level options say; the ledger is built on first use."""

    db: str | None
    app: str | None
    _ledger: Ledger | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.db or DEFAULT_URL

    def ledger(self) -> Ledger:
        if self._ledger is None:
            ledger = load_app(self.app) if self.app else Ledger(self.url)
            if self.db:
                ledger.use(self.db)
            self._ledger = ledger
        return self._ledger

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()


def load_app(spec: str) -> Ledger:
    """Import ``module:attribute`` and return the :class:`Ledger` it names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BadInput(f"cannot load app {spec!r}: expected module:attribute")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: apps in the current folder import
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise AppError(f"cannot load app {spec!r}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, Ledger):
        raise AppError(f"cannot load app {spec!r}: it is a {type(obj).__name__}, not a Ledger")
    return obj


# -- output helpers ---------------------------------------------------------------------------
