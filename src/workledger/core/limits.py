"""The input limits, in one place, each with its reason (docs/design.md, "Input limits").

Every limit is checked in Python before anything is written, and counted the same way on both
backends (UTF-8 bytes, nesting levels, rows), so an input one database would take and the other
refuse is refused by both, with the limit in the message.
"""

from __future__ import annotations

# A run's idempotency key. PostgreSQL's unique index on (job, idempotency_key) holds an entry
# of at most about 2,700 bytes (a third of a page); a longer one fails at insert, while SQLite
# would take a megabyte. 1,000 bytes leaves room for the job name and the index's overhead,
# and is far more than a key needs (the default key, a hash, is 71).
KEY_BYTES = 1000

# Job and stage names: in the same unique indexes (wl_runs, wl_items, wl_stage_counts) and in
# every table the CLI prints. No real name comes near 200 bytes.
NAME_BYTES = 200

# A JSON document: a run's payload, an item's data, a handler's or verify hook's result.
# The payload is retained on the run and read back whole by every re-decomposition; items
# carry identity, not data. PostgreSQL's jsonb stops at 255 MB and SQLite at 1 GB; 16 MiB is
# far below both, and larger inputs belong in a file or table the decomposer reads.
DOCUMENT_BYTES = 16 * 1024 * 1024

# Nesting of a JSON document (a scalar is 0, ``{"a": 1}`` is 1). Python's json, psycopg's jsonb
# loader, the CLI's indented JSON output and repr all recurse per level and fail somewhere
# below Python's recursion limit (1,000), earlier when they already run deep in a stack. 64 is
# deeper than any real document and far from that edge; readers apply the same limit, so a
# row written by anything else that is nested deeper is reported, not fatal.
DEPTH = 64

# Rows one listing (`runs`, `items`) returns. Listings stream in pages, so memory does not
# grow with the limit; the cap bounds the time and the output of one command. Page with
# --after / --before for more.
LIST_MAX = 100_000
# Rows read per statement while a listing streams. A page of a run's items costs a walk of the
# run's rows (SQLite, without statistics, reads them by run and sorts by id), so the largest
# listing takes at most ten statements; a page of rows is a few MB in memory.
PAGE = 10_000

# Ids, seqs and the like: both databases store 64-bit signed integers.
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000  # a run's priority (migration 0015 checks it too)
CONCURRENCY_KEY_BYTES = 200  # an item's concurrency key (Item(concurrency_key=...))
WEIGHT_MIN, WEIGHT_MAX = 1, 1000  # a tenant's weight (migration 0016 checks it too)
# A tenant's name: a label on /metrics and in the dashboard, so short and printable.
TENANT_BYTES = 200
DEFAULT_TENANT = "default"  # the tenant of the runs submitted without one
OTHER_TENANTS = "other"  # /metrics: the tenants past its bounded set (never a tenant's name)
ID_MAX = 2**63 - 1

# Items claimed at once: one statement and one lease token per chunk.
CHUNK_MAX = 10_000
PROCESSES_MAX = 256  # worker --processes

# Seconds: a lease (renewed by its holder every third of it) and the sweeper's grace. Both
# databases compute times from them; beyond these they overflow (PostgreSQL) or turn NULL
# (SQLite), and a NULL lease would never expire.
LEASE_MAX = 86_400.0
GRACE_MAX = 365 * 86_400.0


def text_problem(what: str, value: object, max_bytes: int) -> str | None:
    """Why ``value`` cannot be a key or a name (``what``: "key", "stage name", ...), or None.

    Not text, empty, a NUL character, an unpaired surrogate (PostgreSQL refuses both in text;
    SQLite would take them) or longer than ``max_bytes`` in UTF-8."""
    if not isinstance(value, str):
        return f"{what} must be text, not {type(value).__name__}"
    if not value:
        return f"{what} is empty"
    if "\x00" in value:
        return f"{what} contains a NUL character"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{what} is not valid Unicode (an unpaired surrogate, e.g. from a byte that " \
               "is not UTF-8)"
    if size > max_bytes:
        return f"{what} is {size:,} bytes; the limit is {max_bytes:,} bytes"
    return None

