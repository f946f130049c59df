"""workledger: make large batches of work complete, resumable and countable.

One durable ledger row per unit of work, written before anything is dispatched; chunked
claims under leases; fenced, one-way terminal transitions; a run's state derived from its
items. See README.md and docs/.
"""

from workledger.api import Ledger, RunStatus, Submission
from workledger.async_api import AsyncLedger
from workledger.core.outcomes import Item, Permanent, Retry, Skip
from workledger.errors import PayloadMismatch, UnknownRun, WorkledgerError
from workledger.jobs import BatchContext, Context, ItemView

__all__ = [
    "AsyncLedger",
    "BatchContext",
    "Context",
    "Item",
    "ItemView",
    "Ledger",
    "PayloadMismatch",
    "Permanent",
    "Retry",
    "RunStatus",
    "Skip",
    "Submission",
    "UnknownRun",
    "WorkledgerError",
]
__version__ = "0.1.0"
