"""What a job declaration refuses, what a failure keeps, and the demo's optional dependencies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workledger import Context, Item, ItemView, Ledger, Permanent
from workledger._runtime.handlers.execute import TRACE_LIMIT
from workledger.errors import UsageError

pytestmark = pytest.mark.integration


# -- async functions: where they run, and what is refused where it is declared ------------------


async def _async_handler(item: ItemView, ctx: Context) -> None:
    return None


class _AsyncCallable:
    async def __call__(self, item: ItemView, ctx: Context) -> None:
        return None


async def _async_generator(item: ItemView, ctx: Context) -> Any:
    yield None


@pytest.mark.parametrize("handler", [_async_handler, _AsyncCallable()])
@pytest.mark.parametrize("executor", [None, "async"])
def test_an_async_handler_runs_on_the_event_loop(handler: Any, executor: str | None) -> None:
    job = Ledger("sqlite:///unused.db").job("j")
    job.stage("work", executor=executor)(handler)
    job.stage("batch", batch=10)(handler)
    assert [(s.name, s.executor) for s in job.stages] == [("work", "async"), ("batch", "async")]
    assert job.executors(processes=True) == job.executors(processes=False) == {"async"}


def test_the_async_executor_needs_an_async_handler_and_an_async_one_no_other() -> None:
    job = Ledger("sqlite:///unused.db").job("j")
    with pytest.raises(UsageError, match="^job 'j', stage 'work': executor='async' needs an "
                                         "async def handler, and plain is a plain function$"):
        def plain(item: ItemView, ctx: Context) -> None:
            return None

        job.stage("work", executor="async")(plain)
    for other in ("thread", "process"):
        with pytest.raises(UsageError, match=rf"the handler is an async function, which runs "
                                             rf"on the worker's event loop \(executor='async'\), "
                                             rf"not executor='{other}'"):
            job.stage("work", executor=other)(_async_handler)
    with pytest.raises(UsageError, match="executor must be 'thread', 'process' or 'async'"):
        job.stage("work", executor="greenlet")
    with pytest.raises(UsageError, match="the handler is an async generator"):
        job.stage("work")(_async_generator)
    assert job.stages == []


def test_async_verify_and_closing_hooks_are_accepted_an_async_decomposer_is_refused() -> None:
    job = Ledger("sqlite:///unused.db").job("j")
    job.stage("work", verify=_async_handler)(lambda item, ctx: None)
    verify = job.stages[0].verify
    assert verify is not None and verify(None, None) is None  # awaited on a loop of its own

    async def close(status: Any) -> str:
        return f"closed {status}"

    assert job.on_complete(close) is close
    assert job.on_complete_fn is not None and job.on_complete_fn(7) == "closed 7"

    async def split(payload: Any) -> Any:
        return []

    with pytest.raises(UsageError, match="the decomposer is an async function; a decomposer "
                                         "runs inside submit"):
        job.decompose(split)
    with pytest.raises(UsageError, match="the verify hook is an async generator"):
        job.stage("other", verify=_async_generator)


def test_a_plain_function_and_a_plain_callable_object_are_accepted() -> None:
    class Plain:
        def __call__(self, item: ItemView, ctx: Context) -> None:
            return None

    job = Ledger("sqlite:///unused.db").job("j")
    job.stage("one")(lambda item, ctx: None)
    job.stage("two")(Plain())
    assert [s.name for s in job.stages] == ["one", "two"]


# -- a failure keeps its traceback ------------------------------------------------------------


def _parse_row(text: str) -> int:
    return int(text)  # ValueError for a bad row, three frames down


def _load(item: ItemView) -> int:
    return _parse_row(item.data["row"])


def _chain(n: int) -> None:
    """n chained exceptions: a traceback far longer than the limit."""
    try:
        if n == 0:
            raise KeyError("bottom")
        _chain(n - 1)
    except Exception as exc:
        raise ValueError(f"level {n}: " + "x" * 100) from exc


@pytest.fixture
def failing(db_url: str) -> Iterator[Ledger]:
    ledger = Ledger(db_url)
    job = ledger.job("import")

    @job.decompose
    def split(payload: dict[str, Any]) -> Iterator[Item]:
        for i, row in enumerate(payload["rows"]):
            yield Item(key=f"r{i}", data={"row": row})

    @job.stage("load", max_attempts=1)
    def load(item: ItemView, ctx: Context) -> int:
        if item.data["row"] == "deep":
            _chain(60)
        if item.data["row"] == "refused":
            raise Permanent("the downstream said no")  # deliberate: no traceback kept
        try:
            return _load(item)
        except ValueError as exc:
            if item.data["row"] == "wrapped":
                raise Permanent("row is not a number") from exc  # deliberate, with a cause
            raise

    yield ledger
    ledger.close()


def _failure_detail(ledger: Ledger, run_id: int, seq: int) -> dict[str, Any]:
    story = ledger.history(run_id, "load", seq)
    [event] = [e for e in story.events if e.kind == "failed"]
    assert isinstance(event.detail, dict)
    return event.detail


def test_a_failed_item_keeps_the_last_frames_of_its_traceback_in_the_event(
    failing: Ledger,
) -> None:
    sub = failing.submit("import", {"rows": ["x1", "deep", "refused", "wrapped"]}, key="k")
    failing.work(concurrency=1, until_idle=True)
    assert failing.status(sub.run_id).failed == 4

    plain = _failure_detail(failing, sub.run_id, 0)
    assert "_parse_row" in plain["traceback"] and "_load" in plain["traceback"]
    assert plain["traceback"].rstrip().endswith("ValueError: invalid literal for int() with "
                                                "base 10: 'x1'")
    row = failing.items(sub.run_id, stage="load")[0]
    assert row.error is not None and "\n" not in row.error  # the item's reason: one line
    assert "Traceback" not in row.error

    deep = _failure_detail(failing, sub.run_id, 1)["traceback"]
    assert len(deep) <= TRACE_LIMIT and deep.startswith("...")
    assert deep.rstrip().endswith("ValueError: level 60: " + "x" * 100)  # the last frames

    assert "traceback" not in _failure_detail(failing, sub.run_id, 2)
    wrapped = _failure_detail(failing, sub.run_id, 3)["traceback"]
    assert "_parse_row" in wrapped and "Permanent: row is not a number" in wrapped


def test_history_prints_the_traceback_below_the_events(failing: Ledger, db_url: str,
                                                       tmp_path: Path) -> None:
    sub = failing.submit("import", {"rows": ["x1"]}, key="k")
    failing.work(concurrency=1, until_idle=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKLEDGER_")}
    out = subprocess.run([sys.executable, "-m", "workledger.cli", "--db", db_url, "history",
                          str(sub.run_id), "--stage", "load", "--item", "0"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "traceback of the failed event at" in out.stdout
    assert "in _parse_row" in out.stdout
    as_json = subprocess.run([sys.executable, "-m", "workledger.cli", "--db", db_url, "history",
                              str(sub.run_id), "--stage", "load", "--item", "0", "--json"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    events = json.loads(as_json.stdout)["events"]
    assert any("_parse_row" in (e["detail"] or {}).get("traceback", "") for e in events)


# -- the payroll demo's dependencies are an extra ------------------------------------------------


@pytest.mark.parametrize("missing", ["reportlab"])
def test_the_payroll_demo_without_its_extra_says_how_to_install_it(
    missing: str, tmp_path: Path
) -> None:
    # the module is made unimportable in the child, as if the extra were not installed
    code = (f"import sys; sys.modules[{missing!r}] = None; "
            "from workledger.cli import main; main(['demo', 'payroll'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert missing in lines[0] and "pip install 'workledger[demo]'" in lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing written: no ledger, no payslips


def test_a_closing_hook_gets_a_context_only_when_it_asks_for_a_second_argument(
    tmp_path: Path,
) -> None:
    """``(status, ctx)`` gets its entry's Context (lease token included); a hook whose second
    parameter has a default, one of ``*args``, a mock-like or an unwrapped wrapper is called
    with the status alone, as before the Context was offered (a reviewer's list)."""
    import functools

    seen: dict[str, tuple[Any, ...]] = {}

    def wants(status: Any, ctx: Any) -> None:
        seen["wants"] = (status, ctx)

    def extra(status: Any, extra: Any = None) -> None:
        seen["extra"] = (status, extra)

    def starred(*args: Any) -> None:
        seen["starred"] = args

    def plain(status: Any) -> None:
        seen["plain"] = (status,)

    def unwrapped(*a: Any, **k: Any) -> None:
        plain(*a, **k)

    @functools.wraps(wants)
    def wrapped(*a: Any, **k: Any) -> None:
        wants(*a, **k)

    for name, hook in [("wants", wants), ("extra", extra), ("starred", starred),
                       ("unwrapped", unwrapped), ("wrapped", wrapped)]:
        seen.clear()
        ledger = Ledger(f"sqlite:///{tmp_path / f'{name}.db'}")
        job = ledger.job("j")
        job.decompose(lambda p: [Item(key="a")])
        job.stage("s", idempotent=True)(lambda item, ctx: None)
        job.on_complete(hook)
        run = job.submit({}).run_id
        ledger.work(until_idle=True)
        ledger.sweep()
        ledger.close()
        if name in ("wants", "wrapped"):
            status, ctx = seen["wants"]
            assert isinstance(ctx, Context) and ctx.stage == "@close" and ctx.lease_token > 0
            assert status.run_id == run and ctx.idempotency_key == f"{run}/@close/0"
        elif name == "extra":
            assert seen["extra"][1] is None
        elif name == "starred":
            assert len(seen["starred"]) == 1
        else:
            assert list(seen) == ["plain"]
