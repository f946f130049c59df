"""The effects sink: what the chaos app's handlers really did, in a store the ledger does not own.

A separate SQLite file per round (WAL; a killed process loses nothing it committed). Every
table is keyed by ``ctx.idempotency_key`` (``run/stage/seq``) and append-only:

- ``starts``: one row per handler execution that began;
- ``effects``: one row per execution that performed its effect (no unique constraint: a
  duplicate effect shows as two rows);
- ``effects_dedup``: the effect as an idempotent downstream would keep it, once per key.

The oracle (oracle.py) reads it with plain SQL; nothing here imports workledger.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS starts (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, token INTEGER, attempt INTEGER,
    pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS effects (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, token INTEGER, attempt INTEGER,
    pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS effects_dedup (key TEXT PRIMARY KEY, at REAL NOT NULL);
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
        """The effect and its deduplicated twin, in one transaction."""
        conn = self._conn()
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "INSERT INTO effects (key, token, attempt, pid, at) VALUES (?, ?, ?, ?, ?)",
                (key, token, attempt, os.getpid(), now))
            conn.execute("INSERT INTO effects_dedup (key, at) VALUES (?, ?)"
                         " ON CONFLICT (key) DO NOTHING", (key, now))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def has_effect(self, key: str) -> bool:
        row = self._conn().execute("SELECT 1 FROM effects_dedup WHERE key = ?", (key,))
        return row.fetchone() is not None


@dataclass(frozen=True)
class SinkView:
    """What the sink holds, per idempotency key."""

    starts: Counter[str]
    effects: Counter[str]
    dedup: frozenset[str]

    @property
    def total_effects(self) -> int:
        return sum(self.effects.values())


def read(path: str) -> SinkView:
    conn = connect(path)
    try:
        starts = Counter(k for (k,) in conn.execute("SELECT key FROM starts"))
        effects = Counter(k for (k,) in conn.execute("SELECT key FROM effects"))
        dedup = frozenset(k for (k,) in conn.execute("SELECT key FROM effects_dedup"))
    finally:
        conn.close()
    return SinkView(starts, effects, dedup)


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
