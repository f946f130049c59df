"""A round's plan: every random choice of the campaign, drawn up front from ``(seed, round)``.

The plan is a pure function of the seed, the round number and the fault kinds on offer, so a
round replays exactly (``--seed S --round R``): the same runs, submissions with the same keys,
the same operator commands and the same faults at the same offsets. What the real processes
do between two planned moments is up to the operating system and is not replayed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# fault kinds and their weights in the draw (kinds a backend cannot have are left out)
WEIGHTS = {"kill": 30, "failpoint": 22, "stop": 14, "refuse": 8, "pg_terminate": 12,
           "pg_restart": 6, "hang": 8, "slow_hook": 8, "skew": 6, "reader": 6, "lost_ack": 8,
           "partition": 6, "broker_dup": 10, "broker_delay": 8}
POSTGRES_ONLY = ("pg_terminate", "pg_restart", "lost_ack", "partition")
SQLITE_ONLY = ("skew",)  # PostgreSQL's leases are the server's clock: a worker's clock is not used
# the kinds issue 21 added: the short tier requires each of them at least once per backend
NEW_KINDS = ("hang", "stop", "slow_hook", "skew", "reader", "lost_ack", "partition",
             "broker_dup", "broker_delay")
# a round through a broker (broker.py: RQ on the real Redis) draws these; one round in three
# goes through one (with --each-kind: the even rounds), the others keep the ledger's own workers
BROKER_KINDS = ("broker_dup", "broker_delay")
BROKER_SHARE = 1 / 3
DUP_MODES = ("queued", "running", "stale")
SKEW_MINUTES = (2, 15)  # a worker's clock off by this many minutes, either way
# a partition's length past the lease, in seconds: most are short (the worker's sessions live
# on and it keeps its items); one in five outlasts the server's keepalive on the worker's
# holder session (about 25 s, src/workledger/storage/postgres.py), so that session is ended and
# the worker looks dead while its handlers may still run (docs/reliability.md, Clocks)
PARTITION_SHORT, PARTITION_LONG = (1.0, 4.0), (32.0, 40.0)

# named failpoints by the kind of process that passes them (src/workledger/failpoints.py)
FAILPOINTS = {
    "worker": ("claim.after_commit", "complete.before_commit", "handoff.before_commit",
               "complete.after_commit", "reclaim.before_commit", "reclaim.after_commit",
               "closing.after_hook"),
    "submitter": ("submit.after_commit", "decompose.after_batch", "decompose.before_mark",
                  "decompose.after_mark"),
    "sweeper": ("reclaim.before_commit", "reclaim.after_commit", "closing.after_hook",
                "reclaim.before_commit", "reclaim.after_commit", "closing.after_hook",
                "decompose.after_batch", "decompose.before_mark", "decompose.after_mark"),
}
# reconcile.before_commit is passed only when reconcile repairs something, which a healthy
# ledger never needs: tests/recovery/test_crash_at_failpoints.py crashes there instead
KILL_ROLES = {"worker": 55, "sweeper": 12, "submitter": 15, "operator": 18}
OPERATIONS = {"pause": 14, "resume": 20, "cancel": 4, "retry": 24, "resolve": 22,
              "reconcile": 16}


@dataclass(frozen=True)
class RunPlan:
    key: str
    job: str
    units: int
    skip_every: int

    def payload(self, variant: int = 0) -> dict[str, int]:
        """``variant`` 1 is another payload under the same key (the ledger must refuse it)."""
        return {"units": self.units + variant, "skip_every": self.skip_every}


@dataclass(frozen=True)
class Submission:
    at: float
    run: int  # index into RoundPlan.runs
    variant: int = 0


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    role: str = "worker"
    point: str = ""  # a failpoint's name
    nth: int = 1  # which hit of the failpoint kills
    duration: float = 0.0  # stop, refuse, pg_restart, slow_hook, reader: how long it lasts
    mode: str = ""  # pg_restart: fast|immediate; pg_terminate: one|all; slow_hook: close|verify;
    # skew: faketime's offset, "-7m" or "+3m"; partition: short|long;
    # broker_dup: queued|running|stale
    pick: float = 0.0  # chooses among the live processes of the role at that moment


@dataclass(frozen=True)
class Operation:
    at: float
    command: str
    run: int
    pick: float = 0.0  # chooses the item a resolve settles
    choice: float = 0.0  # resolve: how the person decides when the sink shows no effect


@dataclass(frozen=True)
class RoundPlan:
    seed: int
    number: int
    lease: float
    workers: int
    chunk: int
    concurrency: int
    runs: list[RunPlan]
    submissions: list[Submission]
    faults: list[Fault]
    operations: list[Operation]
    chaos_seconds: float
    kinds: tuple[str, ...] = field(default=())

    @property
    def broker(self) -> bool:
        """Whether the round runs through a broker (a broker fault was drawn)."""
        return any(f.kind in BROKER_KINDS for f in self.faults)


def kinds_for(backend: str, hang: bool, skew: bool = True, partition: bool = True,
              broker: bool = True) -> tuple[str, ...]:
    """The kinds a backend can have; ``hang`` needs stage time limits, ``skew`` faketime,
    ``partition`` network namespaces (root and iproute2), ``broker`` rq and a Redis."""
    return tuple(k for k in WEIGHTS
                 if (backend == "postgres" or k not in POSTGRES_ONLY)
                 and (backend == "sqlite" or k not in SQLITE_ONLY)
                 and (hang or k != "hang") and (skew or k != "skew")
                 and (partition or k != "partition") and (broker or k not in BROKER_KINDS))


def _pick(rng: random.Random, weights: dict[str, int]) -> str:
    names = list(weights)
    return rng.choices(names, [weights[n] for n in names])[0]


def _fault(rng: random.Random, at: float, kind: str, lease: float) -> Fault:
    if kind == "kill":
        return Fault(at, kind, role=_pick(rng, KILL_ROLES), pick=rng.random())
    if kind == "failpoint":
        role = rng.choices(["worker", "submitter", "sweeper"], [55, 25, 20])[0]
        point = rng.choice(FAILPOINTS[role])
        nth = 1 if point.startswith(("reclaim", "closing", "submit")) or role == "sweeper" \
            else rng.randint(1, 3)
        return Fault(at, kind, role=role, point=point, nth=nth)
    if kind == "stop":
        role = "worker" if rng.random() < 0.85 else "sweeper"
        return Fault(at, kind, role=role, duration=lease + rng.uniform(0.3, 2.0),
                     pick=rng.random())
    if kind == "refuse":
        return Fault(at, kind, role="downstream", duration=rng.uniform(0.5, 3.0))
    if kind == "pg_terminate":
        return Fault(at, kind, role="postgres", mode=rng.choice(["one", "all"]),
                     pick=rng.random())
    if kind == "pg_restart":
        return Fault(at, kind, role="postgres", mode=rng.choice(["fast", "immediate"]),
                     duration=rng.uniform(0.1, 2.0))
    if kind == "slow_hook":  # a closing or verify hook that outlives the lease
        return Fault(at, kind, role="hook", mode=rng.choice(["close", "close", "verify"]),
                     duration=lease + rng.uniform(0.5, 3.0))
    if kind == "skew":
        sign = rng.choice("+-")
        return Fault(at, kind, role="worker", mode=f"{sign}{rng.randint(*SKEW_MINUTES)}m")
    if kind == "reader":  # a long read transaction on the ledger
        return Fault(at, kind, role="reader", duration=rng.uniform(2.0, 8.0))
    if kind == "lost_ack":  # the next COMMIT through the proxy commits, its reply is lost
        return Fault(at, kind, role="proxy")
    if kind == "partition":  # a worker cut off from the server, then joined again
        mode = "long" if rng.random() < 0.2 else "short"
        low, high = PARTITION_LONG if mode == "long" else PARTITION_SHORT
        return Fault(at, kind, role="worker", mode=mode, duration=lease + rng.uniform(low, high))
    if kind == "broker_dup":  # copies of messages published again
        return Fault(at, kind, role="broker", mode=rng.choice(DUP_MODES), pick=rng.random())
    if kind == "broker_delay":  # the waiting messages held back past the redispatch wait
        return Fault(at, kind, role="broker", duration=2 * lease + rng.uniform(0.5, 4.0))
    return Fault(at, kind, role="handler")  # hang


def _kinds_drawn(rng: random.Random, kinds: tuple[str, ...], n: int,
                 each: tuple[str, ...]) -> list[str]:
    """``n`` kinds by weight; every kind of ``each`` (that the backend has) at least once."""
    drawn = [_pick(rng, {k: WEIGHTS[k] for k in kinds}) for _ in range(n)]
    for kind in [k for k in each if k in kinds and k not in drawn]:
        free = [i for i, k in enumerate(drawn) if k not in each or drawn.count(k) > 1]
        if not free:
            break
        drawn[rng.choice(free)] = kind
    return drawn


def plan_round(seed: int, number: int, kinds: tuple[str, ...], faults: int = 12,
               lease: float = 2.0, each: tuple[str, ...] = ()) -> RoundPlan:
    """``each``: kinds every round draws at least once (the short tier: NEW_KINDS). Only a
    round through a broker draws the broker's kinds (BROKER_SHARE; with ``each`` the even
    rounds), and it draws at least one."""
    rng = random.Random(f"{seed}:{number}")
    offered = any(k in kinds for k in BROKER_KINDS)
    broker = offered and (number % 2 == 0 if each else rng.random() < BROKER_SHARE)
    if not broker:
        kinds = tuple(k for k in kinds if k not in BROKER_KINDS)
        each = tuple(k for k in each if k not in BROKER_KINDS)
    elif not each:
        each = (rng.choice([k for k in BROKER_KINDS if k in kinds]),)
    runs = [RunPlan(f"r{number}-{i}", "relay" if rng.random() < 0.7 else "charge",
                    rng.randint(12, 48), rng.choice([0, 0, 0, 5, 7]))
            for i in range(rng.randint(3, 6))]
    at, planned = rng.uniform(1.5, 2.5), []
    for kind in _kinds_drawn(rng, kinds, faults, each):
        planned.append(_fault(rng, round(at, 3), kind, lease))
        at += rng.uniform(0.2, 0.8)
    chaos = round(at + 0.5, 3)
    submissions = sorted(
        (Submission(round(rng.uniform(0.0, chaos * 0.6), 3), i,
                    1 if rng.random() < 0.08 else 0)
         for i, _ in enumerate(runs) for _ in range(rng.randint(1, 3))),
        key=lambda s: s.at)
    operations = sorted(
        (Operation(round(rng.uniform(0.5, chaos), 3), _pick(rng, OPERATIONS),
                   rng.randrange(len(runs)), rng.random(), rng.random())
         for _ in range(max(1, int(chaos / 0.6)))),
        key=lambda o: o.at)
    return RoundPlan(seed, number, lease, rng.randint(2, 3), rng.randint(2, 8), 3, runs,
                     submissions, planned, operations, chaos, kinds)
