"""One parser of durations ("30s", "5m", "2h", "7d", "2w"; src/workledger/core/durations.py)
behind every place that reads one: prune's ``--finished-before`` and ``serve --prune-after``
(``Ledger.parse_duration``), the ages of ``audit --since`` (``since_time``), and the units of a
stage's ``rate_limit``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workledger.api import parse_duration as ledger_duration
from workledger.api import since_time
from workledger.core.durations import UNIT_SECONDS, BadDuration, parse_duration, seconds_of
from workledger.core.rates import parse_rate
from workledger.errors import BadInput

pytestmark = pytest.mark.unit

BAD = "bad duration {!r}: expected a number and a unit, like 30d, 12h, 90m or 45s"


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30), ("5m", 300), ("2h", 7200), ("7d", 604800), ("2w", 1209600), ("0s", 0),
    ("1.5h", 5400), (" 90 m ", 5400), ("7D", 604800), ("45S", 45),
])
def test_a_number_and_a_unit_is_that_many_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds == seconds_of(text)


@pytest.mark.parametrize("text", [
    "", "soon", "30", "d", "-5m", "5x", "5 m s", "1e3s", "5mm", ".5h", "5.h", "1_000s", "5 / s",
])
def test_anything_else_is_one_line_naming_the_forms(text: str) -> None:
    assert seconds_of(text) is None
    with pytest.raises(BadDuration) as raised:
        parse_duration(text)
    assert str(raised.value) == BAD.format(text)
    assert isinstance(raised.value, ValueError)


def test_what_is_not_text_is_not_a_duration() -> None:
    assert seconds_of(None) is None
    with pytest.raises(BadDuration, match="bad duration None"):
        parse_duration(None)


amounts = st.one_of(
    st.integers(0, 10**12).map(str),
    st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)).map(lambda t: f"{t[0]}.{t[1]}"),
)
spaces = st.sampled_from(["", " ", "  ", "\t"])


@given(amount=amounts, unit=st.sampled_from(sorted(UNIT_SECONDS)), upper=st.booleans(),
       before=spaces, between=spaces, after=spaces)
def test_the_seconds_written_read_back_as_the_same_seconds(
    amount: str, unit: str, upper: bool, before: str, between: str, after: str
) -> None:
    text = f"{before}{amount}{between}{unit.upper() if upper else unit}{after}"
    assert parse_duration(text) == float(amount) * UNIT_SECONDS[unit]


@given(st.text(max_size=12))
def test_any_text_is_a_duration_or_one_line_of_error(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except BadDuration as exc:
        assert "\n" not in str(exc) and seconds_of(text) is None
    else:
        assert seconds >= 0 and seconds_of(text) == seconds


def test_the_ledger_says_a_bad_duration_as_bad_input_with_the_same_line() -> None:
    assert ledger_duration("30d") == 30 * 86400
    with pytest.raises(BadInput) as raised:
        ledger_duration("soon")
    assert str(raised.value) == BAD.format("soon")


def test_since_takes_its_ages_from_the_same_parser() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    for text in ("30m", "24h", "7d", "2w", "1.5h", "7D"):
        expected = now - timedelta(seconds=parse_duration(text))
        assert since_time(text, now) == since_time(expected.isoformat(), now), text
    with pytest.raises(BadInput, match=r"--since 'soon': give an age \(30m, 24h, 7d, 2w\)"):
        since_time("soon", now)


def test_a_rate_per_unit_is_a_count_per_that_units_seconds() -> None:
    for unit in "smh":
        assert parse_rate(f"60/{unit}").per == UNIT_SECONDS[unit] == parse_duration(f"1{unit}")
