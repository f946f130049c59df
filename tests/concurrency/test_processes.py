"""Concurrency as separate OS processes, on both backends (issue 2, "Tests"; docs/reliability.md).

Every worker here is a real process running ``tests/concurrency/procs.py``; handlers append
what they did to an append-only effects sink (a separate SQLite file without unique
constraints), so each test checks what really happened against what the ledger says.
Waiting is always a poll with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import poll
from writes_support import write_of

from workledger.api import differences
from workledger.storage.port import (
    ClaimParams,
    Finish,
    FinishParams,
    ItemRow,
    LeaseParams,
    ReclaimParams,
)

from . import procs

pytestmark = pytest.mark.concurrency

DEADLINE = 60.0  # seconds any single wait may take before the test fails


# -- helpers ------------------------------------------------------------------------------------


def wait_until(cond: Callable[[], Any], what: str, timeout: float = DEADLINE,
               every: float = 0.01) -> Any:
    """:func:`waiting.poll`, finer: some waits here catch a worker in the middle of a chunk."""
    return poll(cond, what, timeout, every)


class Proc:
    """One worker process with its output in files (pipes could fill up and block it)."""

    def __init__(self, argv: list[str], tmp: Path, name: str, env: dict[str, str],
                 cwd: Path | None = None) -> None:
        self.name = name
        self.out = tmp / f"{name}.out"
        self.err = tmp / f"{name}.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=cwd)
        self.pid = self.popen.pid

    def wait(self, timeout: float = DEADLINE) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker {self.name} (pid {self.pid}) still running after {timeout:.0f}s;"
                        f" stderr:\n{self.stderr()}")

    def wait_ok(self, timeout: float = DEADLINE) -> dict[str, Any]:
        rc = self.wait(timeout)
        assert rc == 0, f"worker {self.name} exited {rc}; stderr:\n{self.stderr()}"
        return self.report()

    def report(self) -> dict[str, Any]:
        lines = self.out.read_text().strip().splitlines()
        assert lines, f"worker {self.name} printed no report; stderr:\n{self.stderr()}"
        return dict(json.loads(lines[-1]))

    def stderr(self) -> str:
        return self.err.read_text()[-4000:]

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start worker processes; whatever is still alive at the end is resumed and killed."""
    started: list[Proc] = []

    def start(argv: list[str], name: str | None = None,
              failpoints: str | None = None, cwd: Path | None = None) -> Proc:
        env = {k: v for k, v in os.environ.items() if k != "WORKLEDGER_FAILPOINTS"}
        if failpoints:
            env["WORKLEDGER_FAILPOINTS"] = failpoints
        proc = Proc(argv, tmp_path, name or f"w{len(started)}", env, cwd)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.popen.poll() is None:
            try:
                proc.signal(signal.SIGCONT)
                proc.popen.kill()
            except ProcessLookupError:
                pass
            proc.popen.wait(10)


@pytest.fixture
def sink(tmp_path: Path) -> Path:
    path = tmp_path / "effects.db"
    procs.sink_init(path)
    return path


@pytest.fixture
def make_ledger(db_url: str, sink: Path) -> Iterator[Callable[..., Any]]:
    """The test process's own Ledger (submits and reads), closed at the end."""
    opened: list[Any] = []

    def make(**kwargs: Any) -> Any:
        ledger = procs.build_ledger(db_url, sink, **kwargs)
        opened.append(ledger)
        return ledger

    yield make
    for ledger in opened:
        ledger.close()


def all_items(ledger: Any, run_id: int) -> list[ItemRow]:
    rows: list[ItemRow] = []
    while True:
        page = ledger.items(run_id, limit=1000, after_id=rows[-1].id if rows else 0)
        if not page:
            return rows
        rows.extend(page)


def ikey(item: ItemRow) -> str:
    return f"{item.run_id}/{item.stage}/{item.seq}"


def executions(sink: Path) -> Counter[str]:
    return Counter(e["idempotency_key"] for e in procs.sink_effects(sink))


def start_together(spawn: Callable[..., Proc], tmp_path: Path, n: int,
                   **kwargs: Any) -> list[Proc]:
    """Start ``n`` workers that open the database, then begin claiming at the same moment."""
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(n)]
    workers = [spawn(procs.worker_command(ready_file=ready[i], go_file=go, **kwargs))
               for i in range(n)]

    def all_ready() -> bool:
        for w in workers:
            if w.popen.poll() is not None:
                pytest.fail(f"worker {w.name} died before the start: {w.stderr()}")
        return all(r.exists() for r in ready)

    wait_until(all_ready, f"{n} workers ready")
    go.write_text("go")
    return workers


def assert_each_processed_once(ledger: Any, run_id: int, sink: Path, n: int) -> list[ItemRow]:
    """No crash, so no redo: one execution per item, by the holder whose token completed it."""
    items = all_items(ledger, run_id)
    assert len(items) == n
    effects = procs.sink_effects(sink)
    by_key: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in effects:
        by_key[e["idempotency_key"]].append(e)
    assert set(by_key) == {ikey(i) for i in items}
    twice = {k: [(e["pid"], e["lease_token"]) for e in v] for k, v in by_key.items()
             if len(v) != 1}
    assert not twice, f"items executed more than once: {dict(list(twice.items())[:5])}"

    # a fencing token belongs to one claim, so to one process
    pids_by_token: defaultdict[int, set[int]] = defaultdict(set)
    for e in effects:
        pids_by_token[e["lease_token"]].add(e["pid"])
    shared = {t: p for t, p in pids_by_token.items() if len(p) > 1}
    assert not shared, f"tokens executed by several processes: {shared}"

    for item in items:
        (effect,) = by_key[ikey(item)]
        assert item.state == "processed", item
        assert item.attempts == 1, item
        assert item.lease_token == effect["lease_token"], item
        assert item.result == {"pid": effect["pid"], "token": effect["lease_token"],
                               "attempt": 1}, item
    return items


def assert_counts_reconcile(ledger: Any, run_id: int, n: int) -> None:
    st = ledger.status(run_id)
    rows = all_items(ledger, run_id)
    processed_rows = sum(1 for i in rows if i.state == "processed")
    assert st.total == n == len(rows)
    assert st.processed == processed_rows == n
    assert st.complete and st.state == "completed", st
    run = ledger.store.run_get(run_id)
    assert (run.total, run.processed, run.failed, run.skipped) == (n, n, 0, 0)
    assert run.completed_at is not None


def no_claimed_left(ledger: Any, run_id: int) -> None:
    claimed = ledger.items(run_id, state="claimed", limit=10)
    assert not claimed, f"items left claimed: {claimed}"
    outlook = ledger.store.outlook([run_id])
    assert outlook.leased == 0 and outlook.expired == 0, outlook


def tagged_url(db_url: str, name: str) -> str:
    """``db_url`` with a PostgreSQL ``application_name``, so the test can find its sessions."""
    if db_url.startswith("sqlite"):
        return db_url
    return f"{db_url}{'&' if '?' in db_url else '?'}application_name={name}"


def holds_write_transaction(db_url: str, name: str) -> bool:
    """Is the session(s) tagged ``name`` in the middle of a transaction (SQLite: anyone's)?"""
    if db_url.startswith("sqlite"):
        path = db_url[len("sqlite:///"):]
        conn = sqlite3.connect(path, timeout=0.2, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        sessions = conn.execute(
            "SELECT state FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s", (name,)).fetchall()
    assert sessions, f"no PostgreSQL session is tagged {name!r}"
    return any(state != "idle" for (state,) in sessions)


def lose_holder(db_url: str, name: str) -> None:
    """Make the holder of the sessions tagged ``name`` look gone while its process lives: on
    SQLite remove every holder file (storage/holders.py), on PostgreSQL end its sessions (its
    holder lock with them)."""
    if db_url.startswith("sqlite"):
        folder = Path(db_url[len("sqlite:///"):] + ".holders")
        for path in folder.iterdir():
            path.unlink()
        return
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name = %s AND pid <> pg_backend_pid()", (name,))


def stop_outside_transaction(proc: Proc, db_url: str, name: str) -> None:
    """SIGSTOP ``proc`` at a moment it holds no database transaction (else the others block)."""

    def stopped_cleanly() -> bool:
        proc.signal(signal.SIGSTOP)
        if not holds_write_transaction(db_url, name):
            return True
        proc.signal(signal.SIGCONT)
        return False

    wait_until(stopped_cleanly, "a moment the worker holds no transaction", timeout=20,
               every=0.003)


# -- 1. four claimers ---------------------------------------------------------------------------


def test_four_claimers_never_share_a_live_item(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path, db_url: str,
    tmp_path: Path,
) -> None:
    n = 2000
    ledger = make_ledger()
    run_id = ledger.job(procs.JOB).submit({"n": n}).run_id

    workers = start_together(spawn, tmp_path, 4, url=db_url, sink=sink, concurrency=2,
                             chunk=25, sleep=0.001)
    reports = [w.wait_ok() for w in workers]

    assert_each_processed_once(ledger, run_id, sink, n)
    assert sum(r["processed"] for r in reports) == n
    assert sum(r["claimed"] for r in reports) == n
    assert all(r["stale"] == 0 and r["reclaimed"] == 0 for r in reports), reports
    busy = [r["pid"] for r in reports if r["claimed"]]
    assert len(busy) >= 2, f"the claimers did not overlap: {reports}"
    pids = {e["pid"] for e in procs.sink_effects(sink)}
    assert pids == set(busy)
    kinds = Counter(e.kind for e in ledger.events(run_id))
    assert not kinds.keys() & {"lease_expired", "stale_result", "retry_scheduled"}, kinds
    assert_counts_reconcile(ledger, run_id, n)
    no_claimed_left(ledger, run_id)


# -- 2. kill -9 mid-chunk -----------------------------------------------------------------------


def test_killed_worker_leases_expire_and_another_finishes_idempotent_stage_once(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path, db_url: str,
) -> None:
    n = 300
    ledger = make_ledger()
    run_id = ledger.job(procs.JOB).submit({"n": n}).run_id

    first = spawn(procs.worker_command(db_url, sink, concurrency=2, chunk=25, lease=1.5,
                                       sleep=0.01), name="first")

    def mid_chunk() -> bool:
        """Some effects exist, and some item with an effect is still claimed (not recorded)."""
        if first.popen.poll() is not None:
            pytest.fail(f"first worker ended early: {first.stderr()}")
        done = executions(sink)
        if sum(done.values()) < 40:
            return False
        return any(ikey(i) in done for i in ledger.items(run_id, state="claimed", limit=100))

    wait_until(mid_chunk, "the first worker to be mid-chunk with effects not yet recorded")
    first.signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL

    at_kill = all_items(ledger, run_id)
    held = {i.id for i in at_kill if i.state == "claimed"}
    assert held, "the killed worker held no chunk"
    unrecorded = {ikey(i) for i in at_kill if i.state == "claimed"} & set(executions(sink))
    assert unrecorded, "no effect was left unrecorded by the kill"

    second = spawn(procs.worker_command(db_url, sink, concurrency=2, chunk=25, lease=1.5),
                   name="second")
    report = second.wait_ok()
    assert report["reclaimed"] >= len(held)

    items = all_items(ledger, run_id)
    assert len(items) == n
    assert all(i.state == "processed" for i in items), Counter(i.state for i in items)
    no_claimed_left(ledger, run_id)
    assert_counts_reconcile(ledger, run_id, n)

    # D: one deduplicated effect per item, though some items really ran twice
    dedup = procs.sink_dedup(sink)
    assert sorted(d["idempotency_key"] for d in dedup) == sorted(ikey(i) for i in items)
    raw = executions(sink)
    assert set(raw) == {ikey(i) for i in items}
    assert sum(raw.values()) >= n
    rerun = {k for k, c in raw.items() if c > 1}
    assert rerun, "nothing was re-run after the kill"
    assert unrecorded <= rerun
    assert all(c <= 2 for c in raw.values()), raw.most_common(3)

    # every re-run item went through a recorded lease expiry, and only held items did
    expired = {e.item_id for e in ledger.events(run_id) if e.kind == "lease_expired"}
    by_key = {ikey(i): i for i in items}
    assert {by_key[k].id for k in rerun} <= expired
    assert expired == held
    for item in items:
        assert 1 <= item.attempts <= raw[ikey(item)], item


def test_kill_leaves_unknown_only_what_was_running_in_a_stage_that_is_not_idempotent(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path, db_url: str,
) -> None:
    """Outcomes of a stage that is not idempotent are written as soon as each is known, not
    once per chunk: a kill -9 leaves `unknown` only the handlers that were running."""
    n, concurrency = 400, 4
    ledger = make_ledger(idempotent=False)
    run_id = ledger.job(procs.JOB).submit({"n": n}).run_id
    worker = spawn(procs.worker_command(db_url, sink, concurrency=concurrency, chunk=100,
                                        lease=1.0, sleep=0.02, idempotent=False), name="w")
    wait_until(lambda: sum(executions(sink).values()) >= 120 or worker.popen.poll() is not None,
               "120 effects")
    worker.signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    started = executions(sink)

    sweeper = make_ledger(idempotent=False)

    def settled() -> bool:
        sweeper.sweep(grace=0)  # the dead worker's expired leases become unknown
        return not sweeper.items(run_id, state="claimed", limit=1)

    wait_until(settled, "the dead worker's leases to expire and be settled", every=0.2)
    items = all_items(ledger, run_id)
    unknown = {ikey(i) for i in items if i.state == "unknown"}
    processed = {ikey(i) for i in items if i.state == "processed"}
    # every unknown item had started (a handler may die before its effect): at most the
    # handlers running at the kill, and those whose outcome was being written, are unknown
    assert all(i.started_at is not None for i in items if i.state == "unknown")
    assert 0 < len(unknown) <= 2 * concurrency, len(unknown)
    # nothing with an effect went back to pending, and nothing ran twice
    assert set(started) <= unknown | processed
    assert max(started.values()) == 1
    assert not differences(ledger.reconcile(run_id, dry_run=True))


# -- 3. a stale worker's late results change nothing --------------------------------------------


def test_stale_worker_cannot_finish_after_reclaim(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path, db_url: str,
) -> None:
    n = 6
    ledger = make_ledger()
    run_id = ledger.job(procs.JOB).submit({"n": n}).run_id

    stale = spawn(procs.worker_command(tagged_url(db_url, "wl-stale-worker"), sink,
                                       concurrency=n, chunk=n, lease=1.5, block=3.0),
                  name="stale")

    def all_started() -> bool:
        if stale.popen.poll() is not None:
            pytest.fail(f"stale worker ended early: {stale.stderr()}")
        return sum(executions(sink).values()) == n

    wait_until(all_started, "the first worker to be running every item of its chunk")
    stop_outside_transaction(stale, db_url, "wl-stale-worker")
    # a stopped worker that is alive keeps its items: this one is made to look gone while it
    # lives (its holder's file removed, its sessions cut), the zombie that fencing is for
    lose_holder(db_url, "wl-stale-worker")
    held = all_items(ledger, run_id)
    assert all(i.state == "claimed" for i in held)
    (token_a,) = {i.lease_token for i in held}

    fresh = spawn(procs.worker_command(db_url, sink, concurrency=2, chunk=n, lease=1.5),
                  name="fresh")
    fresh_report = fresh.wait_ok()
    assert fresh_report["processed"] == n
    assert stale.popen.poll() is None, "the stopped worker is gone"

    after_fresh = all_items(ledger, run_id)
    for item in after_fresh:
        assert item.state == "processed", item
        assert item.result["pid"] == fresh.pid, item
        assert item.lease_token != token_a

    stale.signal(signal.SIGCONT)
    stale_report = stale.wait_ok()
    assert stale_report["stale"] == n, stale_report
    assert stale_report["processed"] == 0, stale_report

    assert all_items(ledger, run_id) == after_fresh  # nothing changed, not even updated_at
    events = ledger.events(run_id)
    stale_events = [e for e in events if e.kind == "stale_result"]
    assert sorted(e.item_id for e in stale_events) == sorted(i.id for i in held)
    assert all(e.lease_token == token_a for e in stale_events), stale_events
    assert all(str(stale.pid) in (e.actor or "") for e in stale_events), stale_events
    assert {e.item_id for e in events if e.kind == "lease_expired"} == {i.id for i in held}
    raw = procs.sink_effects(sink)
    assert Counter(e["pid"] for e in raw) == {stale.pid: n, fresh.pid: n}
    assert_counts_reconcile(ledger, run_id, n)


def test_stale_token_is_fenced_at_the_store_port(make_ledger: Callable[..., Any]) -> None:
    """The same race in one process, step by step through the store port."""
    ledger = make_ledger()
    run_id = ledger.job(procs.JOB).submit({"n": 3}).run_id
    store = ledger.store

    a = store.items_claim(ClaimParams(run_id, 10, 0.2, actor="A"))
    assert len(a) == 3
    token_a = a[0].lease_token
    ids = [i.id for i in a]
    assert store.items_mark_started(LeaseParams(run_id, ids, token_a)) == ids
    wait_until(lambda: store.outlook([run_id]).expired == 3, "A's leases to expire", timeout=10)
    reclaimed = store.leases_reclaim_expired(ReclaimParams(
        job=procs.JOB, stage=procs.STAGE, to_state="pending", reason="lease_expired: test",
        actor="sweeper"))
    assert sorted(r.id for r in reclaimed) == ids

    b = store.items_claim(ClaimParams(run_id, 10, 30.0, actor="B"))
    assert [i.id for i in b] == ids
    token_b = b[0].lease_token
    assert token_b != token_a
    done_b = store.items_finish_if_leased(FinishParams(run_id, [
        Finish(i.id, token_b, write_of("processed"), result='"B"') for i in b],
        actor="B"))
    assert done_b.applied == ids and done_b.stale == []
    before = all_items(ledger, run_id)

    # A wakes up: every write with its token is a no-op
    assert store.items_heartbeat(LeaseParams(run_id, ids, token_a, 30.0)) == 0
    assert store.items_release(LeaseParams(run_id, ids, token_a)) == 0
    assert store.items_mark_started(LeaseParams(run_id, ids, token_a)) == []
    late = store.items_finish_if_leased(FinishParams(run_id, [
        Finish(i.id, token_a, write_of("failed"), error="late") for i in a], actor="A"))
    assert late.applied == [] and sorted(late.stale) == ids

    after = all_items(ledger, run_id)
    assert after == before
    assert all(i.state == "processed" and i.result == "B" and i.lease_token == token_b
               for i in after)
    stale_events = [e for e in ledger.events(run_id) if e.kind == "stale_result"]
    assert sorted(e.item_id for e in stale_events) == ids
    assert all(e.lease_token == token_a and e.actor == "A" for e in stale_events)
    run = store.run_get(run_id)
    assert (run.processed, run.failed) == (3, 0)
    st = ledger.status(run_id)
    assert st.processed == 3 and st.failed == 0 and st.complete


# -- 4. the article's reproduction --------------------------------------------------------------


@pytest.mark.parametrize("crash", ["failpoint", "handler_exit"])
def test_article_reproduction_four_children_crash_after_two(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path, db_url: str,
    tmp_path: Path, crash: str,
) -> None:
    """Four children; the worker dies once two are terminal; resuming runs exactly the other two."""
    ledger = make_ledger()
    run_id = ledger.job(procs.JOB).submit({"n": 4}).run_id

    common: dict[str, Any] = {"concurrency": 1, "chunk": 1, "lease": 1.0}
    if crash == "failpoint":
        # the 2nd completion commits, then the process dies
        first = spawn(procs.worker_command(db_url, sink, **common), name="first",
                      failpoints="complete.after_commit:2:exit")
    else:
        # the handler kills its process as it reaches the 3rd child, before any effect
        first = spawn(procs.worker_command(db_url, sink, crash_once_key="k2",
                                           crash_marker=tmp_path / "crashed", **common),
                      name="first")
    assert first.wait() == 137, first.stderr()

    st = ledger.status(run_id)
    assert st.total == 4 and st.processed == 2 and not st.complete, st
    items = all_items(ledger, run_id)
    assert [i.state for i in items[:2]] == ["processed", "processed"]
    assert all(i.state in ("pending", "claimed") for i in items[2:]), items
    assert sorted(e["seq"] for e in procs.sink_effects(sink)) == [0, 1]

    resumed = spawn(procs.worker_command(db_url, sink, **common), name="resumed")
    report = resumed.wait_ok()
    assert report["processed"] == 2, report

    effects = procs.sink_effects(sink)
    assert sorted((e["seq"], e["pid"]) for e in effects) == [
        (0, first.pid), (1, first.pid), (2, resumed.pid), (3, resumed.pid)]
    items = all_items(ledger, run_id)
    assert [i.state for i in items] == ["processed"] * 4
    assert [i.result["pid"] for i in items] == [first.pid, first.pid, resumed.pid, resumed.pid]
    assert all(i.attempts == 1 for i in items), items
    assert_counts_reconcile(ledger, run_id, 4)
    no_claimed_left(ledger, run_id)


# -- 5. a poison item ---------------------------------------------------------------------------


def test_poison_item_does_not_charge_its_siblings(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path, db_url: str,
) -> None:
    n, max_attempts, poison = 30, 3, "k14"  # the poison sits mid-chunk in the 2nd chunk of 10
    ledger = make_ledger(max_attempts=max_attempts)
    run_id = ledger.job(procs.JOB).submit({"n": n}).run_id

    exits: list[int] = []
    for round_no in range(max_attempts + 4):
        worker = spawn(procs.worker_command(db_url, sink, concurrency=1, chunk=10, lease=1.0,
                                            poison_key=poison, max_attempts=max_attempts),
                       name=f"round{round_no}")
        exits.append(worker.wait())
        assert exits[-1] in (0, 137), worker.stderr()
        if ledger.status(run_id).complete:
            break
    st = ledger.status(run_id)
    assert st.complete, f"run did not settle after {len(exits)} workers (exits {exits}): {st}"
    assert exits[-1] == 0 and all(rc == 137 for rc in exits[:-1]), exits

    items = {i.key: i for i in all_items(ledger, run_id)}
    bad = items.pop(poison)
    assert bad.state == "failed", bad
    assert "attempts" in (bad.error or "") and "lost" in (bad.error or ""), bad.error
    assert bad.attempts == max_attempts, bad

    raw = executions(sink)
    poison_runs = raw[ikey(bad)]
    # every charged attempt ran, plus at most the first (pooled) run, whose charge is written
    # with its completion and so died with the process
    assert max_attempts <= poison_runs <= max_attempts + 1, poison_runs

    siblings_charged = {k: (i.state, i.attempts) for k, i in items.items()
                        if i.state != "processed" or i.attempts != 1}
    assert not siblings_charged, f"siblings charged for the poison: {siblings_charged}"
    assert st.processed == n - 1 and st.failed == 1 and st.total == n, st
    assert st.state == "failed", st  # tolerate=0: one failed unit is over tolerance
    run = ledger.store.run_get(run_id)
    assert (run.processed, run.failed) == (n - 1, 1)
    no_claimed_left(ledger, run_id)


# -- 6. more claimers than cores ----------------------------------------------------------------


def test_many_claimers_more_processes_than_cores(
    make_ledger: Callable[..., Any], spawn: Callable[..., Proc], sink: Path, db_url: str,
    tmp_path: Path,
) -> None:
    n, workers_n = 1000, 6
    ledger = make_ledger()
    run_id = ledger.job(procs.JOB).submit({"n": n}).run_id

    workers = start_together(spawn, tmp_path, workers_n, url=db_url, sink=sink, concurrency=2,
                             chunk=10)
    reports = [w.wait_ok() for w in workers]

    assert_each_processed_once(ledger, run_id, sink, n)
    assert sum(r["processed"] for r in reports) == n
    assert len([r for r in reports if r["claimed"]]) >= 2, reports
    assert_counts_reconcile(ledger, run_id, n)
    no_claimed_left(ledger, run_id)
