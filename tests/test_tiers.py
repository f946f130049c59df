"""Every test has its tier (pyproject.toml's markers; docs/contributing.md "Tests"), so that
``pytest -m unit`` and `make check` select what they say: each test function of every
``tests/**/test_*.py`` carries a tier marker, through the module's ``pytestmark``, its class's,
or its own decorator. Read from the files' syntax, so a file that fails to import is still read.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
TIERS = {"unit", "contract", "integration", "concurrency", "docs"}


def marks_in(node: ast.expr | None) -> set[str]:
    """The ``pytest.mark.NAME`` names an expression holds (a mark, a call of one, a list)."""
    if node is None:
        return set()
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}


def pytestmark_of(body: list[ast.stmt]) -> set[str]:
    found: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets):
            found |= marks_in(stmt.value)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                and stmt.target.id == "pytestmark":
            found |= marks_in(stmt.value)
    return found


def untiered(path: Path) -> list[str]:
    """The test functions of ``path`` that no tier marker reaches."""
    tree = ast.parse(path.read_text())
    module = pytestmark_of(tree.body)
    missing = []
    scopes: list[tuple[set[str], list[ast.stmt]]] = [(module, tree.body)]
    while scopes:
        inherited, body = scopes.pop()
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                own = pytestmark_of(node.body) | set().union(
                    *(marks_in(d) for d in node.decorator_list))
                scopes.append((inherited | own, node.body))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                    and node.name.startswith("test"):
                marks = inherited.union(*(marks_in(d) for d in node.decorator_list))
                if not marks & TIERS:
                    missing.append(node.name)
    return missing


def test_every_test_carries_a_tier_marker() -> None:
    problems = [f"{path.relative_to(ROOT)}: {', '.join(names)}"
                for path in sorted((ROOT / "tests").rglob("test_*.py"))
                if (names := untiered(path))]
    assert not problems, ("tests without a tier (add pytestmark = pytest.mark.<tier>):\n"
                          + "\n".join(problems))


def test_the_tiers_are_the_markers_pyproject_declares() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = {m.split(":")[0] for m in config["tool"]["pytest"]["ini_options"]["markers"]}
    assert TIERS <= declared


def test_a_marker_reaches_a_test_through_its_module_class_or_decorator(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import pytest\n"
        "class TestA:\n    pytestmark = [pytest.mark.unit]\n    def test_in_class(self): pass\n"
        "@pytest.mark.contract\ndef test_decorated(): pass\n"
        "@pytest.mark.parametrize('x', [1])\ndef test_bare(x): pass\n")
    assert untiered(sample) == ["test_bare"]
    sample.write_text("import pytest\npytestmark = pytest.mark.docs\ndef test_bare(): pass\n")
    assert untiered(sample) == []
