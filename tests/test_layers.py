"""The layers hold (docs/design.md "Layers"), read from the code's own imports.

Every ``import`` in ``src/workledger`` counts, at module level or inside a function, except
those under ``if TYPE_CHECKING:``. The rules: no module imports itself back through others
(no cycle); the pure core imports nothing outside the standard library and itself; only
``storage`` imports a database driver; the CLI reaches the runtime and the storage only
through the facade (``workledger.api``), and so does the HTTP layer; the demos use the
public API only; the runtime's rooms import downward only (its root, then ``handlers``,
``repair``, ``worker``, ``broker``), and only the facade and the integrations import it.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[1] / "src"
PUBLIC = {"workledger", "workledger.api", "workledger.errors", "workledger.jobs",
          "workledger.progress", "workledger.results"}
DRIVERS = {"sqlite3", "psycopg", "psycopg_pool"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / "workledger").rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, package: str) -> set[str]:
    found: set[str] = set()
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            found |= set().union(*(_imports(n, package) for n in node.orelse))
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
        found |= _imports(node, package)
    return found


@cache
def imports_of(name: str) -> frozenset[str]:
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return frozenset(_imports(ast.parse(path.read_text()), package))


def internal_imports(name: str) -> set[str]:
    """The workledger modules ``name`` imports (a ``from pkg import mod`` names the module)."""
    return {i for i in imports_of(name) if i in modules() and i != name}


def test_no_module_imports_itself_back_through_others() -> None:
    graph = {name: internal_imports(name) for name in modules()}
    # a package's __init__ importing its own submodules is how it hands them on, not a loop
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not (d.startswith(name + ".")
                                                and modules()[name].name == "__init__.py")}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_core_imports_only_the_standard_library_and_itself() -> None:
    for name in modules():
        if not name.startswith("workledger.core"):
            continue
        outside = {i for i in imports_of(name)
                   if not i.startswith("workledger.core") and i != "__future__"
                   and i.split(".")[0] not in sys.stdlib_module_names}
        assert outside == set(), name


def test_only_the_storage_imports_a_database_driver() -> None:
    """(The demos are user code with stores of their own: an employee file, a mail sink.)"""
    for name in modules():
        if name.startswith("workledger.demos"):
            continue
        drivers = {i for i in imports_of(name) if i.split(".")[0] in DRIVERS}
        if drivers:
            assert name.startswith("workledger.storage"), (name, drivers)


def test_the_cli_reaches_the_runtime_and_the_storage_only_through_the_facade() -> None:
    for name in modules():
        if name.startswith("workledger.cli"):
            reached = {i for i in internal_imports(name)
                       if i.startswith(("workledger._runtime", "workledger.storage",
                                        "workledger.core"))}
            assert reached == set(), name


def test_the_http_layer_reaches_the_runtime_and_the_storage_only_through_the_facade() -> None:
    """Like the CLI: routes, pages, metrics and auth call ``workledger.api``, never below it.
    (``TYPE_CHECKING`` imports of types are not calls, and are not counted.)"""
    found = [name for name in modules() if name.startswith("workledger.http")]
    assert "workledger.http.api_routes" in found
    for name in found:
        reached = {i for i in internal_imports(name)
                   if i.startswith(("workledger._runtime", "workledger.storage",
                                    "workledger.core"))}
        assert reached == set(), name


def test_the_demos_use_the_public_api_only() -> None:
    for name in modules():
        if name.startswith("workledger.demos"):
            private = {i for i in internal_imports(name)
                       if not i.startswith("workledger.demos") and i not in PUBLIC}
            assert private == set(), name


RUNTIME = "workledger._runtime"
# The runtime's rooms, from the ground up (docs/contributing.md "The runtime's rooms"): a module
# imports from its own room or one beneath it, never above; the modules at its root
# (decomposition, status, overview, patience, renewal, inputs) are the ground floor.
ROOMS = ("", "handlers", "repair", "worker", "broker")


def room_of(name: str) -> str:
    parts = name.removeprefix(RUNTIME).lstrip(".").split(".")
    if len(parts) == 1 and modules()[name].name != "__init__.py":
        return ""  # a module at the root of the runtime
    assert parts[0] in ROOMS, f"{name}: a new room of the runtime belongs in ROOMS, in its place"
    return parts[0]


def test_the_runtime_rooms_import_downward_only() -> None:
    found = [name for name in modules() if name == RUNTIME or name.startswith(RUNTIME + ".")]
    assert {f"{RUNTIME}.{room}" for room in ROOMS if room} <= set(found)
    floor = {room: i for i, room in enumerate(ROOMS)}
    for name in found:
        for dep in internal_imports(name):
            if dep.startswith(RUNTIME + "."):
                assert floor[room_of(dep)] <= floor[room_of(name)], (name, dep)


def test_only_the_facade_and_the_integrations_import_the_runtime() -> None:
    """The runtime is private (its leading underscore): the public modules a handler's author
    reads (``workledger.jobs``, ``workledger.results``) and the layers beneath (core, storage,
    errors) never import it; ``workledger.api`` and ``workledger.contrib`` do."""
    for name in modules():
        if name.startswith((RUNTIME, "workledger.contrib.")) or name == "workledger.api":
            continue
        reached = {i for i in internal_imports(name) if i.startswith(RUNTIME)}
        assert reached == set(), name


INTEGRATED = {"django", "celery", "rq", "kombu", "amqp", "billiard", "redis"}  # extras


def test_integrations_live_in_contrib_and_nothing_outside_imports_them() -> None:
    """The core and the facade never import an optional package (``workledger[django]``...):
    only ``workledger.contrib.<name>`` does, and only a user imports contrib."""
    assert "workledger.contrib.django" in modules()
    for name in modules():
        if name.startswith("workledger.contrib"):
            continue
        assert {i for i in imports_of(name) if i.split(".")[0] in INTEGRATED} == set(), name
        assert {i for i in internal_imports(name) if i.startswith("workledger.contrib")} \
            == set(), name


def test_the_integrations_use_the_public_api_and_the_runtime() -> None:
    """(and the CLI, for an integration that runs its commands: Django's manage.py)"""
    found = [name for name in modules() if name.startswith("workledger.contrib.")]
    assert {"workledger.contrib.celery", "workledger.contrib.rq"} <= set(found)
    for name in found:
        beneath = {i for i in internal_imports(name)
                   if not i.startswith(("workledger.contrib", "workledger._runtime",
                                        "workledger.cli"))
                   and i not in PUBLIC}
        assert beneath == set(), name


def test_the_reading_of_imports_sees_what_these_rules_need() -> None:
    """The rules above are only as good as this reading: check it on known facts."""
    assert "workledger.api" in internal_imports("workledger.cli.work")
    assert "workledger.jobs" in internal_imports("workledger.api")
    assert "workledger._runtime.handlers.execute" in internal_imports(
        "workledger._runtime.worker.chunk")
    assert "sqlite3" in imports_of("workledger.storage.sqlite")
    # a function-level import counts (the CLI loads a demo only when asked)
    assert "workledger.demos.payroll" in internal_imports("workledger.cli.demo")


def test_a_sqlite_worker_never_loads_the_postgresql_driver(tmp_path: Path) -> None:
    """psycopg costs a SQLite process about 10 MiB and 60 ms at start: it is imported only by
    a store that needs it (``errors.CommitInDoubt`` lives outside ``storage/doubt.py``)."""
    import subprocess

    code = ("import sys, workledger, workledger.cli, workledger._runtime.worker.worker\n"
            "from workledger import Ledger\n"
            f"ledger = Ledger('sqlite:///{tmp_path / 'l.db'}')\n"
            "job = ledger.job('j')\n"
            "job.decompose(lambda p: [])\n"
            "job.stage('s')(lambda item, ctx: None)\n"
            "job.submit({})\n"
            "ledger.work(until_idle=True)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'psycopg'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout
