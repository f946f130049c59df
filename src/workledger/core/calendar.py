"""Which of a schedule's planned firings to submit now: the catch-up rule, with no clock.

Given where the schedule stands (``next_at``: its next planned firing not yet recorded), the
database's ``now`` and the planned times from there on, :func:`plan` says which firings to
record now, oldest first, each with the next fire time its transaction moves the schedule to,
and how many planned firings are passed over (docs/design.md, "Schedules and deadlines"):

- a firing more than ``window`` seconds old is missed, whatever the rule;
- ``all``: every other due firing, each once, oldest first (at most ``per_pass`` now, the rest
  at the next pass);
- ``latest``: only the most recent due firing;
- ``none``: only a firing found on time: the one firing due (none missed before it) and at
  most ``LATE`` seconds late; after downtime that passed over a firing, nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

LATE = 60.0  # seconds: a firing found later than this is not "on time" (catch_up="none")
PER_PASS = 100  # firings of one schedule recorded per sweeper pass (catch_up="all")
SCAN = 100_000  # planned times looked at per pass at most (an "every 1s" schedule down a day)


@dataclass(frozen=True)
class Step:
    """One firing to record: its time, the next fire time it expects, the one it moves to."""

    fire_at: datetime
    expected: datetime
    next_at: datetime
    missed: int  # planned firings passed over before it


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    # with no step: move the schedule from ``next_at`` to ``skip_to``, ``missed`` passed over
    skip_to: datetime | None = None
    missed: int = 0


def plan(next_at: datetime, now: datetime, times: Callable[[datetime], Iterator[datetime]],
         catch_up: str, window: float, *, late: float = LATE, per_pass: int = PER_PASS,
         last: Callable[[datetime], datetime] | None = None) -> Plan:
    """``times(t)``: the planned times at or after ``t``, in order, without end; ``last(t)``:
    the last one at or before ``t``, so that "latest" and "none" need not walk more than
    ``SCAN`` of them after a long downtime (the count passed over is then at least ``SCAN``)."""
    if next_at > now:
        return Plan(())
    oldest = now - timedelta(seconds=window)
    missed, start = 0, next_at
    if next_at < oldest:  # downtime longer than the window: what lies before it is missed
        for t in times(next_at):
            if t >= oldest or missed >= SCAN:
                break
            missed += 1
        start = oldest
    due: list[datetime] = []
    passed = 0  # due firings that catch_up "latest" or "none" passes over
    upcoming = None
    for seen, t in enumerate(times(start)):
        if t > now:
            upcoming = t
            break
        if catch_up != "all" and seen >= SCAN and last is not None:  # jump to the end
            due = [last(now)]
            passed = max(passed, SCAN)
            upcoming = next(times(now + timedelta(microseconds=1)))
            break
        if catch_up != "all" and due:
            passed += 1
            due[0] = t
        else:
            due.append(t)
        if len(due) > per_pass:
            break
    if not due:
        assert upcoming is not None
        return Plan((), skip_to=upcoming, missed=missed)
    if catch_up == "all":
        firing = due[:per_pass]
        following = due[per_pass:] + ([upcoming] if upcoming is not None else [])
        steps = []
        expected = next_at
        for i, t in enumerate(firing):
            nxt = firing[i + 1] if i + 1 < len(firing) else following[0]
            steps.append(Step(t, expected, nxt, missed if i == 0 else 0))
            expected = nxt
        return Plan(tuple(steps))
    assert upcoming is not None
    latest = due[0]
    if catch_up == "none" and (missed or passed or (now - latest).total_seconds() > late):
        return Plan((), skip_to=upcoming, missed=missed + passed + 1)
    return Plan((Step(latest, next_at, upcoming, missed + passed),))
