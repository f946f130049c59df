"""The pure text rules: JSON both databases keep alike, reading any row back, masking
passwords and showing control characters (src/workledger/core/text.py, core/limits.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workledger.core.limits import DEPTH, KEY_BYTES, text_problem
from workledger.core.text import (
    Undecodable,
    Unstorable,
    json_text,
    mask_secrets,
    mask_url,
    read_json,
    reason_text,
    too_deep,
    visible,
)

pytestmark = pytest.mark.unit


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


# -- numbers as PostgreSQL keeps them -------------------------------------------------------------

# What PostgreSQL's jsonb returns for each number (checked against the server in
# tests/test_hostile_corpus.py); json_text writes the same text, so both databases agree.
PG_FORMS = {1e20: "100000000000000000000", -0.0: "0.0", 1e16: "10000000000000000",
            1e-7: "0.0000001", -1.5e-5: "-0.000015", 1e15: "1000000000000000.0",
            0.1: "0.1", 12.0: "12.0", 5: "5"}


@pytest.mark.parametrize("number", list(PG_FORMS))
def test_numbers_are_written_as_the_plain_decimals_postgresql_keeps(number: float) -> None:
    assert json_text({"v": number}) == f'{{"v":{PG_FORMS[number]}}}'


def test_a_huge_exponent_becomes_its_plain_decimal() -> None:
    assert json_text(1.5e300) == "15" + "0" * 299


def test_exponents_inside_strings_are_left_alone() -> None:
    text = json_text({"a": "1e+20 and -0.0", "1e-07": [1e20, "x\\"]}, sort_keys=True)
    assert text == '{"1e-07":[100000000000000000000,"x\\\\"],"a":"1e+20 and -0.0"}'


storable_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                             blacklist_characters="\x00"))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | storable_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(storable_text, inner,
                                                                 max_size=4),
    max_leaves=20)


@given(json_values)
def test_the_written_text_reads_back_to_itself(value: Any) -> None:
    text = json_text(value, sort_keys=True)
    assert json_text(json.loads(text), sort_keys=True) == text


# -- what cannot be stored ------------------------------------------------------------------------


def test_a_literal_backslash_u0000_is_not_a_nul() -> None:
    assert json_text({"path": "C:\\u0000dir"}) == '{"path":"C:\\\\u0000dir"}'
    assert json_text({"path": "C:\\\\\\u0000"})  # three backslashes, then u0000: still text


@pytest.mark.parametrize("value", [{"x": "a\x00b"}, ["\\\x00"], {"k\x00": 1}])
def test_a_real_nul_is_refused(value: Any) -> None:
    with pytest.raises(Unstorable, match="NUL"):
        json_text(value)


def test_the_deepest_document_is_stored_and_one_level_more_is_refused() -> None:
    assert json_text(nested(DEPTH))
    with pytest.raises(Unstorable, match=f"deeper than {DEPTH} levels"):
        json_text(nested(DEPTH + 1))


def test_a_document_too_deep_for_python_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(Unstorable, match="nested deeper"):
        json_text(nested(5000))


def test_a_document_over_the_size_limit_is_refused() -> None:
    with pytest.raises(Unstorable, match="the limit is 100 bytes"):
        json_text("x" * 101, max_bytes=100)


def test_depth_counts_levels_not_brackets() -> None:
    wide = [[1]] * 1000  # 1,001 brackets, two levels
    assert not too_deep(wide, json.dumps(wide))
    assert too_deep(nested(DEPTH + 1))
    assert not too_deep(nested(DEPTH))
    assert not too_deep("[[[[" * 100)  # brackets inside a string are no nesting


# -- reading any row back -------------------------------------------------------------------------


def test_reading_a_row_nested_beyond_the_limit_gives_a_marker_not_an_error() -> None:
    for text in ("[" * 2000 + "]" * 2000, json.dumps(nested(DEPTH + 1))):
        value = read_json(text)
        assert isinstance(value, Undecodable) and "nested deeper than 64" in value
    assert read_json(json.dumps(nested(DEPTH))) == nested(DEPTH)
    assert read_json(b'{"a": [1, 2]}') == {"a": [1, 2]}


def test_reading_an_integer_python_cannot_convert_gives_a_marker() -> None:
    value = read_json("1" * 5000)
    assert isinstance(value, Undecodable) and "4300 digits" in value


# -- passwords ------------------------------------------------------------------------------------

SECRET_FORMS = [
    "postgresql://u:S3CRET@h:5432/db",
    "postgresql://:S3CRET@h/db",
    "postgresql://u:S3%40CRET@h/db",
    "postgresql://u:S3@CRET@h/db",
    "postgresql://u:S3/CRET@h/db",
    "postgressql://u:S3CRET@h/db",
    "postgresql://u@h/db?password=S3CRET",
    "postgresql://u@h/db?sslmode=require&password=S3CRET&connect_timeout=3",
    "host=h password=S3CRET dbname=x",
    "host=h password = 'S3 CRET' dbname=x",
    "PGPASSWORD=S3CRET",
    "error: cannot open 'postgresql://u:S3CRET@h/db': refused",
]


@pytest.mark.parametrize("text", SECRET_FORMS)
def test_passwords_are_masked_in_every_form(text: str) -> None:
    masked = mask_secrets(text)
    assert "S3" not in masked and "CRET" not in masked and "***" in masked


def test_a_url_without_a_password_is_shown_whole() -> None:
    for url in ("postgresql://postgres@127.0.0.1:5432/test", "sqlite:///workledger.db",
                "sqlite:////tmp/a b.db"):
        assert mask_url(url) == url


@pytest.mark.parametrize("url", ["u:S3CRET@h/db", "postgresql//u:S3CRET@h/db",
                                 "postgresql:u:S3CRET@h"])
def test_a_database_url_without_a_scheme_is_masked_too(url: str) -> None:
    assert "S3CRET" not in mask_url(url)


def test_reasons_are_stored_storable_and_masked() -> None:
    assert reason_text("cannot reach postgresql://app:S3CRET@db/x\x00") == \
        "cannot reach postgresql://app:***@db/x\\x00"


# -- terminal escapes -----------------------------------------------------------------------------


def test_control_characters_are_shown_as_escapes() -> None:
    key = "k\x1b]0;owned\x07\x1b[2J\x9b31m\u202eevil\x7f\n"
    assert visible(key) == "k\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202eevil\\x7f\\x0a"
    assert visible("line 1\nline\t2", newlines=True) == "line 1\nline\\x092"
    assert visible("plain ünïcode, 日本") == "plain ünïcode, 日本"
    assert visible("lone \udcff") == "lone \\udcff"


# -- keys and names -------------------------------------------------------------------------------


def test_keys_and_names_are_checked_in_utf8_bytes() -> None:
    assert text_problem("key", "k" * KEY_BYTES, KEY_BYTES) is None
    assert "1,001 bytes; the limit is 1,000" in str(text_problem("key", "k" * 1001, KEY_BYTES))
    assert "bytes" in str(text_problem("key", "é" * 501, KEY_BYTES))  # 1,002 bytes
    assert "NUL" in str(text_problem("key", "a\x00", KEY_BYTES))
    assert "surrogate" in str(text_problem("key", "a\udcff", KEY_BYTES))
    assert "empty" in str(text_problem("key", "", KEY_BYTES))
    assert "text" in str(text_problem("key", 5, KEY_BYTES))
