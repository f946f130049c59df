"""Which workledger is measured, and on what machine.

workledger is imported from a copy of ``src/workledger`` taken at start (``snapshot_source``),
or from the package of a commit exported with ``git archive`` (``export_rev``, ``--rev``), in
the parent and in every spawned worker, so a run measures one version of the code. Only the
``src/workledger`` folder of a commit is exported: the benchmark code that runs is always this
folder's. The header says which code ran (its source hash) and how it relates to the
repository's tree.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


def snapshot_source(src: str) -> str:
    """Copy ``src/workledger`` to a temporary folder and import workledger from there, in this
    process and in every spawned worker, so one benchmark run measures one version of the code
    even while the working tree changes under it. Returns the snapshot folder."""
    pkg = os.path.join(src, "workledger")
    if not os.path.isfile(os.path.join(pkg, "__init__.py")):
        sys.exit(f"--src {src}: no workledger package there")
    if "workledger" in sys.modules:
        raise RuntimeError("workledger was imported before the snapshot was taken")
    root = tempfile.mkdtemp(prefix="wl_bench_src_")
    shutil.copytree(pkg, os.path.join(root, "workledger"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return root


def export_rev(rev: str) -> str:
    """``git archive`` the workledger package of commit ``rev`` into a temporary ``src`` folder
    (read-only for the repository). Returns that folder."""
    try:
        data = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", rev,
                               "src/workledger"], capture_output=True, check=True).stdout
        full = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", rev],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"--rev {rev}: cannot export it from git: {exc}")
    dest = tempfile.mkdtemp(prefix="wl_bench_rev_")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    os.environ["WL_BENCH_REV"] = full
    return os.path.join(dest, "src")


def source_hash(pkg_dir: str) -> str:
    h = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(pkg_dir)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".sql")):
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, pkg_dir).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:12]


def machine_lines(backends: list[Any]) -> list[str]:
    import psycopg

    lines = [
        f"machine: {platform.node()} | nproc {os.cpu_count()} | {_cpu_model()} | "
        f"{platform.system()} {platform.release()}",
        f"python {platform.python_version()} | sqlite3 {sqlite3.sqlite_version} | "
        f"psycopg {psycopg.__version__} | workledger {_wl_version()}",
    ]
    lines += [f"backend: {b.describe()}" for b in backends]
    return lines


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _wl_version() -> str:
    """The measured code: its source hash, and how it relates to this repository's tree."""
    import workledger

    pkg = os.path.dirname(os.path.abspath(workledger.__file__))
    measured = source_hash(pkg)
    rev = os.environ.get("WL_BENCH_REV")
    origin = f"git {rev}, " if rev else ""
    return (f"{workledger.__version__} source sha256 {measured} ({origin}{pkg}"
            f"{_repo_note(measured)})")


def _repo_note(measured: str) -> str:
    """``; repo HEAD <commit>..., its src/workledger is the same`` (or DIFFERENT), or nothing
    outside a git checkout."""
    with contextlib.suppress(Exception):
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "src"],
                               capture_output=True, text=True, check=True).stdout.strip()
        tree = source_hash(os.path.join(ROOT, "src", "workledger"))
        same = "the same" if tree == measured else f"DIFFERENT ({tree})"
        return (f"; repo HEAD {head}{' with uncommitted src changes' if dirty else ''}, "
                f"its src/workledger is {same}")
    return ""
