"""Job and stage definitions: how a payload becomes items, and one handler per stage; and what a
handler is given (:class:`ItemView`, :class:`Context`, :class:`BatchContext`). A public module:
what a handler's author reads, with none of the worker's internals (``workledger._runtime``)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from workledger.core import limits, writes
from workledger.core.durations import BadDuration, parse_duration
from workledger.core.limits import NAME_BYTES, text_problem
from workledger.core.outcomes import Item, Skip
from workledger.core.rates import Rate, parse_rate
from workledger.core.retry import RetryPolicy
from workledger.core.states import Actor
from workledger.core.status import CLOSE_STAGE
from workledger.core.text import Unstorable, json_text
from workledger.core.writes import Write
from workledger.errors import BadInput, UsageError
from workledger.results import Submission
from workledger.schedules import Schedule, ScheduleFn
from workledger.schedules import declare as declare_schedule
from workledger.storage.port import StageLimit


class Submitter(Protocol):
    """What a job submits through: the :class:`workledger.Ledger` that defined it."""

    jobs: dict[str, Job]

    def submit(self, job_name: str, payload: Any, key: str | None = None,
               conn: Any = None, *, deadline: Any = None, priority: int = 0,
               tenant: str | None = None) -> Submission: ...

    def submit_many(self, job_name: str, runs: Iterable[tuple[Any, str | None]], *,
                    priority: int = 0, tenant: str | None = None) -> list[Submission]: ...

Decomposer = Callable[[Any], Iterable[Item | Skip]]
Handler = Callable[[Any, Any], Any]
Verify = Callable[[Any, Any], Any]


class ItemView(NamedTuple):
    """What a handler sees: identity and small data (fetch current data when you run).
    An immutable named tuple: one is made per execution."""

    id: int
    run_id: int
    stage: str
    seq: int
    key: str | None
    data: Any


class Context(NamedTuple):
    """Per-execution facts. ``idempotency_key`` is stable across attempts: run/stage/seq.
    An immutable named tuple: one is made per execution."""

    run_id: int
    job: str
    stage: str
    attempt: int
    idempotency_key: str
    worker_id: str
    lease_token: int


class BatchContext(NamedTuple):
    """What a batch handler sees besides its items: one per call. ``attempts`` and
    ``idempotency_keys`` hold one entry per item, in the order of the items."""

    run_id: int
    job: str
    stage: str
    attempts: tuple[int, ...]
    idempotency_keys: tuple[str, ...]
    worker_id: str
    lease_token: int


@dataclass(frozen=True)
class Stage:
    name: str
    handler: Handler
    idempotent: bool = False
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    verify: Verify | None = None
    timeout: float | None = None  # seconds a handler (and the verify hook) may run
    # "thread": the worker's threads; "async": its event loop (an async def handler);
    # None: where it can (its child processes with --processes N, else its threads)
    executor: str | None = None
    batch: int | None = None  # a batch handler: called with up to this many items at once
    rate: Rate | None = None  # cluster-wide: items claimed per second at most (a token bucket)
    burst: float = 1.0  # the bucket's size: tokens a claim may spend at once
    max_in_flight: int | None = None  # cluster-wide: items claimed at once at most
    max_per_key: int | None = None  # cluster-wide: items of one concurrency key at once at most

    @property
    def limited(self) -> bool:
        return (self.rate is not None or self.max_in_flight is not None
                or self.max_per_key is not None)

    def limit(self, default: float | None) -> float | None:
        """Its time limit: its own, else the worker's default (``worker --timeout``)."""
        return self.timeout if self.timeout is not None else default


class Job:
    """A named kind of batch. Create with :meth:`workledger.Ledger.job`.

    >>> job = ledger.job("ingest-events")          # doctest: +SKIP
    >>> @job.decompose
    ... def split(payload): yield Item(key="e1")   # doctest: +SKIP
    """

    def __init__(
        self, ledger: Submitter, name: str, *, tolerate: float | int = 0,
        full_history: bool = False, batch_size: int = 5000, deadline: str | None = None,
        deadline_warning: str | None = None,
    ) -> None:
        problem = text_problem("job name", name, NAME_BYTES)
        if problem is not None:
            raise UsageError(problem)
        # seconds after submission (or firing) a run should be complete by; the warning's lead
        self.deadline = _duration(deadline, f"job {name!r}: deadline")
        self.deadline_warning = _duration(deadline_warning, f"job {name!r}: deadline_warning")
        if self.deadline_warning is not None and self.deadline is None:
            raise UsageError(f"job {name!r}: deadline_warning goes with a deadline")
        self.schedules: list[Schedule] = []
        self.ledger = ledger
        self.name = name
        self.tolerate = tolerate
        self.full_history = full_history
        self.batch_size = batch_size  # item rows written per decomposition transaction
        self.decomposer: Decomposer | None = None
        self.stages: list[Stage] = []
        self.closing: Stage | None = None
        self._after: dict[str, tuple[str | None, Write]] = {}  # a worker's
        self._after_others: dict[Actor, dict[str, tuple[str | None, Write]]] = {}
        self.on_complete_fn: Callable[..., Any] | None = None
        self.on_complete_takes_context = False  # the hook is (status, ctx), not (status)

    def decompose(self, fn: Decomposer) -> Decomposer:
        """Register the function that turns a payload into items (it may yield millions).
        A plain function or generator, never ``async def``: it runs inside ``submit``, which
        may be called from any thread, an event loop's too."""
        if _is_async(fn):
            raise UsageError(f"job {self.name!r}: the decomposer is an async function; a "
                             "decomposer runs inside submit and must be a plain function or "
                             "generator that yields Item(...)")
        self.decomposer = fn
        return fn

    def stage(
        self,
        name: str,
        *,
        idempotent: bool = False,
        max_attempts: int = 5,
        base_delay: float = 1.0,
        max_delay: float = 300.0,
        after: str | None = None,
        verify: Verify | None = None,
        timeout: float | None = None,
        executor: str | None = None,
        batch: int | None = None,
        rate_limit: str | None = None,
        burst: float | None = None,
        max_in_flight: int | None = None,
        max_per_key: int | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register a per-item handler. Stages run in declaration order (``after`` checks it).

        ``executor``: where its handlers run best. ``"process"`` (the default when the worker
        has ``--processes N``): in the worker's child processes, for CPU-bound work;
        ``"thread"``: in the worker's own threads, for I/O-bound work or a handler that needs
        the worker's memory; ``"async"`` (the default, and the only choice, for an ``async
        def`` handler): on the worker's event loop, up to ``--concurrency`` coroutines at
        once, in the worker process whatever ``--processes`` says. A time limit cancels an
        async handler (it sees ``CancelledError``). A verify hook may be ``async def`` too: it
        runs on an event loop of its own in the sweeper, as a plain hook would in its thread.

        ``batch``: the handler is called with a list of up to that many items of one run and
        one :class:`~workledger.BatchContext`, and returns a list of the same length whose
        entries are each a result or an outcome (``Retry(...)``, ``Permanent(...)``,
        ``Skip(...)``): a batch where some items succeeded and some did not. Raising applies to
        the whole batch. Each item keeps its own state, attempts, fencing and idempotency key.

        ``timeout``: seconds a handler may run. One still running then is abandoned: its item
        stays held until the handler has really ended, then is settled as if its holder had
        vanished (idempotent: back to pending, an attempt charged; a verify hook: asked;
        otherwise ``unknown``); its late result is never applied, and the verify hook is held to
        the same limit.

        ``rate_limit`` (``"50/s"``, ``"600/m"``, ``"1000/h"``) and ``max_in_flight``: limits a
        downstream's plan sets, enforced by the ledger over every worker on every machine and
        every run of the job. A token bucket of ``burst`` tokens (default 1) refilled at the
        rate: in any window of one unit of the rate at most ``N + burst - 1`` items are claimed
        (with the default burst, never more than ``N``); a larger burst lets a batch stage
        fill its batches. ``max_in_flight``: at most that many of its items claimed at once.

        ``max_per_key``: at most that many of its items with one concurrency key
        (``Item(concurrency_key=...)``, kept by the unit's later stages) claimed at once, over
        every worker and every run of the job: one posting at a time per account. Counted
        from the claimed rows themselves: a lease that expired holds its slot until the
        sweeper takes the item back. Items without a key are not limited by it."""
        _check_timeout(timeout, f"job {self.name!r}, stage {name!r}")
        rate, burst = _check_limits(f"job {self.name!r}, stage {name!r}", rate_limit, burst,
                                    max_in_flight, max_per_key)
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)
                                  or not 1 <= batch <= limits.CHUNK_MAX):
            raise UsageError(f"job {self.name!r}, stage {name!r}: batch must be a whole number "
                             f"from 1 to {limits.CHUNK_MAX:,}, not {batch!r}")
        if executor not in (None, "thread", "process", "async"):
            raise UsageError(f"job {self.name!r}, stage {name!r}: executor must be 'thread', "
                             f"'process' or 'async', not {executor!r}")
        problem = text_problem("stage name", name, NAME_BYTES)
        if problem is not None:
            raise UsageError(f"job {self.name!r}: {problem}")
        if name.startswith("@"):
            raise UsageError(f"job {self.name!r}: stage {name!r}: names starting with '@' are "
                             f"reserved (the closing hook's stage is {CLOSE_STAGE!r})")
        if any(s.name == name for s in self.stages):
            raise UsageError(f"job {self.name!r} already has a stage {name!r}")
        if after is not None and (not self.stages or self.stages[-1].name != after):
            raise UsageError(f"stage {name!r} must be declared right after stage {after!r}")
        policy = RetryPolicy(max_attempts=max_attempts, base_delay=base_delay, max_delay=max_delay)
        if verify is not None:
            verify = _plain(verify, f"job {self.name!r}, stage {name!r}: the verify hook")

        def register(fn: Handler) -> Handler:
            runs_on = _executor_of(fn, executor, f"job {self.name!r}, stage {name!r}")
            self.stages.append(Stage(name, fn, idempotent, policy, verify, timeout, runs_on,
                                     batch, rate, burst, max_in_flight, max_per_key))
            self._after.clear()
            self._after_others.clear()
            return fn

        return register

    def on_complete(
        self, fn: Callable[[Any], Any] | None = None, *, max_attempts: int = 5,
        base_delay: float = 1.0, timeout: float | None = None,
    ) -> Any:
        """Register the closing hook, called once with the run's ``RunStatus`` when every unit
        is terminal. It is a ledger entry of its own: retried like an item when it raises, and
        re-run if its process dies inside it, so it should be idempotent. A hook whose second
        parameter has no default is given a ``Context`` too, whose ``lease_token`` is its entry's
        claim: every later run of the hook has a higher one, so a hook can fence its
        downstream below its own token before it acts (docs/reliability.md, Clocks: a holder
        paused while its session was ended). ``timeout``: seconds it may run before that
        attempt counts as failed (and is retried). It may be ``async def``: each call runs on
        an event loop of its own in the sweeper."""
        _check_timeout(timeout, f"job {self.name!r}, the closing hook")

        def register(hook: Callable[[Any], Any]) -> Callable[[Any], Any]:
            self.on_complete_fn = _plain(hook, f"job {self.name!r}: the closing hook")
            self.on_complete_takes_context = _takes_two(hook)
            policy = RetryPolicy(max_attempts=max_attempts, base_delay=base_delay)
            self.closing = Stage(CLOSE_STAGE, _unbound_closing, True, policy, None, timeout)
            return hook

        return register(fn) if fn is not None else register

    def schedule(self, spec: str, *, tz: str = "UTC", catch_up: str = "latest",
                 overlap: str = "skip", catch_up_window: str = "1d",
                 name: str | None = None) -> Callable[[ScheduleFn], ScheduleFn]:
        """Declare that this job runs on a calendar: the decorated function is called with
        each planned time (a timezone-aware datetime in ``tz``) by the sweeper that leads, and
        returns the run's payload, ``(payload, key)``, or None (no run for that firing). The
        default key is ``<name>@<fire time, ISO 8601 UTC>``, so one period makes one run.
        ``spec``: a 5-field cron expression or ``"every 30s"`` (``s``, ``m``, ``h``, ``d``).
        ``catch_up`` (after downtime, of the firings missed within ``catch_up_window``):
        ``"all"``, ``"latest"`` or ``"none"``. ``overlap`` (a firing while the schedule's
        previous run is not complete): ``"skip"``, ``"allow"`` or ``"wait"``. ``name``: the
        schedule's name, unique per ledger (default: the function's name)."""

        def register(fn: ScheduleFn) -> ScheduleFn:
            declared = declare_schedule(fn, self.name, spec, tz=tz, catch_up=catch_up,
                                        overlap=overlap, catch_up_window=catch_up_window,
                                        name=name)
            for job in getattr(self.ledger, "jobs", {}).values():
                if any(s.name == declared.name for s in job.schedules):
                    raise UsageError(f"schedule {declared.name!r} of job {self.name!r}: name: "
                                     f"job {job.name!r} declares a schedule of that name "
                                     "already (names are unique per ledger: give name=)")
            if any(s.name == declared.name for s in self.schedules):
                raise UsageError(f"schedule {declared.name!r} of job {self.name!r}: name: "
                                 "declared twice (give name=)")
            self.schedules.append(declared)
            return fn

        return register

    def stage_named(self, name: str) -> Stage:
        if name == CLOSE_STAGE and self.closing is not None:
            return self.closing
        for s in self.stages:
            if s.name == name:
                return s
        raise UsageError(f"job {self.name!r} has no stage {name!r}")

    def next_stage(self, name: str) -> str | None:
        if name == CLOSE_STAGE:
            return None
        names = [s.name for s in self.stages]
        i = names.index(name)
        return names[i + 1] if i + 1 < len(names) else None

    def after_processed(self, name: str, actor: Actor = Actor.WORKER
                        ) -> tuple[str | None, Write]:
        """``(next stage, write)`` when an item of stage ``name`` is processed (no event: the
        hot path of a job without full history)."""
        cache = self._after if actor is Actor.WORKER else self._after_others.setdefault(actor, {})
        found = cache.get(name)  # per item on the hot path: one dict lookup by the stage's name
        if found is None:
            nxt = self.next_stage(name)
            found = cache[name] = (nxt, writes.completed(actor, name, nxt is None))
        return found

    def timed_stages(self, default: float | None) -> dict[str, float]:
        """The stages whose handlers have a time limit, with it."""
        limits = {s.name: s.limit(default) for s in self.stages}
        return {name: t for name, t in limits.items() if t is not None}

    def executors(self, processes: bool) -> frozenset[str]:
        """Where its handlers run (``"thread"``, ``"process"``, ``"async"``) in a worker with
        handler processes or without: what the worker starts for it."""
        return frozenset(s.executor or ("process" if processes else "thread")
                         for s in self.stages)

    def recorded_stages(self) -> frozenset[str]:
        """The stages whose starts a worker records before their handlers run: those that are
        not idempotent, where a worker that dies leaves in doubt only what had started."""
        return frozenset(s.name for s in self.stages if not s.idempotent)

    def claim_plan(self) -> tuple[tuple[str, ...], tuple[StageLimit, ...]]:
        """How a worker claims this job's items: ``((), ())`` when no stage is limited (one
        claim over every stage, in id order); else stage by stage, the last stage first (a
        unit further along is finished first), with the limited stages' limits."""
        limits = tuple(StageLimit(s.name, s.rate.per_second if s.rate else None, s.burst,
                                  s.max_in_flight, s.max_per_key)
                       for s in self.stages if s.limited)
        if not limits:
            return (), ()
        return tuple(s.name for s in reversed(self.stages)), limits

    def limited_stages(self) -> frozenset[str]:
        return frozenset(s.name for s in self.stages if s.limited)

    def submit(self, payload: Any, key: str | None = None, conn: Any = None, *,
               deadline: Any = None, priority: int = 0,
               tenant: str | None = None) -> Submission:
        """Record a run (idempotently, by ``key``), decompose it, and report its real state.
        ``conn``: record it in the caller's open transaction instead, decomposed after the
        commit. ``deadline``: a timezone-aware datetime, or a duration after submission
        (``"2h"``), by which the run should be complete; default: the job's ``deadline``
        ``priority``: -1000 to 1000, higher claimed first; ``tenant``: the customer whose share
        of the claims the run takes (:meth:`workledger.Ledger.submit`)."""
        return self.ledger.submit(self.name, payload, key=key, conn=conn, deadline=deadline,
                                  priority=priority, tenant=tenant)

    def submit_many(self, runs: Iterable[tuple[Any, str | None]], *,
                    priority: int = 0, tenant: str | None = None) -> list[Submission]:
        """Record many runs of this job in one transaction, one per ``(payload, key)`` pair,
        and report each one's real state (:meth:`workledger.Ledger.submit_many`)."""
        return self.ledger.submit_many(self.name, runs, priority=priority, tenant=tenant)

    def check_ready(self) -> None:
        if self.decomposer is None:
            raise UsageError(f"job {self.name!r} has no decomposer (@job.decompose)")
        if not self.stages:
            raise UsageError(f"job {self.name!r} has no stage (@job.stage)")


def _duration(text: str | None, what: str) -> float | None:
    if text is None:
        return None
    try:
        seconds = parse_duration(text)
    except BadDuration as exc:
        raise UsageError(f"{what}: {exc}") from None
    if seconds <= 0:
        raise UsageError(f"{what}: must be above 0")
    return seconds


def _check_timeout(timeout: float | None, what: str) -> None:
    if timeout is not None and not (isinstance(timeout, int | float) and 0 < timeout <= 86_400
                                    and timeout == timeout):
        raise UsageError(f"{what}: timeout must be a number of seconds above 0, at most a day")


def _check_limits(what: str, rate_limit: str | None, burst: float | None,
                  max_in_flight: int | None,
                  max_per_key: int | None = None) -> tuple[Rate | None, float]:
    """The parsed rate and the bucket's size; UsageError for a limit that cannot be met."""
    try:
        rate = None if rate_limit is None else parse_rate(rate_limit)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None
    if burst is not None and (rate is None or isinstance(burst, bool)
                              or not isinstance(burst, int | float)
                              or not 1 <= burst <= limits.CHUNK_MAX):
        raise UsageError(f"{what}: burst goes with a rate_limit and must be a number from 1 to "
                         f"{limits.CHUNK_MAX:,}, not {burst!r}")
    if max_in_flight is not None and (isinstance(max_in_flight, bool)
                                      or not isinstance(max_in_flight, int)
                                      or not 1 <= max_in_flight <= limits.ID_MAX):
        raise UsageError(f"{what}: max_in_flight must be a whole number of at least 1, not "
                         f"{max_in_flight!r}")
    if max_per_key is not None and (isinstance(max_per_key, bool)
                                    or not isinstance(max_per_key, int)
                                    or not 1 <= max_per_key <= limits.CHUNK_MAX):
        raise UsageError(f"{what}: max_per_key must be a whole number from 1 to "
                         f"{limits.CHUNK_MAX:,}, not {max_per_key!r}")
    return rate, float(burst or 1)


def _is_async(fn: Any) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    call = inspect.getattr_static(type(fn), "__call__", None)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _executor_of(fn: Any, asked: str | None, what: str) -> str | None:
    """Where a handler runs: ``"async"`` for an ``async def`` one, else what was asked
    (``"process"`` is None: it is where a handler runs when the worker has processes)."""
    if inspect.isasyncgenfunction(fn):
        raise UsageError(f"{what}: the handler is an async generator; a handler returns one "
                         "result (or raises): make it an async def that returns")
    if _is_async(fn):
        if asked not in (None, "async"):
            raise UsageError(f"{what}: the handler is an async function, which runs on the "
                             f"worker's event loop (executor='async'), not executor={asked!r}")
        return "async"
    if asked == "async":
        raise UsageError(f"{what}: executor='async' needs an async def handler, and "
                         f"{getattr(fn, '__name__', type(fn).__name__)} is a plain function")
    return None if asked == "process" else asked


def _plain(hook: Any, what: str) -> Any:
    """A hook the sweeper can call as a plain function: an ``async def`` one runs to its end
    on an event loop of its own at each call (``asyncio.run``), in the sweeper's thread (or
    the thread that holds it to its time limit), never on the worker's loop."""
    if inspect.isasyncgenfunction(hook):
        raise UsageError(f"{what} is an async generator; a hook returns its answer: make it "
                         "an async def that returns")
    if not _is_async(hook):
        return hook

    @functools.wraps(hook)
    def run(*args: Any) -> Any:
        return asyncio.run(hook(*args))

    return run


def _takes_two(fn: Any) -> bool:
    """Whether ``fn`` asks for a second positional argument: one without a default. A hook
    written ``(status, extra=None)``, ``(*args)``, a mock or a wrapper without
    ``functools.wraps`` is called as ``(status)``, as it always was."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: called as (status)
        return False
    positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 and positional[1].default is inspect.Parameter.empty


def _unbound_closing(item: Any, ctx: Any) -> Any:
    raise RuntimeError("the closing hook is run by the sweeper, not by a worker")


def canonical_json(value: Any, what: str = "payload") -> str:
    """JSON text with sorted keys; NaN, NUL and non-JSON types are refused with a clear message."""
    try:
        return json_text(value, sort_keys=True)
    except Unstorable as exc:
        raise BadInput(f"{what} {exc}") from exc


def default_key(payload_json: str) -> str:
    """Without an explicit key, the same payload is the same run (never a silent second copy)."""
    return "sha256:" + hashlib.sha256(payload_json.encode()).hexdigest()
