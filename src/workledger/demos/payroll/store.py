"""The employee store: the HR system the payroll job reads from when it runs.

A SQLite file in the output folder holds the employees, their salary history, the pay periods,
the document numbers given out and every render call (so the demo can count renders).
"""

from __future__ import annotations

import calendar
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workledger.demos.local_db import LocalDb
from workledger.demos.payroll.config import BOUNCE_DOMAIN, STAFF_DOMAIN, TEMPLATE_VERSION

_STORE_SCHEMA = """
CREATE TABLE IF NOT EXISTS employees (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT, department TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS salaries (
    employee_id TEXT NOT NULL, valid_from TEXT NOT NULL, valid_to TEXT,
    monthly_gross_cents INTEGER NOT NULL, PRIMARY KEY (employee_id, valid_from)
);
CREATE TABLE IF NOT EXISTS pay_periods (
    period TEXT PRIMARY KEY, first_day TEXT NOT NULL, last_day TEXT NOT NULL,
    pay_date TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS documents (
    document_id TEXT PRIMARY KEY, run_id INTEGER NOT NULL, employee_id TEXT NOT NULL,
    period TEXT NOT NULL, template_version TEXT NOT NULL, sha256 TEXT,
    allocated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
CREATE TABLE IF NOT EXISTS renders (
    id INTEGER PRIMARY KEY, document_id TEXT NOT NULL, run_id INTEGER NOT NULL,
    pid INTEGER NOT NULL, written INTEGER NOT NULL DEFAULT 0,
    at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
CREATE INDEX IF NOT EXISTS renders_by_run ON renders (run_id, document_id);
"""

_FIRST = ["Ada", "Bram", "Chloe", "Dmitri", "Elif", "Farah", "Goran", "Hana", "Ines", "Jonas",
          "Kemal", "Lena", "Mateo", "Nora", "Oskar", "Priya", "Quinn", "Rosa", "Sven", "Tariq"]
_LAST = ["Andersen", "Bauer", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Horvat",
         "Ivanova", "Jansen", "Kowalski", "Larsen", "Moreau", "Novak", "Okafor", "Peters"]
_DEPARTMENTS = ["Assembly", "Finance", "Logistics", "Maintenance", "Quality", "Sales"]


def _month(period: str, delta: int) -> str:
    year, month = (int(p) for p in period.split("-"))
    index = year * 12 + month - 1 + delta
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


def _last_day(period: str) -> str:
    year, month = (int(p) for p in period.split("-"))
    return f"{period}-{calendar.monthrange(year, month)[1]:02d}"


def seed_employee(i: int, period: str) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """Employee number ``i``: some have no e-mail, some no salary yet, some a dead mailbox."""
    first, last = _FIRST[i % len(_FIRST)], _LAST[(i * 7) % len(_LAST)]
    domain = BOUNCE_DOMAIN if i % 250 == 199 else STAFF_DOMAIN
    email = None if i % 100 == 37 else f"{first}.{last}.{i}@{domain}".lower()
    emp = (f"E{i:05d}", f"{first} {last}", email, _DEPARTMENTS[i % len(_DEPARTMENTS)])
    gross = 2_400_00 + (i * 7_919) % 3_600_00
    if i % 125 == 61:  # a new hire whose salary starts after this period
        return emp, [(emp[0], _month(period, 1), None, gross)]
    if i % 3 == 0:  # a raise four months ago: the history has two rows
        return emp, [(emp[0], _month(period, -30), _month(period, -5), gross),
                     (emp[0], _month(period, -4), None, gross * 105 // 100)]
    return emp, [(emp[0], _month(period, -30), None, gross)]


@dataclass(frozen=True)
class Payslip:
    employee_id: str
    name: str
    department: str
    period: str
    pay_date: str
    gross_cents: int

    @property
    def deductions(self) -> list[tuple[str, int]]:
        taxable = max(0, self.gross_cents - 1_000_00)
        return [("Income tax (20% above 1,000.00)", taxable * 20 // 100),
                ("Pension (5%)", self.gross_cents * 5 // 100),
                ("Health insurance (3%)", self.gross_cents * 3 // 100)]

    @property
    def net_cents(self) -> int:
        return self.gross_cents - sum(c for _, c in self.deductions)


class EmployeeStore:
    """The HR system the job reads from when it runs. One SQLite connection per thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = LocalDb(self.path, _STORE_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        return self._db.conn()

    def seed(self, employees: int, period: str) -> None:
        """Create employees 1..n and the period (existing rows are kept as they are)."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        for i in range(1, employees + 1):
            emp, salaries = seed_employee(i, period)
            conn.execute("INSERT OR IGNORE INTO employees VALUES (?, ?, ?, ?)", emp)
            conn.executemany("INSERT OR IGNORE INTO salaries VALUES (?, ?, ?, ?)", salaries)
        conn.execute("INSERT OR IGNORE INTO pay_periods VALUES (?, ?, ?, ?)",
                     (period, f"{period}-01", _last_day(period), _last_day(period)))
        conn.execute("COMMIT")

    def roster(self, period: str, limit: int) -> list[tuple[str, str | None, bool]]:
        """(employee id, e-mail, has a salary for the period) of the first ``limit`` employees."""
        rows = self._conn().execute(
            "SELECT e.id, e.email, EXISTS (SELECT 1 FROM salaries s WHERE s.employee_id = e.id"
            "  AND s.valid_from <= :p AND (s.valid_to IS NULL OR s.valid_to >= :p))"
            " FROM employees e ORDER BY e.id LIMIT :n", {"p": period, "n": limit})
        return [(str(i), None if m is None else str(m), bool(s)) for i, m, s in rows]

    def email_of(self, employee_id: str) -> str | None:
        row = self._conn().execute("SELECT email FROM employees WHERE id = ?",
                                   (employee_id,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def payslip(self, employee_id: str, period: str) -> Payslip | None:
        """The current data for one payslip, or None without a salary for the period."""
        row = self._conn().execute(
            "SELECT e.name, e.department, p.pay_date, s.monthly_gross_cents"
            " FROM employees e JOIN pay_periods p ON p.period = :p"
            " JOIN salaries s ON s.employee_id = e.id AND s.valid_from <= :p"
            "  AND (s.valid_to IS NULL OR s.valid_to >= :p)"
            " WHERE e.id = :e ORDER BY s.valid_from DESC LIMIT 1",
            {"p": period, "e": employee_id}).fetchone()
        if row is None:
            return None
        return Payslip(employee_id, str(row[0]), str(row[1]), period, str(row[2]), int(row[3]))

    def recorded_sha(self, doc: str) -> str | None:
        row = self._conn().execute("SELECT sha256 FROM documents WHERE document_id = ?",
                                   (doc,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def renders_started(self, docs: list[tuple[str, int, str, str]]) -> list[int]:
        """For a batch of (document, run, employee, period): allocate each document number
        (once) and count one render call each, in one transaction; the render ids."""
        if not docs:
            return []
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        ids = []
        for doc, run_id, employee_id, period in docs:
            conn.execute("INSERT OR IGNORE INTO documents (document_id, run_id, employee_id,"
                         " period, template_version) VALUES (?, ?, ?, ?, ?)",
                         (doc, run_id, employee_id, period, TEMPLATE_VERSION))
            cur = conn.execute("INSERT INTO renders (document_id, run_id, pid) VALUES (?, ?, ?)",
                               (doc, run_id, os.getpid()))
            ids.append(int(cur.lastrowid or 0))
        conn.execute("COMMIT")
        return ids

    def renders_written(self, done: list[tuple[int, str, str]]) -> None:
        """(render, document, sha256) of the PDFs a batch wrote, in one transaction."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("UPDATE documents SET sha256 = ? WHERE document_id = ?",
                         [(sha, doc) for _, doc, sha in done])
        conn.executemany("UPDATE renders SET written = 1 WHERE id = ?",
                         [(render,) for render, _, _ in done])
        conn.execute("COMMIT")

    def render_counts(self, run_id: int) -> tuple[int, int, int]:
        """(render calls, PDFs written, documents written more than once) for a run."""
        row = self._conn().execute(
            "SELECT count(*), coalesce(sum(written), 0), (SELECT count(*) FROM (SELECT 1 FROM"
            " renders WHERE run_id = :r AND written = 1 GROUP BY document_id HAVING count(*) > 1))"
            " FROM renders WHERE run_id = :r", {"r": run_id}).fetchone()
        return int(row[0]), int(row[1]), int(row[2])

    def documents_of(self, run_id: int) -> int:
        row = self._conn().execute("SELECT count(*) FROM documents WHERE run_id = ?",
                                   (run_id,)).fetchone()
        return int(row[0])

    def close(self) -> None:
        self._db.close()
