"""What the top-level options say (``--db``, ``--app``) and how the app is loaded.

The one rule for the ledger: when ``--app`` is given, the ledger is the one its ``Ledger``
names, for every command; a ``--db`` (or ``WORKLEDGER_DB``) that names another is refused
with both named (an app whose ``Ledger()`` names no URL takes ``--db``'s). Without ``--app``
the ledger is ``--db``'s, or ``sqlite:///workledger.db``.

The app's code runs only in the commands that must run it or know what a job declares:
``submit``, ``worker``, ``sweep``, ``serve`` and ``resolve --as processed`` (and ``audit``,
to name what the sweeper will do). Every other command imports the app's module only to learn
the ledger's URL, and works on a ledger of its own on that URL, which calls none of the app's
handlers. Only ``init``, ``submit``, ``worker`` and ``serve`` create a ledger; every other
command refuses a database that holds none (``NoLedger``), creating nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from workledger.api import DEFAULT_URL, Ledger, import_app, masked_url, same_database, url_secrets
from workledger.errors import AppError, BadInput, UsageError


@dataclass
class Settings:
    """What the top-level options say; the ledger is built on first use."""

    db: str | None
    app: str | None
    db_from: str = "--db"  # where ``db`` was given (--db or WORKLEDGER_DB), for messages
    # the passwords the CLI's error printer masks: the app's URL adds its own
    secrets: list[str] = field(default_factory=list)
    _app: Ledger | None = field(default=None, repr=False)
    _ledger: Ledger | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The ledger's URL: the one the app names when ``--app`` is given."""
        if self.app:
            return self.app_ledger().url
        return self.db or DEFAULT_URL

    def app_ledger(self) -> Ledger:
        """The Ledger ``--app`` names, imported once and checked against ``--db``."""
        if self._app is None:
            assert self.app is not None
            ledger = load_app(self.app)
            if self.db and not same_database(self.db, ledger.url):
                if ledger.url_named:
                    raise UsageError(self._conflict(ledger))
                ledger.use(self.db)  # a Ledger() that names no URL: --db chooses
            self.secrets.extend(url_secrets(ledger.url))
            self._app = ledger
        return self._app

    def _conflict(self, ledger: Ledger) -> str:
        undo = "unset WORKLEDGER_DB" if self.db_from == "WORKLEDGER_DB" else "drop --db"
        return (f"{self.db_from} {masked_url(self.db or '')} is not the ledger the app names: "
                f"{self.app} names {masked_url(ledger.url)}; {undo} to use the app's ledger, "
                "or make the app's Ledger() name that URL")

    def ledger(self, *, app: bool = False, create: bool = False) -> Ledger:
        """The ledger a command works on. ``app``: the app's own Ledger (with its job
        definitions, to run its code); otherwise a ledger of the command's own on the same
        URL. ``create``: make the database and its schema if they do not exist."""
        if self._ledger is None:
            ledger = self.app_ledger() if app and self.app else Ledger(self.url)
            ledger.create = create
            self._ledger = ledger
        return self._ledger

    def close(self) -> None:
        for ledger in {id(x): x for x in (self._ledger, self._app) if x is not None}.values():
            ledger.close()


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
