"""Hostile input through the real CLI, on SQLite and PostgreSQL side by side (issue 11).

Every case of ``CASES`` runs as a subprocess against a ledger of each backend (one shared
ledger per backend for the module, with a few runs in it) and must give, on both: the same
exit code and the same message (the database's own name aside), exit 2 for bad input, one
``error:`` line on stderr for a failure, no "unexpected", no traceback, no password in stdout
or stderr, nothing half-written when it fails, and afterwards a ledger whose counters reconcile
and (SQLite) whose file passes ``PRAGMA integrity_check``. The tests after the corpus pin what
one command line cannot: terminal escapes, the deepest payload, rows nobody can decode, one
bad run in a sweep, listings cut short, and where ``--app`` and ``--db`` are looked for.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from test_cli import cli_cmd, cli_env

from workledger import Ledger
from workledger.api import differences, limits

pytestmark = pytest.mark.integration

APP = "hostile_app:ledger"
SECRET = "S3CRET"
BIG = 9223372036854775808  # 2**63: one past what either database stores
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"


def deep(levels: int) -> str:
    """A JSON object nesting ``levels`` levels (the object itself is the first)."""
    return '{"deep": ' + "[" * (levels - 1) + "1" + "]" * (levels - 1) + "}"


def payload(value: Any) -> str:
    return json.dumps(value)


# -- the ledgers -------------------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    url: str  # the ledger the cases run against
    missing: str  # a database that holds no ledger
    cwd: Path
    shown: list[str] = field(default_factory=list)  # how messages name this database

    def cli(self, *args: str, db: str | None = None, app: str | None = APP,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        top = ["--db", self.url if db is None else db] + (["--app", app] if app else [])
        return subprocess.run(cli_cmd(*top, *args), cwd=self.cwd, env=env or cli_env(),
                              capture_output=True, text=True, errors="backslashreplace",
                              timeout=300)


def _setup(backend: Backend) -> Backend:
    """Four runs: 1 processed one item and failed one, 2 pending, 3 and 4 the numbers
    PostgreSQL rewrites (with a key and with the payload's hash for one)."""
    steps = [
        ("init",),
        ("submit", "echo", "--key", "base", "--payload", payload(
            {"items": [{"key": "a"}, {"key": "b", "data": {"fail": "no"}}]})),
        ("worker", "--until-idle", "--job", "echo"),
        ("submit", "echo", "--key", "cancel-me", "--payload", payload({"items": [{"key": "c"}]})),
        ("submit", "echo", "--key", "numbers", "--payload", NUMBERS),
        ("submit", "echo", "--payload", NUMBERS),
    ]
    for step in steps:
        done = backend.cli(*step)
        assert done.returncode == 0, (step, done.stderr)
    (backend.cwd / "big.json").write_text(payload({"blob": "x" * (limits.DOCUMENT_BYTES + 1)}))
    (backend.cwd / "a-file").write_text("not a folder")
    return backend


NUMBERS = '{"n": 1, "v": 1e20, "w": -0.0, "x": 1e16, "y": 1.5e300, "z": 1e-7}'


@pytest.fixture(scope="module")
def sqlite_backend(tmp_path_factory: pytest.TempPathFactory) -> Backend:
    cwd = tmp_path_factory.mktemp("hostile-sqlite")
    url = f"sqlite:///{cwd / 'ledger.db'}"
    return _setup(Backend("sqlite", url, f"sqlite:///{cwd / 'missing.db'}", cwd, [url]))


def _schema_url(database: str, schema: str) -> str:
    return f"{database}?options={quote(f'-csearch_path={schema}')}"


@pytest.fixture(scope="module")
def pg_backend(pg_database: str, tmp_path_factory: pytest.TempPathFactory) -> Backend:
    import psycopg

    schema, empty = f"h_{uuid.uuid4().hex[:10]}", f"e_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE SCHEMA "{empty}"')
    url = _schema_url(pg_database, schema)
    cwd = tmp_path_factory.mktemp("hostile-postgres")
    return _setup(Backend("postgres", url, _schema_url(pg_database, empty), cwd, [url]))


@pytest.fixture(scope="module")
def backends(sqlite_backend: Backend, pg_backend: Backend) -> dict[str, Backend]:
    return {"sqlite": sqlite_backend, "postgres": pg_backend}


def row_counts(url: str) -> tuple[int, ...]:
    """Rows in each ledger table (0s when the database holds no ledger)."""
    tables = ("wl_runs", "wl_items", "wl_events", "wl_stage_counts")
    sql = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in tables)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not Path(path).exists():
            return (0,) * len(tables)
        with closing(sqlite3.connect(path)) as conn:
            return tuple(conn.execute(sql).fetchone())
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('wl_runs')").fetchone() == (None,):
            return (0,) * len(tables)
        row = conn.execute(sql).fetchone()
        assert row is not None
        return tuple(row)


def assert_sound(url: str) -> None:
    """Every run's counters agree with its items; SQLite's file is intact."""
    with Ledger(url, create=False) as ledger:
        for run_id in ledger.run_ids(limits.LIST_MAX):
            assert differences(ledger.reconcile(run_id, dry_run=True)) == {}, run_id
    if url.startswith("sqlite:///"):
        with closing(sqlite3.connect(url[len("sqlite:///"):])) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


# -- the corpus --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    code: int
    says: str  # in the one error line (a failure) or in stdout (a success)
    db: Callable[[Backend], str] | None = None  # another --db than the backend's ledger
    app: str | None = APP
    only: str | None = None  # the one backend the case means (its --db names it)
    secret: tuple[str, ...] = (SECRET,)  # must appear in no output, not even in pieces


def on(*args: Any) -> tuple[str, ...]:
    return tuple(str(a) for a in args)


def pg_with_password(b: Backend) -> str:
    return f"{b.url}&password={SECRET}"


CASES: dict[str, Case] = {
    # 11.1: the same payload twice is the same run on both, though PostgreSQL rewrites numbers
    "same numbers, same key": Case(on("submit", "echo", "--key", "numbers", "--payload", NUMBERS),
                                   0, "already exists"),
    "same numbers, no key": Case(on("submit", "echo", "--payload", NUMBERS), 0, "already exists"),
    # 11.2 and 11.8: nesting, huge numbers, NaN, size
    "payload 65 levels deep": Case(on("submit", "echo", "--payload", deep(65)), 2,
                                   "nested deeper than 64 levels"),
    "payload 975 levels deep": Case(on("submit", "echo", "--payload", deep(975)), 2,
                                    "nested deeper than 64 levels"),
    "payload 5000 levels deep": Case(on("submit", "echo", "--payload", deep(5000)), 2,
                                     "nested deeper than 64 levels"),
    "integer of 5000 digits": Case(on("submit", "echo", "--payload", '{"n": ' + "7" * 5000 + "}"),
                                   2, "4300 digits"),
    "NaN": Case(on("submit", "echo", "--payload", '{"x": NaN}'), 2, "not JSON-serialisable"),
    "infinity": Case(on("submit", "echo", "--payload", '{"x": 1e400}'), 2,
                     "not JSON-serialisable"),
    "payload over 16 MiB": Case(on("submit", "echo", "--payload-file", "big.json"), 2,
                                "the limit is 16,777,216 bytes"),
    # 11.9: a backslash before u0000 is text; a real NUL is refused
    "backslash u0000 is text": Case(on("submit", "echo", "--key", "path", "--payload",
                                       '{"path": "C:\\\\u0000dir"}'), 0, "created"),
    # 11.5: keys and names, the same limits on both
    "key of 1001 bytes": Case(on("submit", "echo", "--key", "k" * 1001), 2,
                              "key is 1,001 bytes; the limit is 1,000 bytes"),
    "key of 1001 bytes in 501 characters": Case(on("submit", "echo", "--key", "é" * 501), 2,
                                                "the limit is 1,000 bytes"),
    "key with a byte that is not UTF-8": Case(on("submit", "echo", "--key", "k\udcff"), 2,
                                              "not valid Unicode"),
    "stage name of 4000 bytes": Case(on("submit", "long"), 2,
                                     "stage name is 4,000 bytes; the limit is 200 bytes",
                                     app="hostile_app:long_stage"),
    "job name of 300 bytes": Case(on("worker", "--until-idle"), 2,
                                  "job name is 300 bytes", app="hostile_app:long_job"),
    "stage name starting with @": Case(on("sweep"), 2, "reserved",
                                       app="hostile_app:reserved_stage"),
    "stage filter of 4000 bytes": Case(on("items", 1, "--stage", "s" * 4000), 2,
                                       "stage name is 4,000 bytes"),
    "stage filter not UTF-8": Case(on("items", 1, "--stage", "\udcff"), 2, "not valid Unicode"),
    "history stage not UTF-8": Case(on("history", 1, "--stage", "\udcff", "--item", 0), 2,
                                    "not valid Unicode"),
    "retry stage of 300 bytes": Case(on("retry", 1, "--stage", "s" * 300), 2,
                                     "stage name is 300 bytes"),
    "note not UTF-8 is kept visibly": Case(on("cancel", 2, "--note", "why \udcff"), 0,
                                           "cancelled"),
    # 11.3 and 11.8: listings and numbers past what the databases hold
    "runs limit past 64 bits": Case(on("runs", "--limit", BIG), 2, "1<=x<=100000"),
    "runs limit over the cap": Case(on("runs", "--limit", limits.LIST_MAX + 1), 2,
                                    "1<=x<=100000"),
    "items limit over the cap": Case(on("items", 1, "--limit", 10_000_000), 2, "1<=x<=100000"),
    "items after past 64 bits": Case(on("items", 1, "--after", BIG), 2,
                                     "0<=x<=9223372036854775807"),
    "runs before past 64 bits": Case(on("runs", "--before", BIG), 2, "0<=x<=9223372036854775807"),
    "status of a run past 64 bits": Case(on("status", BIG), 2, "0<=x<=9223372036854775807"),
    "history item past 64 bits": Case(on("history", 1, "--stage", "apply", "--item", BIG), 2,
                                      "0<=x<=9223372036854775807"),
    "retry run past 64 bits": Case(on("retry", BIG), 2, "0<=x<=9223372036854775807"),
    "chunk past 64 bits": Case(on("worker", "--chunk", 10**20), 2, "1<=x<=10000"),
    "audit since a time past year 9999 in UTC": Case(
        on("audit", "--since", "9999-12-31T23:59:59-23:59"), 2, "years 1 to 9999"),
    "audit since a time before year 1 in UTC": Case(
        on("audit", "--since", "0001-01-01T00:00:00+01:00"), 2, "years 1 to 9999"),
    "lease NaN": Case(on("worker", "--lease", "nan"), 2, "not more than 0 to 86,400 seconds"),
    "lease infinite": Case(on("worker", "--lease", "inf"), 2, "86,400 seconds"),
    "lease of 1e300 seconds": Case(on("worker", "--lease", "1e300"), 2, "86,400 seconds"),
    "grace NaN": Case(on("sweep", "--grace", "nan"), 2, "seconds"),
    "demo lease NaN": Case(on("demo", "events", "--lease", "nan"), 2, "seconds"),
    # 11.4: no password in any output
    "init with ?password=": Case(on("init"), 0, "up to date", db=pg_with_password,
                                 only="postgres"),
    "no run, with ?password=": Case(on("status", 99999), 2, "no run 99999",
                                    db=pg_with_password, only="postgres"),
    "worker start line with ?password=": Case(on("worker", "--until-idle", "--job", "idle"), 0,
                                              "idle, done", db=pg_with_password,
                                              only="postgres"),
    "mistyped scheme": Case(on("status", 1), 2, "unknown database URL",
                            db=lambda b: f"postgressql://u:{SECRET}@h/db"),
    "scheme without a colon": Case(on("status", 1), 2, "unknown database URL",
                                   db=lambda b: f"postgresql//u:{SECRET}@h/db"),
    "key=value string": Case(on("status", 1), 2, "unknown database URL",
                             db=lambda b: f"host=h password={SECRET} dbname=x"),
    "unknown scheme with a password": Case(on("init"), 2, "unknown database URL",
                                           db=lambda b: f"mysql://u:{SECRET}@h/db"),
    "password with a raw @": Case(on("status", 1), 1, "cannot connect", secret=("S3", "CRET"),
                                  db=lambda b: "postgresql://u:S3@CRET@127.0.0.1:1/db"),
    "password with a raw /": Case(on("status", 1), 1, "cannot connect", secret=("S3", "CRET"),
                                  db=lambda b: "postgresql://u:S3/CRET@127.0.0.1:1/db"),
    "SQLite path with ?password=": Case(on("status", 1), 2, "no ledger at",
                                        db=lambda b: f"sqlite:///x.db?password={SECRET}"),
    # issue 10 item 8: a command that only reads creates nothing
    **{f"no ledger: {' '.join(args)}": Case(args, 2, "no ledger at <db>: check --db, or run "
                                                     "`workledger init`", db=lambda b: b.missing)
       for args in [on("status", 1), on("runs"), on("items", 1), on("audit"),
                    on("history", 1, "--stage", "apply", "--item", 0), on("reconcile", 1),
                    on("reconcile", "--all", "--dry-run"), on("retry", 1), on("pause", 1),
                    on("resume", 1), on("cancel", 1), on("sweep"),
                    on("resolve", 1, "--stage", "apply", "--item", 0, "--as", "pending")]},
    "SQLite path is a folder": Case(on("status", 1), 2, "it is a folder",
                                    db=lambda b: f"sqlite:///{b.cwd}", only="sqlite"),
    "SQLite folder missing": Case(on("init"), 2, "no folder",
                                  db=lambda b: f"sqlite:///{b.cwd}/nope/x.db", only="sqlite"),
    # 11.7 and issue 10: --app
    "app given as a path": Case(on("submit", "echo"), 2,
                                "give a module name, e.g. hostile_app:ledger",
                                app="./hostile_app.py:ledger"),
    "app given as a file name": Case(on("submit", "echo"), 2, "e.g. hostile_app:ledger",
                                     app="hostile_app.py:ledger"),
    "a reader needs the app it is given: it names the ledger": Case(
        on("status", 1), 1, "cannot load app 'no_such_module:ledger'", app="no_such_module:ledger"),
    # 11.8 and 11.10: the payroll demo's output folder
    "demo out where nothing can be made": Case(on("demo", "payroll", "--out", "/proc/nonexist"),
                                               2, "cannot use --out"),
    "demo out naming a file": Case(on("demo", "payroll", "--out", "a-file"), 2, "is a file"),
    # `--out /` is the same rule as this case; it is not run, since a regression would
    # scatter payslips over the file system
    "demo out in a folder of other things": Case(on("demo", "payroll", "--out", "."), 2,
                                                 "holds no payroll demo"),
}


def run_case(backend: Backend, case: Case) -> tuple[int, str]:
    """Run ``case`` on one backend, check what must hold on any backend, and return its exit
    code and its message with this backend's database named ``<db>``."""
    db = case.db(backend) if case.db else None
    before = row_counts(backend.url)
    done = backend.cli(*case.args, db=db, app=case.app)
    out, err = done.stdout, done.stderr
    for text in (out, err):
        assert not any(secret in text for secret in case.secret), text
        assert "Traceback" not in text and "unexpected" not in text, text
    assert done.returncode == case.code, (out, err)
    if case.code == 0:
        message = out
    else:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        message = lines[0]
        assert row_counts(backend.url) == before  # nothing half-written
    for where in (backend.url, db or backend.url, backend.missing):
        message = message.replace(where, "<db>")
    message = message.replace(str(backend.cwd), "<cwd>")
    assert case.says in message, message
    assert_sound(backend.url)
    if db == backend.missing:
        assert holds_nothing(db)
    return done.returncode, message


def holds_nothing(url: str) -> bool:
    """No SQLite file, or a PostgreSQL schema without a single table."""
    if url.startswith("sqlite:///"):
        return not Path(url[len("sqlite:///"):]).exists()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
                           ).fetchone()
        return row == (0,)


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input_gets_the_same_answer_on_both_backends(
    name: str, backends: dict[str, Backend]
) -> None:
    case = CASES[name]
    answers = {b.name: run_case(b, case) for b in backends.values()
               if case.only in (None, b.name)}
    if len(answers) == 2 and case.code != 0:
        assert answers["sqlite"] == answers["postgres"]


# -- beyond one command line -------------------------------------------------------------------


@pytest.fixture
def one(db_url: str, tmp_path: Path) -> Backend:
    """A fresh ledger of one backend (``db_url`` runs each test on both), not yet created."""
    return Backend("each", db_url, "", tmp_path, [db_url])


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "unexpected" not in done.stderr
    return done.stdout


def test_control_characters_reach_no_terminal_and_json_stays_exact(one: Backend) -> None:
    key = f"run{ESCAPES}"
    units = [{"key": f"item{ESCAPES}", "data": {"fail": f"why{ESCAPES}"}}]
    ok(one.cli("submit", "echo", "--key", key, "--payload", payload({"items": units})))
    ok(one.cli("worker", "--until-idle", "--job", "echo"))
    wide = cli_env(COLUMNS="400")  # tables wide enough to show the keys whole
    human = [one.cli(*args, env=wide) for args in [
        ("submit", "echo", "--key", key, "--payload", payload({"items": units})), ("status", "1"),
        ("runs",), ("items", "1"), ("history", "1", "--stage", "apply", "--item", "0"),
        ("audit",)]]
    for done in human:
        assert done.returncode in (0, 1), done.stderr  # audit: a failed item needs a person
        for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert raw not in done.stdout + done.stderr, done.args
    assert all("\\x1b" in done.stdout for done in human)  # shown, as an escape
    assert json.loads(ok(one.cli("status", "1", "--json")))["key"] == key
    [item] = json.loads(ok(one.cli("items", "1", "--json")))
    assert (item["key"], item["error"]) == (f"item{ESCAPES}", f"why{ESCAPES}")


def test_a_run_holding_the_deepest_accepted_payload_leaves_every_command_working(
    one: Backend,
) -> None:
    top = {"deep": limits.DEPTH, "nest": json.loads(deep(limits.DEPTH - 1))}  # 64 levels
    text = payload(top)
    sub = json.loads(ok(one.cli("submit", "echo", "--key", "deep", "--payload", text, "--json")))
    assert sub["created"] and sub["total"] == 1
    item = json.loads(ok(one.cli("items", "1", "--json")))[0]
    assert json.dumps(item["data"]).count("[") == limits.DEPTH  # the data nests 64 levels
    ok(one.cli("worker", "--until-idle", "--job", "echo"))
    commands = [("submit", "echo", "--key", "deep", "--payload", text), ("status", "1"),
                ("status", "1", "--json"), ("runs",), ("runs", "--json"), ("items", "1"),
                ("history", "1", "--stage", "apply", "--item", "0"),
                ("history", "1", "--stage", "apply", "--item", "0", "--json"), ("audit",),
                ("audit", "--json"), ("reconcile", "--all", "--dry-run"), ("reconcile", "1"),
                ("sweep", "--grace", "0"), ("retry", "1"), ("worker", "--until-idle")]
    for args in commands:
        ok(one.cli(*args))
    for args in [("pause", "1"), ("resume", "1"), ("cancel", "1")]:  # the run is finished
        refused = one.cli(*args)
        assert refused.returncode == 2 and "a finished run is not" in refused.stderr
    [done] = json.loads(ok(one.cli("items", "1", "--json")))
    assert done["state"] == "processed" and done["result"] == item["data"]
    deeper = json.loads(ok(one.cli("submit", "echo", "--key", "deeper", "--payload",
                                   payload({"deep": limits.DEPTH + 1}), "--json")))
    # the payload is shallow; the one unit's data is not: that unit is skipped, with why
    [skipped] = json.loads(ok(one.cli("items", str(deeper["run_id"]), "--json")))
    assert skipped["state"] == "skipped" and "nested deeper than 64" in skipped["error"]


def raw_execute(url: str, *statements: str, deep_json: str) -> None:
    """Write ``deep_json`` where the statements put ``{deep}``, as another program could."""
    if url.startswith("sqlite:///"):
        with closing(sqlite3.connect(url[len("sqlite:///"):], isolation_level=None)) as conn:
            for sql in statements:
                conn.execute(sql.replace("{deep}", "?"), (deep_json,) * sql.count("{deep}"))
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql.replace("{deep}", "%s::jsonb"),  # type: ignore[arg-type]
                         (deep_json,) * sql.count("{deep}"))


def test_rows_too_deep_to_decode_are_reported_and_every_reader_goes_on(one: Backend) -> None:
    ok(one.cli("submit", "echo", "--key", "a", "--payload", payload({"items": [{"key": "x"}]})))
    ok(one.cli("worker", "--until-idle", "--job", "echo"))
    ok(one.cli("submit", "echo", "--key", "b", "--payload", payload({"items": [{"key": "y"}]})))
    ok(one.cli("submit", "echo", "--key", "c", "--payload", payload({"items": [{"key": "z"}]})))
    too_deep = "[" * 1500 + "1" + "]" * 1500  # written by an older version or another tool
    raw_execute(one.url, "UPDATE wl_runs SET payload = {deep}",
                "UPDATE wl_items SET result = {deep} WHERE run_id = 1",
                "UPDATE wl_items SET data = {deep}", "UPDATE wl_events SET detail = {deep}",
                "UPDATE wl_runs SET decomposed_at = NULL WHERE id = 3", deep_json=too_deep)
    marker = "<undecodable JSON: nested deeper than 64 levels>"
    items = json.loads(ok(one.cli("items", "1", "--json")))
    assert (items[0]["data"], items[0]["result"]) == (marker, marker)
    assert "<undecodable JSON" in ok(one.cli("items", "1"))
    story = json.loads(ok(one.cli("history", "1", "--stage", "apply", "--item", "0", "--json")))
    assert story["item"]["result"] == marker
    for args in [("status", "1"), ("runs", "--json"), ("runs",), ("audit",),
                 ("reconcile", "--all", "--dry-run"), ("submit", "echo", "--key", "a")]:
        done = one.cli(*args)
        assert "Traceback" not in done.stderr and "unexpected" not in done.stderr, done.stderr
    assert "different payload" in one.cli("submit", "echo", "--key", "a").stderr
    ok(one.cli("worker", "--until-idle", "--job", "echo"))  # run 2's item: data unreadable
    [y] = json.loads(ok(one.cli("items", "2", "--json")))
    assert y["state"] == "failed" and "cannot be read back" in y["error"]
    ok(one.cli("sweep", "--grace", "0"))  # run 3: its payload cannot be read
    st = json.loads(ok(one.cli("status", "3", "--json")))
    assert st["state"] == "failed" and "retained payload cannot be read" in st["error"]


def test_one_run_failing_in_a_sweep_does_not_stop_the_pass_for_the_others(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workledger import Item, failpoints

    closed: list[int] = []
    ledger = Ledger(db_url)
    job = ledger.job("closing")
    job.decompose(lambda p: (Item(key=f"k{i}") for i in range(p["n"])))
    job.stage("apply", idempotent=True)(lambda item, ctx: None)
    job.on_complete(lambda status: closed.append(status.run_id))
    monkeypatch.setattr(failpoints, "_hits", {})
    monkeypatch.setenv("WORKLEDGER_FAILPOINTS", "submit.after_commit:*:raise")
    for key, n in (("bad", 1), ("good", 0)):  # two runs accepted, never decomposed
        with pytest.raises(failpoints.FailpointHit):
            ledger.submit("closing", {"n": n}, key=key)
    # the first batch written in the pass (run 1's) fails past its commit, as a storage
    # error or a bug would; run 2 is still decomposed, and closed, in the same pass
    monkeypatch.setenv("WORKLEDGER_FAILPOINTS", "decompose.after_batch:1:raise")
    report = ledger.sweep(grace=0)
    assert (report.decomposition_errors, report.redecomposed, report.closed) == (1, 1, 1)
    assert closed == [2]
    bad = ledger.status(1)
    assert bad.state == "accepted" and "FailpointHit" in (bad.error or "")
    assert [e.kind for e in ledger.events(1)][-1] == "sweep_failed"
    monkeypatch.delenv("WORKLEDGER_FAILPOINTS")
    assert ledger.sweep(grace=0).redecomposed == 1  # the next pass takes it up again
    assert ledger.status(1).state == "running"
    ledger.close()


def test_a_verify_answer_that_cannot_be_stored_leaves_the_item_for_a_person(
    db_url: str,
) -> None:
    from workledger import Item
    from workledger.storage.port import ClaimParams, LeaseParams

    ledger = Ledger(db_url)
    job = ledger.job("verified")
    job.decompose(lambda p: iter([Item(key="a"), Item(key="b")]))
    job.stage("send", verify=lambda item, ctx: ("done", {"x": float("nan")}
                                                  if item.key == "a" else None))(
        lambda item, ctx: None)
    ledger.submit("verified", {}, key="v")
    claimed = ledger.store.items_claim(ClaimParams(1, 10, 0.0))
    ledger.store.items_mark_started(LeaseParams(1, [c.id for c in claimed],
                                                claimed[0].lease_token))
    report = ledger.sweep()
    assert (report.to_unknown, report.verified) == (2, 2)
    a, b = ledger.items(1)
    assert a.state == "unknown" and "cannot be stored" in (a.error or "")
    assert b.state == "processed"
    ledger.close()


def test_listings_cut_short_say_how_many_more_and_stream_every_row(one: Backend) -> None:
    units = [{"key": f"u{i}"} for i in range(1200)]
    ok(one.cli("submit", "echo", "--key", "many", "--payload", payload({"items": units})))
    ok(one.cli("submit", "echo", "--key", "two"))
    ok(one.cli("submit", "echo", "--key", "three"))
    listed = ok(one.cli("items", "1")).splitlines()
    with Ledger(one.url) as ledger:
        every = ledger.items(1, limit=2000)
    assert listed[-1] == f"... 1,100 more (use --after {every[99].id} / --limit)"
    rest = ok(one.cli("items", "1", "--after", str(every[1100].id)))
    assert "more" not in rest and "u1199" in rest
    streamed = json.loads(ok(one.cli("items", "1", "--limit", "100000", "--json")))
    assert [i["key"] for i in streamed] == [f"u{i}" for i in range(1200)]
    assert ok(one.cli("runs", "--limit", "2")).splitlines()[-1] == \
        "... 1 more (use --before 2 / --limit)"
    assert [r["run_id"] for r in json.loads(ok(one.cli("runs", "--before", "2", "--json")))] \
        == [1]


def test_readers_refuse_an_app_that_does_not_load_rather_than_guess_the_ledger(
    one: Backend,
) -> None:
    """Issue 24: the app names the ledger, so a command given an app that does not load says
    so (exit 1) for readers too, instead of reading some other ledger; without --app they read
    the --db alone."""
    ok(one.cli("submit", "echo", "--key", "a", "--payload", payload({"items": [{"key": "x"}]})))
    ok(one.cli("worker", "--until-idle", "--job", "echo"))
    before = row_counts(one.url)
    broken = "broken_app:ledger"  # raises when imported
    for args in [("status", "1"), ("runs",), ("items", "1"), ("reconcile", "--all"),
                 ("history", "1", "--stage", "apply", "--item", "0"), ("retry", "1"),
                 ("pause", "1"), ("resume", "1"),
                 ("resolve", "1", "--stage", "apply", "--item", "0", "--as", "pending"),
                 ("resolve", "1", "--stage", "apply", "--item", "0", "--as", "processed")]:
        refused = one.cli(*args, app=broken)
        assert refused.returncode == 1 and "cannot load app" in refused.stderr, args
    assert row_counts(one.url) == before
    for args in [("status", "1"), ("runs",), ("items", "1"), ("reconcile", "--all")]:
        ok(one.cli(*args, app=None))


def test_a_module_in_the_current_folder_cannot_stand_in_for_a_library(one: Backend) -> None:
    for name in ("sqlite3", "psycopg"):
        (one.cwd / f"{name}.py").write_text(
            f"open({str(one.cwd / ('shadowed-' + name))!r}, 'w').close()\n"
            "raise SystemExit('imported the wrong module')\n")
    (one.cwd / "myjobs.py").write_text("from hostile_app import ledger\n")
    script = str(Path(sys.executable).parent / "workledger")  # how users run it
    done = subprocess.run([script, "--db", one.url, "--app", "myjobs:ledger", "submit", "echo"],
                          cwd=one.cwd, env=cli_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr  # the app in the current folder still loads
    assert not list(one.cwd.glob("shadowed-*"))


def test_sqlite_paths_expand_a_home_folder_and_are_percent_decoded(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    home.mkdir()
    env = cli_env(HOME=str(home))
    b = Backend("sqlite", "", "", work)
    ok(b.cli("init", db="sqlite:///~/in-home.db", app=None, env=env))
    assert (home / "in-home.db").exists() and not (work / "~").exists()
    ok(b.cli("init", db="sqlite:///sub/%2e%2e/up.db", app=None, env=env))
    assert (work / "up.db").exists()
    missing = b.cli("status", "1", db="sqlite:///~/none.db", app=None, env=env)
    assert missing.returncode == 2 and "no ledger at sqlite:///~/none.db" in missing.stderr
    assert not (home / "none.db").exists()
