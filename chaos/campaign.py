#!/usr/bin/env python
"""The fault campaign: rounds of real workers, sweepers, submitters and operator commands on a
fresh ledger, under faults drawn from a seed, each round checked by the oracle of
docs/reliability.md with SQL and an effects sink. See chaos/README.md.

    python chaos/campaign.py --backend sqlite|postgres [--kills N | --minutes M] [--seed S]
                             [--round R] [--faults-per-round K] [--lease SECONDS] [--json]

Every run prints its seed first; ``--seed S`` replays the same plans (``--round R``: only round
R). Exits 1 on any violation, naming the seed and the round to replay.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import broker as brokermod
import netns
from backend import PostgresBackend, SqliteBackend
from chaos_app import HANDLER_TIMEOUT, timeouts_supported
from plan import NEW_KINDS, kinds_for, plan_round
from processes import faketime_library
from rounds import LIVENESS_SLACK, STEP_SECONDS, WAL_LIMIT_MIB, Round, RoundResult


def options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sqlite", "postgres"], required=True)
    p.add_argument("--kills", type=int, default=None,
                   help="stop after this many faults were injected (default 60 without "
                        "--minutes)")
    p.add_argument("--minutes", type=float, default=None,
                   help="stop starting rounds after this many minutes")
    p.add_argument("--seed", type=int, default=None, help="replay this seed (default: random)")
    p.add_argument("--round", type=int, default=None, help="run only this round of the seed")
    p.add_argument("--faults-per-round", type=int, default=12)
    p.add_argument("--lease", type=float, default=2.0, help="the workers' lease, seconds")
    p.add_argument("--liveness-slack", type=float, default=LIVENESS_SLACK,
                   help="check V: every run settles within the lease plus this many seconds "
                        "of the last fault, plus 0.125 s per step of work left then")
    p.add_argument("--wal-limit-mib", type=float, default=WAL_LIMIT_MIB,
                   help="check W: the largest a SQLite ledger's WAL may grow, MiB")
    p.add_argument("--each-kind", action="store_true",
                   help="every round draws each of the kinds issue 21 added at least once "
                        f"({', '.join(NEW_KINDS)}, those the backend has)")
    p.add_argument("--no-broker", action="store_true",
                   help="no round goes through a broker (the short tier, until the rq worker "
                        "that outlives SIGTERM and the stranded re-dispatch are fixed: "
                        "chaos/README.md)")
    p.add_argument("--json", action="store_true",
                   help="end with one line of JSON: seed, rounds, kills, items, effects, "
                        "violations, ...")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where rounds keep their files (default: a temporary folder; the "
                        "folder of a round with a violation is kept)")
    p.add_argument("--keep", action="store_true",
                   help="keep every round's files and database, not only a failing round's")
    a = p.parse_args(argv)
    if a.kills is None and a.minutes is None and a.round is None:
        a.kills = 60
    return a


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def main(argv: list[str] | None = None) -> int:
    a = options(argv)
    # SIGTERM as Ctrl-C: the round stops its processes, the private server and the partition's
    # namespace are removed (a plain SIGTERM would leave all three behind)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(10**9)
    print(f"chaos campaign: backend {a.backend}, seed {seed} "
          f"(replay: python chaos/campaign.py --backend {a.backend} --seed {seed})", flush=True)
    hang = timeouts_supported()
    skew = faketime_library() is not None
    partition = a.backend == "postgres" and netns.why_not() is None
    broker = not a.no_broker and brokermod.why_not() is None
    notes = ([] if hang else ["hang left out of the draw: this workledger has no "
                              "@job.stage(..., timeout=), so a hung handler holds its lease"]) \
        + ([] if skew or a.backend != "sqlite" else
           ["skew left out of the draw: faketime is not installed (apt-get install faketime)"]) \
        + ([] if partition or a.backend != "postgres" else
           [f"partition left out of the draw: {netns.why_not()}"]) \
        + ([] if broker or a.no_broker else
           [f"broker faults left out of the draw: {brokermod.why_not()}"])
    left_out = "; ".join(notes) or None
    if left_out:
        print(left_out, flush=True)
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="wl-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    backend: Any = (SqliteBackend(workdir) if a.backend == "sqlite"
                    else PostgresBackend(workdir, seed, partition))
    results: list[RoundResult] = []
    began = time.monotonic()
    try:
        for number in ([a.round] if a.round is not None else range(1, 10**6)):
            kinds = kinds_for(a.backend, hang, skew, partition, broker)
            plan = plan_round(seed, number, kinds,
                              a.faults_per_round, a.lease, NEW_KINDS if a.each_kind else ())
            result = Round(plan, backend, workdir, HANDLER_TIMEOUT + a.lease, a.wal_limit_mib,
                           a.liveness_slack).run()
            results.append(result)
            report_round(result, a.backend, seed)
            if not result.violations and not a.keep:
                shutil.rmtree(result.folder, ignore_errors=True)
                backend.drop_round(result.url)
            kills = sum(sum(r.faults.values()) for r in results)
            if (a.kills is not None and kills >= a.kills) or \
                    (a.minutes is not None and time.monotonic() - began >= a.minutes * 60):
                break
    finally:
        backend.close()
    summary = summarize(results, seed, a, time.monotonic() - began, left_out)
    print_table(summary)
    if a.json:
        print(json.dumps(summary), flush=True)
    elif a.workdir is None and not summary["violations"]:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if summary["violations"] else 0


def report_round(r: RoundResult, backend: str, seed: int) -> None:
    faults = ", ".join(f"{k} {n}" for k, n in sorted(r.faults.items()))
    recovered = f"{r.recovery:.1f} s" if r.recovery is not None else "NOT settled"
    print(f"round {r.number}: {sum(r.faults.values())} faults ({faults}), {r.items} items, "
          f"{r.effects} effects, recovered {recovered} after the last fault, "
          f"{len(r.violations)} violations ({r.seconds:.0f} s)", flush=True)
    if r.recovery is not None and r.recovery > 15 and r.waited_for:
        print(f"  recovery waited for: {r.waited_for}", flush=True)
    for v in r.violations:
        print(f"  violation {v}", flush=True)
    if r.violations:
        print(f"  replay: python chaos/campaign.py --backend {backend} --seed {seed} "
              f"--round {r.number}   (files kept in {r.folder})", flush=True)


def summarize(results: list[RoundResult], seed: int, a: argparse.Namespace, seconds: float,
              left_out: str | None) -> dict[str, Any]:
    faults: Counter[str] = Counter()
    roles: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    duplicates: Counter[str] = Counter()
    for r in results:
        faults.update(r.faults)
        roles.update(r.killed_roles)
        errors.update(r.errors)
        duplicates.update(r.duplicates)
    recoveries = [r.recovery for r in results if r.recovery is not None]
    return {
        "backend": a.backend, "seed": seed, "rounds": len(results), "lease": a.lease,
        "kills": sum(faults.values()), "faults": dict(sorted(faults.items())),
        "process_kills": faults["kill"] + faults["failpoint"],
        "by_role": dict(sorted(roles.items())),
        "failpoints_armed": sum(r.armed for r in results),
        "items": sum(r.items for r in results), "effects": sum(r.effects for r in results),
        "repeated_effects": dict(duplicates), "processes": sum(r.processes for r in results),
        "one_line_errors": dict(errors.most_common(8)),
        "recovery_p50": percentile(recoveries, 0.5), "recovery_p99": percentile(recoveries, 0.99),
        "recovery_limit": a.lease + a.liveness_slack, "seconds": round(seconds, 1),
        "wal_max_mib": round(max((r.wal_max for r in results), default=0) / 2**20, 2),
        "wal_limit_mib": a.wal_limit_mib,
        "hooks_slowed": sum(r.hooks_slowed for r in results),
        "left_out": left_out,
        "violations": [{"round": r.number, "check": v.check, "what": v.what}
                       for r in results for v in r.violations],
    }


def print_table(s: dict[str, Any]) -> None:
    def seconds(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f} s"

    rows = [("backend", s["backend"]), ("seed", str(s["seed"])), ("rounds", str(s["rounds"])),
            ("faults injected", f"{s['kills']:,}")]
    rows += [(f"  {k}", f"{n:,}") for k, n in s["faults"].items()]
    rows += [("processes killed (kill + failpoint)", f"{s['process_kills']:,}")]
    rows += [("failpoints armed (fired: above)", f"{s['failpoints_armed']:,}"),
             ("items", f"{s['items']:,}"), ("effects", f"{s['effects']:,}"),
             ("  repeated, idempotent stage", f"{s['repeated_effects'].get('idempotent', 0):,}"),
             ("  repeated, a person chose it", f"{s['repeated_effects'].get('chosen', 0):,}"),
             ("  repeated close, its process died",
              f"{s['repeated_effects'].get('close_rerun_after_death', 0):,}"),
             ("  repeated, nobody chose it", f"{s['repeated_effects'].get('unexplained', 0):,}"),
             ("  late, fenced out downstream", f"{s['repeated_effects'].get('fenced', 0):,}"),
             ("slow hooks that ran slow", f"{s['hooks_slowed']:,}"),
             ("processes started", f"{s['processes']:,}"),
             ("recovery p50", seconds(s["recovery_p50"])),
             ("recovery p99", seconds(s["recovery_p99"])),
             ("recovery limit", f"lease + {s['recovery_limit'] - s['lease']:g} s = "
                                f"{s['recovery_limit']:g} s, + {STEP_SECONDS:g} s per step "
                                "of work left"),
             ("largest SQLite WAL", f"{s['wal_max_mib']:g} MiB (bound {s['wal_limit_mib']:g} MiB)"),
             ("wall time", f"{s['seconds'] / 60:.1f} min"),
             ("violations", str(len(s["violations"])))]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for kind, n in s["one_line_errors"].items():
        print(f"one-line error x{n}: {kind}")
    if s["left_out"]:
        print(s["left_out"])
    for v in s["violations"][:20]:
        print(f"violation in round {v['round']} ({v['check']}): {v['what']}")
    if s["violations"]:
        print(f"replay a round: python chaos/campaign.py --backend {s['backend']} "
              f"--seed {s['seed']} --round {s['violations'][0]['round']}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
