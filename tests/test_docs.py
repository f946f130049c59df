"""The docs cannot drift: the CLI reference is generated and compared, every command is
documented, the README's commands, Python example and SQL queries run as written.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from workledger import Item, Ledger, Permanent, Retry, Skip
from workledger.cli import cli, reference

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CLI_MD = ROOT / "docs" / "cli.md"
GLOSSARY = (ROOT / "docs" / "glossary.md").read_text()
VOCABULARY = ["run", "item", "stage", "key", "claim", "lease", "attempt", "terminal", "sweep",
              "reconcile", "audit", "redrive", "resolve", "unknown"]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"README has no section {title!r}"
    return match.group(1)


def command_paths(cmd: click.Command = cli, prefix: str = "workledger") -> Iterator[str]:
    yield prefix
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            if not sub.hidden:
                yield from command_paths(sub, f"{prefix} {name}")


def test_cli_reference_matches_the_code() -> None:
    assert CLI_MD.read_text() == reference(), "docs/cli.md is stale: run `make docs`"


def test_every_command_is_in_the_reference_and_the_readme() -> None:
    text = CLI_MD.read_text()
    for path in command_paths():
        assert f"## `{path}`" in text, f"{path} is missing from docs/cli.md"
    overview = section(README, "The command line")
    for name in cli.commands:
        assert f"`{name}" in overview, f"README's command table lacks {name}"
    assert "docs/cli.md" in overview


def test_quick_start_is_exactly_two_commands() -> None:
    [block] = blocks(section(README, "Quick start"), "sh")
    assert block.split("\n")[:-1] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, flags=re.M) and re.search(r"^test:", makefile, flags=re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_glossary_defines_the_vocabulary_once() -> None:
    terms = re.findall(r"^\| ([^|]+?) \|", GLOSSARY, flags=re.M)
    defined = [t for t in terms if t not in ("term", "---")]
    assert len(defined) == len(set(defined)), "a term is defined twice"
    for word in VOCABULARY:
        assert word in defined, f"docs/glossary.md does not define {word!r}"


def test_readme_python_example_runs_as_written(tmp_path: Path) -> None:
    [example] = blocks(README, "python")
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "completed 3 2 1"
    assert (tmp_path / "workledger.db").exists()


# -- progress is a query -------------------------------------------------------------------------


@pytest.fixture
def one_run_in_every_state(db_url: str) -> Iterator[Ledger]:
    """Run 1: seq 0 skipped, 1 failed, 2/3/6 processed, 4/5 waiting to retry, 7 never claimed."""
    ledger = Ledger(db_url)
    job = ledger.job("q")

    @job.decompose
    def split(payload: Any) -> Iterator[Item | Skip]:
        yield Skip(key="k0", reason="bad input")
        yield from (Item(key=f"k{i}", data={"i": i}) for i in range(1, 8))

    @job.stage("s")
    def handle(item: Any, ctx: Any) -> int:
        if item.data["i"] == 1:
            raise Permanent("no such subject")
        if item.data["i"] in (4, 5):
            raise Retry("downstream busy", delay=3600)
        return int(item.data["i"])

    job.submit({"n": 8})
    worker = ledger.worker(concurrency=1, chunk=6, on_progress=lambda _: worker.stop())
    worker.run()
    yield ledger
    ledger.close()


def run_sql(url: str, sql: str) -> list[tuple[Any, ...]]:
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url[len("sqlite:///"):]) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]
    import psycopg

    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]  # type: ignore[arg-type]


def test_readme_queries_run_on_both_backends(one_run_in_every_state: Ledger) -> None:
    ledger = one_run_in_every_state
    queries = blocks(section(README, "Progress is a query"), "sql")
    assert len(queries) == 4
    far, why, resume, counters = (run_sql(ledger.url, q) for q in queries)
    assert {(stage, state): n for stage, state, n in far} == {
        ("s", state): n for state, n in ledger.status(1).counts["s"].items()}
    assert [(seq, state, error) for _, seq, _, state, _, error in why] == [
        (0, "skipped", "bad input"), (1, "failed", "no such subject")]
    assert dict(resume) == {"claimed by the next worker": 1, "retried when its backoff ends": 2}
    [run] = counters
    assert run[0] == 1 and tuple(run[3:]) == (8, 3, 1, 1)
