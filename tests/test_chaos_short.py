"""The short tier of the fault campaign (chaos/campaign.py, chaos/README.md): about 60 faults
per backend, from a fixed seed, on real processes, every round drawing each fault kind issue 21
added at least once; every round checked by the oracle of docs/reliability.md. Also: the oracle
itself fails on a ledger that breaks the promise, and on fabricated histories with each
violation the strict checks are there for, so a clean campaign means something."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.concurrency

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ROOT / "chaos" / "campaign.py"
SEED = int(os.environ.get("WORKLEDGER_CHAOS_SEED", "20261201"))
sys.path.insert(0, str(CAMPAIGN.parent))
try:
    import netns
    import oracle
    import plan as chaos_plan
    import processes as chaos_processes
    from sink import Choice, Effect, Refusal, SinkView
finally:
    sys.path.remove(str(CAMPAIGN.parent))


def faketime_or_skip() -> None:
    """The skew fault needs Debian's faketime; .ci/run installs it, so CI requires it."""
    if shutil.which("faketime") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("faketime is not installed: .ci/run installs it (apt-get install "
                        "faketime); the campaign's skew fault needs it")
        pytest.skip("faketime is not installed (apt-get install faketime)")


def broker_or_skip() -> bool:
    """The broker rounds need rq and the real Redis: required in CI; elsewhere the tier runs
    without them (and says so)."""
    sys.path.insert(0, str(CAMPAIGN.parent))
    try:
        import broker as chaos_broker
    finally:
        sys.path.remove(str(CAMPAIGN.parent))
    if (why := chaos_broker.why_not()) is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no round can go through a broker: {why}")
        print(f"the short tier runs without broker rounds: {why}")
        return False
    return True


def partition_or_skip() -> None:
    """The partition fault needs network namespaces (root, iproute2): required in CI, whose
    machine is like this one; elsewhere the PostgreSQL tier runs without the kind."""
    if (why := netns.why_not()) is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no network partition can be made: {why}")
        pytest.skip(f"no network partition can be made here: {why}")


def campaign(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CAMPAIGN), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sixty_faults_break_no_promise(backend: str, tmp_path: Path) -> None:
    if backend == "postgres":
        pytest.importorskip("psycopg")
        partition_or_skip()
    if backend == "sqlite":
        faketime_or_skip()
    broker = broker_or_skip()
    done = campaign("--backend", backend, "--kills", "60", "--faults-per-round", "15",
                    "--each-kind", "--seed", str(SEED), "--json",
                    *([] if broker else ["--no-broker"]),
                    "--workdir", str(tmp_path), timeout=900)
    assert done.stdout.splitlines(), done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["violations"] == [], done.stdout[-6000:]
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary["seed"] == SEED and summary["kills"] >= 60
    assert summary["faults"].get("kill", 0) > 0 and summary["items"] > 0
    assert summary["effects"] > 0 and summary["recovery_p99"] is not None
    drawn = chaos_plan.kinds_for(backend, True, broker=broker)
    wanted = [k for k in chaos_plan.NEW_KINDS if k in drawn]
    assert {k for k in wanted if not summary["faults"].get(k)} == set(), summary["faults"]
    if not broker:
        assert not set(chaos_plan.BROKER_KINDS) & set(summary["faults"]), summary["faults"]
    assert summary["hooks_slowed"] > 0, "no closing or verify hook outlived its lease"
    if backend == "sqlite":
        assert 0 < summary["wal_max_mib"] <= summary["wal_limit_mib"]


def test_the_oracle_finds_a_ledger_that_broke_the_promise(tmp_path: Path) -> None:
    """One round, then the ledger is damaged behind the campaign's back the ways a bug would:
    a processed item back to pending, a counter off by one, an effect that ran twice."""
    sys.path.insert(0, str(CAMPAIGN.parent))
    try:
        import sink
        from backend import Db, SqliteBackend
        from plan import kinds_for, plan_round
        from rounds import Round
    finally:
        sys.path.remove(str(CAMPAIGN.parent))

    plan = plan_round(SEED, 1, kinds_for("sqlite", False), faults=4)
    result = Round(plan, SqliteBackend(tmp_path), tmp_path, 1.0).run()
    assert result.violations == [], result.violations
    db_path = tmp_path / "round-1" / "ledger.db"
    with sqlite3.connect(db_path) as conn:
        item_id, run_id, stage, seq = conn.execute(
            "SELECT id, run_id, stage, seq FROM wl_items WHERE state = 'processed'"
            " AND stage IN ('deliver', 'charge') AND id NOT IN (SELECT item_id FROM wl_events"
            " WHERE kind IN ('unknown', 'verified', 'resolved') AND item_id IS NOT NULL)"
            " ORDER BY id LIMIT 1").fetchone()
        conn.execute("UPDATE wl_items SET state = 'pending' WHERE id = ?", (item_id,))
        conn.execute("UPDATE wl_runs SET failed = failed + 1 WHERE id = ?", (run_id,))
    view_path = str(tmp_path / "round-1" / "sink.db")
    sink.Sink(view_path).effect(f"{run_id}/{stage}/{seq}", 0, 0)
    db = Db(f"sqlite:///{db_path}")
    facts = oracle.read_facts(db)
    found = {v.check for v in oracle.check(facts, sink.read(view_path), plan, [])}
    assert {"L", "D", "R"} <= found, found
    assert oracle.unsettled(db), "a pending item in an open run is not settled"
    db.close()


# -- the strict checks, on fabricated histories ---------------------------------------------------

RELAY = {"id": 1, "job": "relay", "key": "r1-0", "payload": {"units": 1, "skip_every": 0},
         "decomposed": True, "cancelled": False, "paused": False, "complete": True,
         "error": None, "total": 1, "processed": 1, "failed": 0, "skipped": 0}


def facts_of(*items: tuple[Any, ...], events: dict[int, Counter[str]] | None = None,
             ) -> oracle.Facts:
    return oracle.Facts({1: RELAY}, list(items), events or {}, {})


def sink_of(history: dict[str, list[Effect]], choices: tuple[Choice, ...] = ()) -> SinkView:
    effects = Counter({k: len(v) for k, v in history.items()})
    return SinkView(Counter(effects), effects, frozenset(history), history, list(choices))


DELIVER = (7, 1, "deliver", 0, "processed", None)
TWICE = {"1/deliver/0": [Effect(3, 100), Effect(9, 200)]}


def test_an_effect_run_twice_is_a_violation_whatever_states_the_item_went_through() -> None:
    """The item went through unknown and was verified (what the old oracle excused), but no
    person chose to run it again: a verify hook asked while the first handler still ran."""
    facts = facts_of(DELIVER, events={7: Counter(unknown=1, verified=1, lease_expired=1)})
    found = oracle.check_duplicates(facts, sink_of(TWICE))
    assert [v.check for v in found] == ["D"], found
    assert "no person chose it" in found[0].what
    assert oracle.duplicates(facts, sink_of(TWICE)) == {"unexplained": 1}


def test_an_effect_run_again_after_a_person_chose_pending_or_retry_is_not() -> None:
    facts = facts_of(DELIVER)
    for choice in (Choice("1/deliver/0", "resolve pending", 3), Choice("1/*", "retry", 5)):
        assert oracle.check_duplicates(facts, sink_of(TWICE, (choice,))) == [], choice
        assert oracle.duplicates(facts, sink_of(TWICE, (choice,))) == {"chosen": 1}


def test_a_choice_made_before_the_first_effect_does_not_allow_a_second() -> None:
    """resolve --as pending while the first handler still ran: its late effect and the rerun's
    are two, and the person never chose the second."""
    facts = facts_of(DELIVER)
    for choice in (Choice("1/deliver/0", "resolve pending", 2),  # before effect 3
                   Choice("1/deliver/1", "resolve pending", 5),  # another item
                   Choice("2/*", "retry", 5)):  # another run
        found = oracle.check_duplicates(facts, sink_of(TWICE, (choice,)))
        assert [v.check for v in found] == ["D"], (choice, found)


def test_a_closing_hook_run_twice_for_one_completion_is_a_violation() -> None:
    close = (8, 1, "@close", 0, "processed", None)
    twice = {"1/@close/0": [Effect(4, 100), Effect(6, 200)]}
    found = oracle.check_duplicates(facts_of(close), sink_of(twice))
    assert [v.check for v in found] == ["D"] and "closing hook" in found[0].what, found
    # its process died after the effect (closing.after_hook): the hook is run again, by design
    assert oracle.check_duplicates(facts_of(close), sink_of(twice), frozenset({100})) == []
    # a person retried the run's failed @close entry: a second completion of the closing entry
    assert oracle.check_duplicates(facts_of(close), sink_of(twice, (Choice("1/*", "retry", 4),))) \
        == []
    # the idempotent stage may repeat as it likes
    prepare = (9, 1, "prepare", 0, "processed", None)
    assert oracle.check_duplicates(
        facts_of(prepare), sink_of({"1/prepare/0": [Effect(1, 1), Effect(2, 2)]})) == []


def test_an_effect_fenced_out_downstream_is_a_violation_unless_a_session_was_ended_meanwhile(
) -> None:
    """A refused (fenced) effect means an item was verified or resolved while its handler
    still ran: allowed only where the campaign ended sessions during that handler (a paused
    PostgreSQL holder looks dead then); on SQLite, which has no such fault, always a violation."""
    late = Refusal("1/deliver/0", 7, 300, started=100.0, at=104.0)
    view = SinkView(Counter(), Counter(), frozenset(), refusals=[late])
    found = oracle.check_fenced(view)
    assert [v.check for v in found] == ["D"] and "fenced out" in found[0].what, found
    for cut in ((102.0, 102.0), (99.0, 100.5), (103.9, 106.0)):  # during the handler
        assert oracle.check_fenced(SinkView(Counter(), Counter(), frozenset(), refusals=[late],
                                            cuts=[cut])) == [], cut
    for cut in ((90.0, 99.0), (104.5, 104.5)):  # before it started, after its refusal
        assert len(oracle.check_fenced(SinkView(Counter(), Counter(), frozenset(),
                                                refusals=[late], cuts=[cut]))) == 1, cut


def test_a_run_not_settled_within_the_stated_bound_is_a_violation() -> None:
    assert oracle.check_settled(31.9, [], 32.0) == []
    late = oracle.check_settled(None, ["run 2: 1 @close claimed"], 32.0)
    assert [v.check for v in late] == ["V"] and "run 2: 1 @close claimed" in late[0].what
    assert [v.check for v in oracle.check_settled(40.0, [], 32.0)] == ["V"]


def test_a_wal_over_the_stated_bound_is_a_violation() -> None:
    limit = 64 * 2**20
    assert oracle.check_wal(limit, limit) == []
    over = oracle.check_wal(limit + 1, limit)
    assert [v.check for v in over] == ["W"] and "64 MiB" in over[0].what


def test_every_new_kind_is_drawn_when_each_kind_is_asked_for() -> None:
    """The even rounds go through a broker and draw its kinds too; the odd ones draw none."""
    broker = set(chaos_plan.BROKER_KINDS)
    for backend in ("sqlite", "postgres"):
        kinds = chaos_plan.kinds_for(backend, True)
        for number in range(1, 6):
            planned = chaos_plan.plan_round(SEED, number, kinds, 15, 2.0, chaos_plan.NEW_KINDS)
            drawn = {f.kind for f in planned.faults}
            wanted = {k for k in chaos_plan.NEW_KINDS if k in kinds}
            if number % 2:
                wanted -= broker
                assert not drawn & broker and not planned.broker, (backend, number, drawn)
            assert wanted <= drawn, (backend, drawn)
            assert planned.broker == (number % 2 == 0)
    assert not set(chaos_plan.kinds_for("sqlite", True, broker=False)) & broker
    assert "skew" not in chaos_plan.kinds_for("postgres", True)
    assert "lost_ack" not in chaos_plan.kinds_for("sqlite", True)
    assert "partition" not in chaos_plan.kinds_for("sqlite", True)
    assert "partition" not in chaos_plan.kinds_for("postgres", True, partition=False)


def test_a_refused_choice_allows_nothing(tmp_path: Path) -> None:
    """The sink records a choice before its command starts; a command that was refused (exit 1
    with one line: the item was no longer unknown) changed nothing, so allows no second effect."""
    sys.path.insert(0, str(CAMPAIGN.parent))
    try:
        import sink
    finally:
        sys.path.remove(str(CAMPAIGN.parent))
    path = str(tmp_path / "sink.db")
    sink.create(path)
    writer = sink.Sink(path)
    writer.effect("1/deliver/0", 1, 1)
    kept = sink.choose(path, "1/deliver/0", "resolve pending")
    writer.effect("1/deliver/0", 2, 1)
    assert oracle.check_duplicates(facts_of(DELIVER), sink.read(path)) == []
    sink.refused(path, kept)
    found = oracle.check_duplicates(facts_of(DELIVER), sink.read(path))
    assert [v.check for v in found] == ["D"], found


def test_the_sink_refuses_an_effect_fenced_out_and_records_it(tmp_path: Path) -> None:
    sys.path.insert(0, str(CAMPAIGN.parent))
    try:
        import sink
    finally:
        sys.path.remove(str(CAMPAIGN.parent))
    path = str(tmp_path / "sink.db")
    sink.create(path)
    s = sink.Sink(path)
    s.start("1/deliver/0", 7, 1)
    s.fence("1/deliver/0", 7)  # the verify hook, asked about the claim of token 7
    with pytest.raises(sink.Fenced):
        s.effect("1/deliver/0", 7, 1)  # the paused handler of that claim, resumed
    s.effect("1/deliver/0", 9, 2)  # the rerun's later claim
    view = sink.read(path)
    assert view.effects == Counter({"1/deliver/0": 1})
    assert [(r.key, r.token) for r in view.refusals] == [("1/deliver/0", 7)]
    assert view.refusals[0].started > 0


def test_a_third_of_the_rounds_go_through_a_broker_and_only_they_draw_its_faults() -> None:
    kinds = chaos_plan.kinds_for("postgres", True)
    plans = [chaos_plan.plan_round(SEED, n, kinds) for n in range(1, 301)]
    through = [p for p in plans if p.broker]
    assert 0.25 < len(through) / len(plans) < 0.42, len(through)
    for p in plans:
        drawn = {f.kind for f in p.faults} & set(chaos_plan.BROKER_KINDS)
        assert bool(drawn) == p.broker, (p.number, drawn)
    modes = {f.mode for p in through for f in p.faults if f.kind == "broker_dup"}
    assert modes == set(chaos_plan.DUP_MODES)
    assert all(f.duration > 2 * p.lease for p in through for f in p.faults
               if f.kind == "broker_delay"), "a delay shorter than the redispatch wait"


RQ_LOG = """17:01:02 Worker w-1: started with PID 10, version 3.0.0
17:01:03 Worker w-1: q: workledger.contrib.rq.deliver({{'v': 1}}) (abc)
17:01:04 Worker w-1: job abc: exception raised while executing (workledger.contrib.rq.deliver)
Traceback (most recent call last):
  File "/x/psycopg/connection.py", line 1, in connect
    raise last_ex.with_traceback(None)
psycopg.OperationalError: consuming input failed: server closed the connection unexpectedly
	This probably means the server terminated abnormally
	before or while processing the request.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/workledger/storage/postgres.py", line 155, in _check_reachable
    with psycopg.connect(self._conninfo, autocommit=True):
psycopg.OperationalError: connection failed: FATAL:  the database system is starting up
DETAIL:  Consistent recovery state has not been yet reached.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/rq/worker/base.py", line 1671, in perform_job
    return_value = job.perform()
                   ^^^^^^^^^^^^^
{raised}

17:01:04 Worker w-1: q: Job OK (abd)
"""


def _rq_worker_exit(tmp_path: Path, log: str) -> Any:
    err = tmp_path / "rq-worker-1.err"
    err.write_text(log)
    popen = subprocess.Popen([sys.executable, "-c", "pass"])
    popen.wait()
    proc = chaos_processes.Proc("worker", "rq-worker-1", [], popen, tmp_path / "o", err,
                                broker=True)
    return chaos_processes.judge(proc)


def test_check_e_allows_an_rq_job_that_raised_only_for_the_database_being_away(
        tmp_path: Path) -> None:
    """RQ logs a job that raised, with its traceback, and goes on: a broker task that lost its
    database past the retry layer's patience is how a broker worker lives through an outage;
    any other exception is a bug, and so is a traceback with no exception line."""
    away = "workledger.errors.DatabaseUnavailable: the database cannot be reached: refused"
    assert _rq_worker_exit(tmp_path, RQ_LOG.format(raised=away)).problem is None
    assert _rq_worker_exit(tmp_path, "17:01:02 Worker w-1: Job OK (a)\n").problem is None
    bug = _rq_worker_exit(tmp_path, RQ_LOG.format(raised="KeyError: 'lease_token'"))
    assert bug.problem is not None and "KeyError: 'lease_token'" in bug.problem
    cut = _rq_worker_exit(tmp_path, "Traceback (most recent call last):\n")
    assert cut.problem == "a traceback on stderr"


def test_a_process_that_gave_up_on_the_database_counts_as_dead_for_check_d() -> None:
    """A one-shot ``sweep`` ran a closing hook, then the server restarted and it could not
    write the outcome within its patience (PostgreSQL seed 1412 round 23): to the ledger that
    is a dead process, whose hook the next sweeper runs again. Any other exit 1 is not."""
    def ended(rc: int, error: str | None) -> Any:
        return chaos_processes.Exit("sweeper", "sweeper-5", rc, False, error, None, 5.0)

    away = ("no connection to PostgreSQL at 127.0.0.1:39181 within 3 s (the server is down, "
            "restarting or out of connections)")
    assert ended(1, away).gave_up_on_the_database
    assert ended(1, "cannot connect to PostgreSQL at 127.0.0.1:1: connection refused"
                 ).gave_up_on_the_database
    assert not ended(1, "run 3 is completed: nothing changed").gave_up_on_the_database
    assert not ended(0, None).gave_up_on_the_database
    assert not ended(2, away).gave_up_on_the_database
