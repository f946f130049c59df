"""A COMMIT whose answer never came: learning, on another connection, whether it happened.

A connection can break after the server received a COMMIT and before its reply arrived (a
lost acknowledgement). Trying the transaction again then does its work twice: a decomposition
failure counted twice, a finish whose own outcomes come back as ``stale_result``, a suspect
charged two attempts, a deferred run taken by nobody until the sweeper's grace. So every
PostgreSQL write transaction reads its transaction id just before COMMIT (:func:`before_commit`:
NULL for one that wrote nothing, which needs no answer), and when the connection breaks during
the COMMIT the store asks the server on a new connection (:func:`learn`):

- ``committed``: the work happened; the store returns the result it computed before the
  commit, and the caller never knows there was a fault;
- ``aborted``: nothing happened; the call is tried again like any other lost connection;
- ``in progress``: the old session still sits in the transaction (its server process has not
  yet seen the connection close, or never received the COMMIT). It is terminated, which ends
  the transaction one way or the other (a COMMIT already under way completes first), and the
  server is asked again;
- no answer to trust (the server's timeline changed: a failover, after which the same id may
  name another transaction; or the id is too old to be known): tried again as before, where
  the fencing every write carries finds a repeated write out (docs/reliability.md).

When the server cannot be reached to ask for ``wait_for`` seconds, :class:`CommitInDoubt` is
raised: it is a ``DatabaseUnavailable`` that the retry layer does not retry, since that could
do the work twice. SQLite has no such fault: a local file's commit is answered by the process
that wrote it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from workledger.errors import CommitInDoubt

__all__ = ["CommitInDoubt", "Pending", "before_commit", "learn"]

log = logging.getLogger("workledger.db")

DOUBT_FOR = 60.0  # seconds a store without a retry layer keeps trying to learn an outcome
ASK_EVERY = 0.05  # seconds between two questions about a transaction still in progress
MAX_DELAY = 2.0  # the backoff's cap while the server cannot be reached

# The server's current timeline: a promoted standby starts a new one. pg_walfile_name names
# the segment of the WAL insert position with the timeline it is written on (its first 8 hex
# digits), up to date from the first transaction after a promotion (pg_control_checkpoint's
# timeline waits for the next checkpoint). The claims of sql/postgres/queries.sql put the same
# expression in the high bits of every lease token.
TIMELINE_SQL = "('x' || left(pg_walfile_name(pg_current_wal_insert_lsn()), 8))::bit(32)::bigint"
_BEFORE_COMMIT = (f"SELECT pg_current_xact_id_if_assigned()::text, "
                  f"CASE WHEN pg_current_xact_id_if_assigned() IS NOT NULL "
                  f"THEN {TIMELINE_SQL} END")
_STATUS = f"SELECT pg_xact_status(%s::xid8), {TIMELINE_SQL}"
# the old session, only if it still runs our transaction (a pid can be reused)
_END_SESSION = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid = %s AND backend_xid::text = %s")


@dataclass(frozen=True)
class Pending:
    """A write transaction about to commit: enough to ask about it later."""

    xid: int  # the full 64-bit id (xid8)
    timeline: int
    pid: int  # the server process of its session


def before_commit(conn: psycopg.Connection[Any]) -> Pending | None:
    """The transaction's id, just before its COMMIT; None when it wrote nothing."""
    with conn.cursor(row_factory=psycopg.rows.tuple_row) as cur:
        row = cur.execute(_BEFORE_COMMIT).fetchone()
    if row is None or row[0] is None:
        return None
    return Pending(xid=int(row[0]), timeline=int(row[1]), pid=conn.info.backend_pid)


def learn(connect: Callable[[], psycopg.Connection[Any]], pending: Pending, wait_for: float,
          *, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> bool | None:
    """Whether ``pending`` committed: True, False (it did not), None (no answer to trust).
    Asked on new connections for up to ``wait_for`` seconds; then :class:`CommitInDoubt`."""
    deadline = clock() + wait_for
    delay = ASK_EVERY
    log.warning("the answer to a COMMIT was lost; asking the server whether transaction %d "
                "committed", pending.xid)
    while True:
        try:
            with connect() as conn:
                return _ask(conn, pending, deadline, clock, sleep)
        except psycopg.Error as exc:  # unreachable, refusing, out of connections: ask again
            if clock() >= deadline:
                raise CommitInDoubt(
                    f"the connection broke during a COMMIT and the server could not be asked "
                    f"whether it happened within {wait_for:g} s (transaction {pending.xid}): "
                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
                ) from exc
            sleep(delay)
            delay = min(delay * 2, MAX_DELAY)


def _ask(conn: psycopg.Connection[Any], pending: Pending, deadline: float,
         clock: Callable[[], float], sleep: Callable[[float], None]) -> bool | None:
    ended = False
    while True:
        try:
            status, timeline = _status(conn, pending)
        except psycopg.Error as exc:
            if exc.sqlstate is None or _gone(exc):
                raise  # the connection: asked again on another
            # an id this server has not reached yet (not its transaction), or a standby
            log.warning("transaction %d: the server cannot say whether it committed: %s",
                        pending.xid, str(exc).strip().splitlines()[0])
            return None
        if timeline != pending.timeline:
            log.warning("transaction %d was on timeline %d, the server is now on %d "
                        "(a failover): its outcome cannot be learned", pending.xid,
                        pending.timeline, timeline)
            return None
        if status == "committed":
            log.warning("transaction %d had committed: its result stands", pending.xid)
            return True
        if status == "aborted":
            return False
        if status is None:
            return None
        # in progress: the old session has not seen its connection close yet
        if not ended:
            ended = True
            try:
                conn.execute(_END_SESSION, (pending.pid, str(pending.xid & 0xFFFF_FFFF)))
            except psycopg.Error as exc:
                if exc.sqlstate is None or _gone(exc):
                    raise
                # not allowed to end it: it ends when it sees its connection closed, or at
                # idle_in_transaction_session_timeout
        if clock() >= deadline:
            raise CommitInDoubt(f"transaction {pending.xid} is still in progress on the server "
                                "and its session could not be ended")
        sleep(ASK_EVERY)


def _status(conn: psycopg.Connection[Any], pending: Pending) -> tuple[str | None, int]:
    with conn.cursor(row_factory=psycopg.rows.tuple_row) as cur:
        row = cur.execute(_STATUS, (str(pending.xid),)).fetchone()
    assert row is not None
    return row[0], int(row[1])


def _gone(exc: psycopg.Error) -> bool:
    """The server refused or ended the session (starting up, shutting down): ask again."""
    return isinstance(exc, psycopg.errors.CannotConnectNow | psycopg.errors.AdminShutdown
                      | psycopg.errors.CrashShutdown)
