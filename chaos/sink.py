"""The effects sink: what the chaos app's handlers really did, in a store the ledger does not own.

A separate SQLite file per round (WAL; a killed process loses nothing it committed). Every
table is keyed by ``ctx.idempotency_key`` (``run/stage/seq``) and append-only:

- ``starts``: one row per handler execution that began;
- ``effects``: one row per execution that performed its effect (no unique constraint: a
  duplicate effect shows as two rows);
- ``effects_dedup``: the effect as an idempotent downstream would keep it, once per key;
- ``fences``: the lowest token still allowed an effect, per key, raised by the verify hook and
  by the person before a ``resolve``: the downstream fences out a handler that may still be
  running (a worker paused while its session was cut), the defence docs/reliability.md
  recommends for an effect that must not happen twice;
- ``refusals``: one row per effect a fence refused (the oracle says when that may happen);
- ``cuts``: when the campaign ended the round's PostgreSQL sessions (``pg_terminate``, from
  the stop to the start of a ``pg_restart``), on the campaign's own clock (wall time; a
  PostgreSQL round has no skewed worker);
- ``choices``: what the person at the console chose that allows an effect again (``resolve
  --as pending`` of an item, ``retry`` of a run), with the last effect's id at that moment:
  effect ids are one sequence, so the oracle tells "chosen after the first effect" without
  reading anyone's clock (a worker under faketime has a wrong one).

The oracle (oracle.py) reads it with plain SQL; nothing here imports workledger.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS starts (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, token INTEGER, attempt INTEGER,
    pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS effects (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, token INTEGER, attempt INTEGER,
    pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS effects_dedup (key TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS fences (key TEXT PRIMARY KEY, token INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS refusals (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, token INTEGER, attempt INTEGER,
    pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS cuts (
    id INTEGER PRIMARY KEY, what TEXT NOT NULL, start REAL NOT NULL, until REAL NOT NULL);
CREATE TABLE IF NOT EXISTS choices (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, what TEXT NOT NULL,
    after_effect INTEGER NOT NULL, at REAL NOT NULL, refused INTEGER NOT NULL DEFAULT 0);
"""


def connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=120.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=120000")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # a process kill loses nothing committed in WAL
    return conn


def create(path: str) -> None:
    conn = connect(path)
    try:
        conn.executescript(SCHEMA)
    finally:
        conn.close()


class Fenced(Exception):
    """The downstream refused an effect: a newer holder's verify hook or a person fenced the
    key at or above this handler's token."""


class Sink:
    """The handlers' writer: one connection per thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = connect(self.path)
        return conn

    def start(self, key: str, token: int, attempt: int) -> None:
        self._conn().execute(
            "INSERT INTO starts (key, token, attempt, pid, at) VALUES (?, ?, ?, ?, ?)",
            (key, token, attempt, os.getpid(), time.time()))

    def effect(self, key: str, token: int, attempt: int) -> None:
        """The effect and its deduplicated twin, in one transaction; refused (:class:`Fenced`)
        when the key is fenced at or above ``token``."""
        conn = self._conn()
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        try:
            fence = conn.execute("SELECT token FROM fences WHERE key = ?", (key,)).fetchone()
            if token and fence is not None and token <= fence[0]:
                conn.execute("INSERT INTO refusals (key, token, attempt, pid, at)"
                             " VALUES (?, ?, ?, ?, ?)", (key, token, attempt, os.getpid(), now))
                conn.execute("COMMIT")
                raise Fenced(f"{key}: token {token} is fenced out (up to {fence[0]})")
            conn.execute(
                "INSERT INTO effects (key, token, attempt, pid, at) VALUES (?, ?, ?, ?, ?)",
                (key, token, attempt, os.getpid(), now))
            conn.execute("INSERT INTO effects_dedup (key, at) VALUES (?, ?)"
                         " ON CONFLICT (key) DO NOTHING", (key, now))
            conn.execute("COMMIT")
        except Fenced:
            raise
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def fence(self, key: str, token: int) -> None:
        """Refuse from now on every effect of ``key`` whose token is ``token`` or lower."""
        fence(self.path, key, token, self._conn())

    def has_effect(self, key: str) -> bool:
        row = self._conn().execute("SELECT 1 FROM effects_dedup WHERE key = ?", (key,))
        return row.fetchone() is not None


def fence(path: str, key: str, token: int, conn: sqlite3.Connection | None = None) -> None:
    """What a careful verify hook or person does before answering: fence the downstream at the
    item's token, so that a handler of that token still running cannot make its effect after."""
    own = conn is None
    conn = conn or connect(path)
    try:
        conn.execute("INSERT INTO fences (key, token) VALUES (?, ?) ON CONFLICT (key)"
                     " DO UPDATE SET token = max(token, excluded.token)", (key, int(token or 0)))
    finally:
        if own:
            conn.close()


def cut(path: str, what: str, start: float, until: float) -> None:
    """The campaign ended the round's sessions between ``start`` and ``until`` (wall time)."""
    conn = connect(path)
    try:
        conn.execute("INSERT INTO cuts (what, start, until) VALUES (?, ?, ?)",
                     (what, start, until))
    finally:
        conn.close()


def choose(path: str, key: str, what: str) -> int:
    """Record a person's choice (``key``: ``run/stage/seq``, or ``run/*`` for a whole run)
    before the command that carries it out starts: every effect after it may follow from it.
    Returns the choice's id, for :func:`refused`."""
    conn = connect(path)
    try:
        cursor = conn.execute("INSERT INTO choices (key, what, after_effect, at)"
                              " SELECT ?, ?, coalesce(max(id), 0), ? FROM effects",
                              (key, what, time.time()))
        return int(cursor.lastrowid or 0)
    finally:
        conn.close()


def refused(path: str, choice: int) -> None:
    """The command of a choice ended with a one-line refusal: it changed nothing, so it allows
    nothing (a command killed midway may have committed: its choice stands)."""
    conn = connect(path)
    try:
        conn.execute("UPDATE choices SET refused = 1 WHERE id = ?", (choice,))
    finally:
        conn.close()


@dataclass(frozen=True)
class Effect:
    id: int  # the sink's sequence: the order effects happened in
    pid: int


@dataclass(frozen=True)
class Choice:
    key: str  # run/stage/seq, or run/* (a retry of the whole run)
    what: str  # "resolve pending" | "retry"
    after_effect: int  # the last effect's id when the person chose


@dataclass(frozen=True)
class Refusal:
    key: str
    token: int
    pid: int
    started: float  # when that handler started (wall time; 0 if its start is not recorded)
    at: float  # when its effect was refused


@dataclass(frozen=True)
class SinkView:
    """What the sink holds, per idempotency key."""

    starts: Counter[str]
    effects: Counter[str]
    dedup: frozenset[str]
    history: dict[str, list[Effect]] = field(default_factory=dict)  # key -> effects, in order
    choices: list[Choice] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    cuts: list[tuple[float, float]] = field(default_factory=list)  # (start, until), wall time

    @property
    def total_effects(self) -> int:
        return sum(self.effects.values())


def read(path: str) -> SinkView:
    conn = connect(path)
    try:
        starts = Counter(k for (k,) in conn.execute("SELECT key FROM starts"))
        effects = Counter(k for (k,) in conn.execute("SELECT key FROM effects"))
        dedup = frozenset(k for (k,) in conn.execute("SELECT key FROM effects_dedup"))
        history: dict[str, list[Effect]] = {}
        for key, effect_id, pid in conn.execute("SELECT key, id, pid FROM effects ORDER BY id"):
            history.setdefault(key, []).append(Effect(effect_id, pid))
        choices = [Choice(*row) for row in conn.execute(
            "SELECT key, what, after_effect FROM choices WHERE refused = 0 ORDER BY id")]
        refusals = [Refusal(*row) for row in conn.execute(
            "SELECT r.key, r.token, r.pid, coalesce((SELECT max(s.at) FROM starts AS s"
            " WHERE s.key = r.key AND s.token = r.token AND s.pid = r.pid), 0), r.at"
            " FROM refusals AS r ORDER BY r.id")]
        cuts = [(float(a), float(b)) for a, b in conn.execute("SELECT start, until FROM cuts")]
    finally:
        conn.close()
    return SinkView(starts, effects, dedup, history, choices, refusals, cuts)


def effect_keys(path: str) -> set[str]:
    """The keys whose effect happened: what a careful person checks before resolving."""
    conn = connect(path)
    try:
        return {k for (k,) in conn.execute("SELECT key FROM effects_dedup")}
    finally:
        conn.close()


def describe(view: SinkView) -> dict[str, Any]:
    return {"starts": sum(view.starts.values()), "effects": view.total_effects,
            "keys": len(view.dedup)}
