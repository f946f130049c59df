"""One exception tree, rooted at :class:`WorkledgerError`.

The CLI maps each class to one line on stderr and a documented exit code:
``UsageError`` and its children exit 2, everything else exits 1.
"""

from __future__ import annotations

from typing import Any


class WorkledgerError(Exception):
    """Base of every error workledger raises on purpose."""

    exit_code = 1


class UsageError(WorkledgerError):
    """The caller asked for something that cannot be done as asked (exit 2)."""

    exit_code = 2


class BadInput(UsageError):
    """Input (a payload, a URL, a name) is malformed."""


class UnknownJob(UsageError):
    """No job of that name is defined in the app."""


class UnknownSchedule(UsageError):
    """No schedule of that name is declared by the loaded app."""


class NoLedger(UsageError):
    """The database named holds no ledger, and the command only reads: nothing is created."""


class UnknownRun(UsageError):
    """No run with that id exists in the ledger."""


class Refused(UsageError):
    """The run's (or item's) state refuses the action, e.g. cancelling a finished run; nothing
    was changed (exit 2; HTTP 409)."""


class PayloadMismatch(UsageError):
    """An idempotency key was reused with a different payload; nothing was written."""

    def __init__(self, message: str, run_id: int) -> None:
        super().__init__(message)
        self.run_id = run_id


class DatabaseUnavailable(WorkledgerError):
    """The database cannot be reached or opened (exit 1)."""


class CommitInDoubt(DatabaseUnavailable):
    """A COMMIT was sent, its answer was lost, and whether it happened could not be learned:
    the call is not tried again (it may have done its work). Raised by PostgreSQL stores only
    (``storage/doubt.py``)."""


class WorkerStuck(WorkledgerError):
    """More handlers stuck past their time limit than the worker's concurrency: it stopped so
    that a supervisor restarts it (a thread cannot be killed, nor a coroutine that ignores
    its cancellation)."""

    exit_code = 3


class StorageError(WorkledgerError):
    """A database operation failed; the driver error is kept as ``__cause__``."""


class Contention(StorageError):
    """A statement ran past its time limit, waited too long for a lock, or lost a deadlock or
    serialization race; its transaction was rolled back whole, so trying it again is safe
    (long-lived processes do, a few times)."""


class AppError(WorkledgerError):
    """The user's app could not be loaded or its code failed (exit 1)."""


class DecompositionFailed(AppError):
    """The decomposer raised; the run stays ``accepted`` with its rows so far kept."""

    def __init__(self, message: str, run_id: int, status: Any = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.status = status
