"""One round of the campaign: a fresh ledger, real processes under a supervisor, the planned
submissions, operator commands and faults, then recovery and the oracle.

Phases: **chaos** (everything of the plan, on its schedule), **recovery** (no new fault; paused
runs resumed, as the last operator command; workers and the sweeper run until every run that
does not wait for a person is settled, at most a lease + 30 s after the last fault ended),
**stop** (SIGTERM), **judge** (oracle.py, plus ``reconcile --all --dry-run`` and check E).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import oracle
import sink as sinkmod
from backend import Db, Unreachable
from broker import LOOK_EVERY, RQBroker
from faults import inject
from oracle import Violation
from plan import RoundPlan, RunPlan
from processes import Exit, Proc, Spawner, count_errors, judge, round_env, submission_of
from proxy import CommitCutter
from target import Slot

TICK = 0.02
SNAPSHOT_EVERY = 0.5
ARMED_GRACE = 4.0  # seconds an armed failpoint may still fire after the last planned fault
LIVENESS_SLACK = 30.0  # a run settles within the lease and this many seconds of the last fault
# ... plus this long per step of work still left when the last fault ended (an item to run in
# a stage): the slowest plans (chunks of 2, two workers, handlers of up to 0.3 s) move about
# 8 steps a second on two busy cores, so a round left with 400 steps needs about 50 s more
STEP_SECONDS = 0.125
WAL_LIMIT_MIB = 64.0  # the stated bound on a SQLite ledger's WAL (check W); --wal-limit-mib


@dataclass
class RoundResult:
    number: int
    faults: Counter[str]
    armed: int
    items: int
    effects: int
    duplicates: dict[str, int]
    violations: list[Violation]
    recovery: float | None
    errors: Counter[str]
    processes: int
    seconds: float
    folder: Path
    url: str
    waited_for: str = ""  # what recovery was still waiting for, last time it looked
    killed_roles: Counter[str] = field(default_factory=Counter)
    wal_max: int = 0  # the largest SQLite WAL seen, bytes
    hooks_slowed: int = 0  # slow-hook tokens a hook really took


class Round:
    def __init__(self, plan: RoundPlan, backend: Any, workdir: Path, hang_seconds: float,
                 wal_limit_mib: float = WAL_LIMIT_MIB,
                 liveness_slack: float = LIVENESS_SLACK) -> None:
        self.plan, self.backend, self.hang_seconds = plan, backend, hang_seconds
        self.wal_limit = int(wal_limit_mib * 2**20)
        self.liveness_slack = liveness_slack
        self.settle_bound = plan.lease + liveness_slack  # and the work left: _recover
        self.steps_left = 0
        self.wal_max = 0
        self.cuts_counted = 0
        self.refuse_end = 0.0  # monotonic: the downstream refuses until then
        self.folder = workdir / f"round-{plan.number}"
        self.control = self.folder / "control"
        self.control.mkdir(parents=True, exist_ok=True)
        self.sink = self.folder / "sink.db"
        sinkmod.create(str(self.sink))
        self.url = backend.new_round(plan.number)
        # lost acknowledgements: in a round that draws them, the first supervised worker, the
        # sweeper and the submitters reach PostgreSQL through a proxy that can cut a connection
        # right after a COMMIT (the other processes, and the oracle, go direct: the proxy costs
        # a round trip's worth of the campaign's CPU)
        self.proxy = CommitCutter(backend.server.port) \
            if any(f.kind == "lost_ack" for f in plan.faults) else None
        # a round through a broker: the app dispatches as RQ jobs on a queue of the round's own,
        # and the supervised workers are rq workers (broker.py)
        self.broker = RQBroker(plan.seed, plan.number) if plan.broker else None
        env = round_env(self.sink, self.control)
        if self.broker is not None:
            env.update(self.broker.env(plan.lease, plan.chunk, plan.concurrency))
        self.spawner = Spawner(self.url, self.folder, env)
        self.db = Db(self.url)
        self.procs: list[Proc] = []
        self.exits: list[Exit] = []
        self.faults: Counter[str] = Counter()
        self.killed_roles: Counter[str] = Counter()
        self.armed = 0
        self.last_fault_end = 0.0
        self.one_way = oracle.OneWay()
        self.acknowledged: list[dict[str, Any]] = []
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        work = ["worker", "--lease", f"{plan.lease:g}", "--chunk", str(plan.chunk),
                "--concurrency", str(plan.concurrency)]
        self.worker_slots = [Slot("worker", work, proxied=i == 0, broker=plan.broker)
                             for i in range(plan.workers)]
        self.sweeper_slot = Slot("sweeper", ["sweep", "--grace", "1", "--lease",
                                              f"{plan.lease:g}"], proxied=True)
        self.running = True
        self.t0 = time.monotonic()
        self.waiting_for = ""  # what recovery still waits for, as last seen
        self._snapped = self._told = self._looked = 0.0

    # -- what faults.py uses (target.py's Target) --------------------------------------------------

    def live(self, role: str) -> list[Proc]:
        """Processes a fault may target: an armed one is left to die at its failpoint."""
        return [p for p in self.procs if p.role == role and p.alive and not p.stopping
                and not p.failpoint]

    def counted(self, kind: str, end: float, role: str | None = None, count: bool = True) -> None:
        with self._lock:
            if count:
                self.faults[kind] += 1
                if role:
                    self.killed_roles[f"{kind}:{role}"] += 1
            self.last_fault_end = max(self.last_fault_end, end)

    def start_worker(self, failpoint: str | None = None, skew: str | None = None,
                     partitioned: bool = False) -> Proc:
        """A worker besides the supervised ones: one carrying a failpoint, one whose clock
        is off by ``skew`` (faketime's offset, such as ``-7m``), or one in the partition's
        network namespace (``partitioned``), reaching the server only through its veth."""
        if partitioned:
            return self._spawn("worker", self.worker_slots[0].args,
                               url=self.backend.partitioned_url(self.url),
                               inside=self.backend.partition)
        return self._spawn("worker", self.worker_slots[0].args, failpoint, skew=skew)

    def submit(self, run: RunPlan, key: str, variant: int, failpoint: str | None = None) -> None:
        payload = json.dumps(run.payload(variant))
        self._spawn("submitter", ["submit", run.job, "--payload", payload, "--key", key,
                                  "--json"], failpoint, proxied=True, key=key, variant=variant)

    def operate(self, args: list[str], failpoint: str | None = None) -> Proc:
        return self._spawn("operator", [*args, "--note", "chaos"] if args[0] != "reconcile"
                           else args, failpoint)

    def run_id(self, key: str) -> int | None:
        try:
            rows = self.db.rows("SELECT id FROM wl_runs WHERE idempotency_key = %s", (key,))
        except Unreachable:
            return None
        return int(rows[0][0]) if rows else None

    def refuse_for(self, seconds: float) -> None:
        """The downstream refuses for ``seconds`` (the tick ends it)."""
        self.refuse_end = max(self.refuse_end, time.monotonic() + seconds)
        (self.control / "refusing").touch()

    def _spawn(self, role: str, args: list[str], failpoint: str | None = None,
               skew: str | None = None, proxied: bool = False, url: str | None = None,
               inside: Any = None, broker: bool = False, **note: Any) -> Proc:
        if proxied and self.proxy is not None:
            url = self.proxy.url(self.url)
        proc = self.spawner.start(role, args, failpoint, skew, url, inside,
                                  self.broker if broker else None, **note)
        self.procs.append(proc)
        what = " ".join(proc.argv[1:2] + proc.argv[-1:] if proc.broker else args[:4])
        self.log(f"start {proc.name} pid {proc.popen.pid}: {what}"
                 + (f" [failpoint {failpoint}]" if failpoint else "")
                 + (f" [faketime {skew}]" if skew else ""))
        return proc

    def log(self, line: str) -> None:
        """The round's story, in round.log next to its files (kept when a round fails)."""
        at = time.monotonic() - self.t0
        with open(self.folder / "round.log", "a") as f:
            f.write(f"{at:8.3f} {line}\n")

    # -- the round -----------------------------------------------------------------------------

    def run(self) -> RoundResult:
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "workledger.cli", "--db", self.url, "init"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"init failed: {done.stderr.strip()}")
        self.t0 = time.monotonic()
        try:
            self._chaos()
            recovery, stuck = self._recover()
        finally:
            self._stop()
            if self.proxy is not None:
                self.proxy.close()
            if self.broker is not None:
                self.broker.close()
        return self._judge(recovery, stuck, time.monotonic() - began)

    def _chaos(self) -> None:
        plan, t0 = self.plan, self.t0
        queue: list[tuple[float, int, Any]] = sorted(
            [(s.at, 0, s) for s in plan.submissions] + [(f.at, 1, f) for f in plan.faults]
            + [(o.at, 2, o) for o in plan.operations], key=lambda e: (e[0], e[1]))
        index = {id(f): i for i, f in enumerate(plan.faults)}
        postponed: dict[int, float] = {}
        while queue or time.monotonic() - t0 < plan.chaos_seconds:
            now = time.monotonic()
            while queue and queue[0][0] <= now - t0:
                at, kind, what = queue[0]
                if kind == 0:
                    self.submit(plan.runs[what.run], plan.runs[what.run].key, what.variant)
                elif kind == 2:
                    self._operation(what)
                else:
                    outcome = inject(self, what, index[id(what)])
                    first = postponed.setdefault(id(what), now)
                    if outcome == "later" and now - first < 3.0:
                        break  # no target right now: try again on the next tick
                queue.pop(0)
            self._tick()
        self._end_chaos()

    def _end_chaos(self) -> None:
        """No new fault: armed failpoints get a few seconds to fire, then are disarmed;
        stopped processes continue when their stop ends, submitters and operators finish, the
        server is up, paused runs are resumed (the last operator command)."""
        self._wait(lambda: not any(p.failpoint and p.alive for p in self.procs)
                   and not self.sweeper_slot.failpoint, ARMED_GRACE)
        self.sweeper_slot.failpoint = None
        if self.proxy is not None:
            self.proxy.disarm()  # an armed cut that found no COMMIT is not a fault
        for p in self.procs:
            if p.failpoint and p.alive and p.role == "worker":
                p.stopping = True
                p.signal(signal.SIGTERM)
        self._wait(lambda: not any(p.stopped_until for p in self.procs if p.alive)
                   and not self.live("submitter") and not self.live("operator")
                   and not any(t.is_alive() for t in self.threads), 120.0)
        if hasattr(self.backend, "ensure_up"):
            self.backend.ensure_up()
        for (run_id,) in self._rows("SELECT id FROM wl_runs WHERE paused_at IS NOT NULL"
                                    " AND cancelled_at IS NULL"):
            self.operate(["resume", str(run_id)])
        self._wait(lambda: not self.live("operator"), 60.0)

    def _work_left(self) -> int:
        """Steps of work still to do (an item to run in a stage): the plan's runs, all their
        units through every stage of their job, less the items already terminal."""
        planned = sum(r.units * (2 if r.job == "relay" else 1) for r in self.plan.runs)
        done = self._rows("SELECT count(*) FROM wl_items WHERE stage <> '@close'"
                          " AND state IN ('processed', 'failed', 'skipped', 'unknown')")
        return max(0, planned - int(done[0][0] if done else 0))

    def _recover(self) -> tuple[float | None, list[str]]:
        self.steps_left = self._work_left()
        self.settle_bound = self.plan.lease + self.liveness_slack \
            + self.steps_left * STEP_SECONDS
        self.log(f"recovery: {self.steps_left} steps of work left, bound "
                 f"{self.settle_bound:.1f} s after the last fault")
        deadline = self.last_fault_end + self.settle_bound
        stuck: list[str] = ["never checked"]
        checked = 0.0
        while True:
            now = time.monotonic()
            if now - checked >= 0.25:
                checked = now
                try:
                    stuck = oracle.unsettled(self.db)
                except Unreachable as exc:
                    stuck = [f"database unreachable: {exc}"]
                if not stuck:
                    return max(0.0, now - self.last_fault_end), []
                if now - self._told >= 2.0:
                    self._told = now
                    self.waiting_for = "; ".join(stuck[:3])
                    self.log(f"recovering: {'; '.join(stuck[:6])}")
            if now > deadline:
                return None, stuck
            self._tick()

    def _stop(self) -> None:
        self.running = False
        for p in self.procs:
            if p.alive and not p.stopping:  # a second SIGTERM would make a worker exit at once
                p.stopping = True
                p.signal(signal.SIGCONT)
                p.signal(signal.SIGTERM)
        self._wait(lambda: not any(p.alive for p in self.procs), 30.0)
        for p in self.procs:
            if p.alive:
                p.note["lingered"] = True
                p.signal(signal.SIGKILL)
        self._wait(lambda: not any(p.alive for p in self.procs), 30.0)
        for t in self.threads:
            t.join(120)
        self._tick()  # judge the last exits

    # -- the supervisor's tick -------------------------------------------------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        if self.refuse_end and now >= self.refuse_end:
            self.refuse_end = 0.0
            (self.control / "refusing").unlink(missing_ok=True)
        for p in self.procs:
            if p.stopped_until is not None and now >= p.stopped_until:
                p.signal(signal.SIGCONT)
                p.stopped_until = None
            if not p.reaped and p.popen.poll() is not None:
                p.reaped = True
                self._reaped(p, now)
        if self.running:
            for slot in [*self.worker_slots, self.sweeper_slot]:
                self._keep(slot, now)
        if self.proxy is not None and self.proxy.cuts > self.cuts_counted:
            self.cuts_counted += 1
            self.log("lost_ack: a COMMIT went through, its acknowledgement was cut")
            self.counted("lost_ack", now)
        if self.broker is not None and now - self._looked >= LOOK_EVERY:
            self._looked = now
            self.broker.look()  # the bodies a stale copy publishes again
        if now - self._snapped >= SNAPSHOT_EVERY:
            self._snapped = now
            if self.db.sqlite:
                self.wal_max = max(self.wal_max, self.db.wal_bytes())
            try:
                self.one_way.observe(self.db)
            except Unreachable:
                pass
        time.sleep(TICK)

    def _keep(self, slot: Slot, now: float) -> None:
        if slot.proc is not None and slot.proc.reaped:
            clean = slot.role == "sweeper" and slot.proc.popen.returncode == 0
            lived = now - slot.proc.started
            slot.backoff = 0.2 if clean or lived > 2.0 else min(slot.backoff * 2, 1.6)
            slot.start_at, slot.proc = now + slot.backoff, None
        if slot.proc is None and now >= slot.start_at:
            slot.proc = self._spawn(slot.role, slot.args, slot.failpoint, proxied=slot.proxied,
                                    broker=slot.broker)

    def _reaped(self, p: Proc, now: float) -> None:
        ended = judge(p)
        self.exits.append(ended)
        self.log(f"exit {p.name}: rc {ended.rc}" + (" (fired)" if ended.fired else "")
                 + (f" error: {ended.error}" if ended.error else "")
                 + (f" PROBLEM: {ended.problem}" if ended.problem else ""))
        if ended.fired:
            self.counted("failpoint", now, p.role)
            if self.sweeper_slot.failpoint == p.failpoint and p.role == "sweeper":
                self.sweeper_slot.failpoint = None
        if p.note.get("choice") and p.popen.returncode in (1, 2):
            sinkmod.refused(str(self.sink), p.note["choice"])
        if p.role == "submitter":
            found = submission_of(p)
            if found is not None:
                self.acknowledged.append({"key": p.note["key"], "run_id": found.get("run_id"),
                                          "created": found.get("created")})

    def _wait(self, done: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            self._tick()

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self.db.rows(sql, params)
        except Unreachable:
            return []

    # -- the person at the console -------------------------------------------------------------

    def _operation(self, op: Any) -> None:
        run_id = self.run_id(self.plan.runs[op.run].key)
        if run_id is None:
            return  # not submitted yet: nothing to operate on
        if op.command != "resolve":
            choice = None
            if op.command == "retry":  # a person's choice: what it redrives may run again
                choice = sinkmod.choose(str(self.sink), f"{run_id}/*", "retry")
            self.operate([op.command, str(run_id)]).note["choice"] = choice
            return
        doubtful = self._rows(
            "SELECT stage, seq, lease_token FROM wl_items WHERE run_id = %s AND state = 'unknown'"
            " AND error <> %s ORDER BY id", (run_id, oracle.AWAITING_VERIFY))
        if not doubtful:
            return
        stage, seq, token = doubtful[int(op.pick * len(doubtful))]
        # a careful person fences the downstream at the item's token (docs/reliability.md), so
        # that a handler of it still running cannot make its effect later, then looks: done if
        # the effect is there
        sinkmod.fence(str(self.sink), f"{run_id}/{stage}/{seq}", int(token or 0))
        if f"{run_id}/{stage}/{seq}" in sinkmod.effect_keys(str(self.sink)):
            as_state = "processed"
        else:
            as_state = "pending" if op.choice < 0.8 else "failed"
        choice = sinkmod.choose(str(self.sink), f"{run_id}/{stage}/{seq}", "resolve pending") \
            if as_state == "pending" else None
        self.operate(["resolve", str(run_id), "--stage", stage, "--item", str(seq),
                      "--as", as_state]).note["choice"] = choice

    # -- judging -----------------------------------------------------------------------------

    def _judge(self, recovery: float | None, stuck: list[str], seconds: float) -> RoundResult:
        violations = oracle.check_settled(recovery, stuck, self.settle_bound)
        if self.db.sqlite:
            self.wal_max = max(self.wal_max, self.db.wal_bytes())
            violations += oracle.check_wal(self.wal_max, self.wal_limit)
        check = self.spawner.start("oracle", ["reconcile", "--all", "--dry-run", "--json"])
        check.popen.wait(120)
        self.exits.append(judge(check))
        try:
            for entry in json.loads(check.stdout() or "[]"):
                if entry["differences"]:
                    violations.append(Violation("R", f"reconcile --dry-run: run "
                                                     f"{entry['run_id']}: {entry['differences']}"))
        except json.JSONDecodeError:
            violations.append(Violation("E", "reconcile --all --dry-run --json printed no JSON"))
        violations += [Violation("E", f"{e.name} ({e.role}): {e.problem}; "
                                      f"stderr in {self.folder / (e.name + '.err')}")
                       for e in self.exits if e.problem]
        hung = self.faults["hang"] > 0  # a hung handler may hold its worker past SIGTERM
        violations += [Violation("E", f"{p.name} ({p.role}) did not stop within 30 s of SIGTERM")
                       for p in self.procs if p.note.get("lingered")
                       and not (hung and p.role == "worker")]
        self.one_way.observe(self.db)
        facts = oracle.read_facts(self.db)
        view = sinkmod.read(str(self.sink))
        # killed, or gone with the database away before it could record what it had done
        # (a closing hook run again after either is allowed: docs/reliability.md)
        gave_up = {e.name for e in self.exits if e.gave_up_on_the_database}
        died = frozenset(p.popen.pid for p in self.procs
                         if p.popen.returncode in (-signal.SIGKILL, 137) or p.name in gave_up)
        violations += self.one_way.check(facts)
        violations += oracle.check(facts, view, self.plan, self.acknowledged, died)
        self.db.close()
        return RoundResult(self.plan.number, self.faults, self.armed, len(facts.items),
                           view.total_effects, oracle.duplicates(facts, view, died), violations,
                           recovery, count_errors(self.exits), len(self.procs) + 1, seconds,
                           self.folder, self.url, self.waiting_for,
                           self.killed_roles, self.wal_max,
                           len(list(self.control.glob("taken.*.slowhook-*"))))
