"""Every console excerpt of the README and the docs is what its commands print today (issue
24, item 2): each is a marked block that ``tests/excerpts.py`` makes by running the commands,
as ``make excerpts`` does, and this compares them (what changes from run to run masked)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest
from excerpts import COUNTS, FILES, MAKES, MARKER, ROOT, SCENARIOS, marked, stable

pytestmark = pytest.mark.docs


def test_every_console_excerpt_is_marked_and_made_by_a_scenario() -> None:
    made = set().union(*MAKES.values())
    for path in FILES:
        if path.name == "cli.md":  # generated whole by make docs
            continue
        text = path.read_text()
        marked_at = {m.start() for m in MARKER.finditer(text)}
        for m in re.finditer(r"```text\n", text):
            head = text.rfind("<!--", 0, m.start())
            assert head in marked_at and text[head:m.start()].count("\n") == 1, (
                f"{path.relative_to(ROOT)}: a console excerpt without an excerpt marker at "
                f"line {text[:m.start()].count(chr(10)) + 1}")
    for path, found in marked().items():
        for name in found:
            assert name in made, f"{path.relative_to(ROOT)}: no scenario makes excerpt {name}"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_excerpts_are_what_the_commands_print(scenario: str, tmp_path: Path) -> None:
    if scenario == "a database outage":
        pytest.importorskip("psycopg")
        from excerpts import private_server_here

        if (why := private_server_here()) is not None:
            pytest.skip(f"no private PostgreSQL server here: {why}")
    made = SCENARIOS[scenario](tmp_path)
    assert set(made) == MAKES[scenario]
    shown = [(path, found) for path, found in marked().items()]
    for name, text in made.items():
        blocks = [found[name] for _, found in shown if name in found]
        assert blocks, f"no block is marked {name}"
        for block in blocks:
            want, got = stable(block, name in COUNTS), stable(text, name in COUNTS)
            assert want == got, (f"excerpt {name} differs from what its commands print now "
                                 "(run `make excerpts`):\n" + "\n".join(
                                     difflib.unified_diff(want, got, "shown", "printed",
                                                          lineterm="")))
