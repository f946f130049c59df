"""The benchmark scripts still start and run: ``--help`` of bench.py and ceiling.py, and one
tiny real bench.py run on SQLite. Nothing here asserts a speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, timeout=120)


def test_bench_help_lists_its_options() -> None:
    done = run("bench.py", "--help")
    assert done.returncode == 0, done.stderr
    for option in ("--items", "--backend", "--processes", "--chunk", "--repeat", "--systems",
                   "--peers", "--peer-items", "--extras", "--scale", "--json", "--rev",
                   "--profile"):
        assert option in done.stdout, option


def test_ceiling_help_lists_its_options() -> None:
    done = run("ceiling.py", "--help")
    assert done.returncode == 0, done.stderr
    for option in ("--items", "--chunk", "--rounds", "--backend"):
        assert option in done.stdout, option


def test_a_tiny_sqlite_run_prints_workledger_next_to_raw(tmp_path: Path) -> None:
    out = tmp_path / "samples.json"
    done = run("bench.py", "--items", "2000", "--backend", "sqlite", "--processes", "1",
               "--chunk", "500", "--repeat", "1", "--extras", "--quiet-wait", "0",
               "--tmpdir", str(tmp_path), "--json", str(out))
    assert done.returncode == 0, done.stderr
    head, _, table = done.stdout.partition("\n\n")
    assert head.startswith("workledger benchmark: N=2,000 no-op items, median of 1")
    assert "workledger items/s" in table and "raw SQL" in table
    rows = [line.split()[:2] for line in table.splitlines()[2:]]
    assert ["sqlite", "decompose"] in rows and ["sqlite", "claim+complete"] in rows
    samples = json.loads(out.read_text())["samples"]
    assert {(s["system"], s["phase"]) for s in samples} == {
        ("workledger", "decompose"), ("workledger", "drain"), ("raw", "decompose"),
        ("raw", "drain")}


def test_the_http_load_script_runs_a_tiny_load_without_errors(tmp_path: Path) -> None:
    """benchmarks/http_load.py against a real serve over a small run: every route answers
    200 (its latencies are reported by the script, never asserted here)."""
    out = tmp_path / "load.json"
    done = run("http_load.py", "--items", "3000", "--seconds", "2", "--clients", "4",
               "--backend", "sqlite", "--tmpdir", str(tmp_path), "--json", str(out))
    assert done.returncode == 0, done.stderr
    [(mode, routes)] = json.loads(out.read_text())["results"].items()
    assert mode == "sqlite closed loop"
    assert set(routes) >= {"api run status", "run page", "metrics"}
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in routes.values()), routes


def test_the_execution_benchmark_runs_a_tiny_sqlite_round() -> None:
    done = run("execution.py", "--backend", "sqlite", "--repeat", "1", "--send-items", "30",
               "--skip", "cpu", "payroll")
    assert done.returncode == 0, done.stderr
    assert "submit to first start, idle worker, sqlite" in done.stdout
    assert "not idempotent, batched, sqlite" in done.stdout
