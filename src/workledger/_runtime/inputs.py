"""What a caller gives the facade, checked against the limits of ``core/limits.py`` before
anything is written, the same way on both backends: a failed check is :class:`BadInput`."""

from __future__ import annotations

from datetime import datetime

from workledger.core import limits
from workledger.core.durations import BadDuration, parse_duration
from workledger.errors import BadInput
from workledger.storage.port import Deadline


def check_key(key: str | None) -> None:
    """A run's idempotency key (None: the payload's hash is the key)."""
    if key is not None:
        _check("key", key, limits.KEY_BYTES)


def check_name(what: str, name: str | None) -> None:
    """A job or stage name, given or used as a filter (None: no filter)."""
    if name is not None:
        _check(what, name, limits.NAME_BYTES)


def check_limit(limit: int) -> None:
    """How many rows a listing returns."""
    if not 1 <= limit <= limits.LIST_MAX:
        raise BadInput(f"limit {limit} is out of range: a listing returns 1 to "
                       f"{limits.LIST_MAX:,} rows (page with --after / --before for more)")


def check_id(what: str, value: int | None) -> None:
    """A run id, an item id or seq: both databases hold 64-bit integers."""
    if value is not None and not 0 <= value <= limits.ID_MAX:
        raise BadInput(f"{what} {value} is out of range (0 to {limits.ID_MAX})")


def priority_of(value: object) -> int:
    """A run's priority: a whole number from -1000 to 1000 (a bool or a float is refused)."""
    return _whole("priority", value, limits.PRIORITY_MIN, limits.PRIORITY_MAX)


def _whole(what: str, value: object, low: int, high: int) -> int:
    """A whole number from ``low`` to ``high`` (a bool or a float is refused)."""
    if type(value) is not int:
        raise BadInput(f"{what}: expected a whole number from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise BadInput(f"{what} {value} is out of range ({low} to {high})")
    return value


def tenant_of(value: object) -> str | None:
    """A run's tenant as stored: None for none and for ``"default"`` (the runs without one
    share the default tenant). Printable text without spaces, at most 200 bytes; ``"other"``
    is /metrics' label for the tenants past its bounded set, never a tenant's name."""
    if value is None:
        return None
    name = tenant_name(value)
    return None if name == limits.DEFAULT_TENANT else name


def tenant_name(value: object) -> str:
    """A tenant's name as ``set_tenant_weight`` and the filters take it ("default" included)."""
    _check("tenant", value, limits.TENANT_BYTES)
    name = str(value)
    if not name.isprintable() or any(c.isspace() for c in name):
        raise BadInput(f"tenant {name!r}: expected printable text without spaces")
    if name == limits.OTHER_TENANTS:
        raise BadInput(f"tenant {name!r} is reserved: it is /metrics' label for the tenants "
                       "past its 50 busiest")
    return name


def weight_of(value: object) -> int:
    """A tenant's weight: a whole number from 1 to 1000 (a bool or a float is refused)."""
    return _whole("weight", value, limits.WEIGHT_MIN, limits.WEIGHT_MAX)


def _check(what: str, value: object, max_bytes: int) -> None:
    problem = limits.text_problem(what, value, max_bytes)
    if problem is not None:
        raise BadInput(problem)


def deadline_of(given: object, after: float | None, warn_before: float | None) -> Deadline | None:
    """A submission's deadline: ``given`` (an aware datetime, or a duration after submission
    such as ``"2h"``), else the job's ``after`` seconds; None without either. BadInput for a
    naive datetime or anything else."""
    if given is None:
        return None if after is None else Deadline(after=after, warn_before=warn_before)
    if isinstance(given, datetime):
        if given.tzinfo is None or given.utcoffset() is None:
            raise BadInput("deadline: a datetime must be timezone-aware "
                           "(datetime.now(timezone.utc) + timedelta(hours=2), say)")
        return Deadline(at=given, warn_before=warn_before)
    if isinstance(given, str):
        try:
            seconds = parse_duration(given)
        except BadDuration as exc:
            raise BadInput(f"deadline: {exc}") from None
        if seconds <= 0:
            raise BadInput("deadline: must be above 0")
        return Deadline(after=seconds, warn_before=warn_before)
    raise BadInput(f"deadline: expected a timezone-aware datetime or a duration like '2h', "
                   f"not {type(given).__name__}")
