"""What the top-level options say (``--db``, ``--app``) and how the app is loaded.

The one rule for ``--app``: a command loads it only when it must run your code or know what a
job declares: ``submit``, ``worker``, ``sweep`` and ``resolve --as processed`` (and ``audit``,
when given, to name what the sweeper will do). Every other command reads or writes the ledger
alone and never imports it. Only ``init``, ``submit`` and ``worker`` create a ledger; every
other command refuses a database that holds none (``NoLedger``), creating nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from workledger.api import DEFAULT_URL, Ledger, import_app
from workledger.errors import AppError, BadInput, UsageError


@dataclass
class Settings:
    """What the top-level options say; the ledger is built on first use."""

    db: str | None
    app: str | None
    _ledger: Ledger | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.db or DEFAULT_URL

    def ledger(self, *, app: bool = False, create: bool = False) -> Ledger:
        """The ledger a command works on. ``app``: load ``--app`` (when given) for its job
        definitions; ``create``: make the database and its schema if they do not exist."""
        if self._ledger is None:
            ledger = load_app(self.app) if app and self.app else Ledger(self.url)
            if self.db:
                ledger.use(self.db)
            ledger.create = create
            self._ledger = ledger
        return self._ledger

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()


def load_app(spec: str) -> Ledger:
    """Import ``module:attribute`` and return the :class:`Ledger` it names.

    The current directory is searched for that module only, while it loads (after the
    standard library and the installed packages): see ``import_app``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BadInput(f"cannot load app {spec!r}: expected module:attribute")
    if module_name.endswith(".py") or not all(p.isidentifier() for p in module_name.split(".")):
        module = os.path.splitext(os.path.basename(module_name))[0] or "module"
        raise BadInput(f"cannot load app {spec!r}: give a module name, e.g. {module}:{attr} "
                       "(the current directory is on the import path)")
    try:
        obj: Any = import_app(spec)  # the way a worker's handler processes import it too
    except UsageError as exc:  # a definition workledger refuses (a name over its limit)
        raise UsageError(f"cannot load app {spec!r}: {exc}") from exc
    except Exception as exc:
        raise AppError(f"cannot load app {spec!r}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, Ledger):
        raise AppError(f"cannot load app {spec!r}: it is a {type(obj).__name__}, not a Ledger")
    obj.app = spec  # what a worker's handler processes import
    return obj
