"""Every change of ``wl_items.state`` in either ``.sql`` file is a row of ``core.states.MOVES``.

For each named query the test derives, from the SQL text itself, whether it writes an item's
state, the literal state it writes (``SET state = 'claimed'``, or the column default of an
INSERT) and the literal states it guards on (``state = 'pending'``, ``state IN (...)``). Where
the target or the guard is a parameter, the query's ``-- moves:`` line says which states it
may be; literal ones must agree with that line. Every resulting (from, to) pair must be in the
table, and every row of the table must name a query that makes its pair.
"""

from __future__ import annotations

import re

import pytest

from workledger.core.states import MOVES, ItemState
from workledger.storage.queries import queries

pytestmark = pytest.mark.unit

DIALECTS = ("sqlite", "postgres")
STATES = {s.value for s in ItemState}
Pair = tuple[str | None, str]

_MOVES_LINE = re.compile(r"^--\s*moves:\s*(.+)$", re.MULTILINE)
_SET_LIST = re.compile(r"\bUPDATE\s+wl_items\s+SET\b(.*?)(?:\bFROM\b|\bWHERE\b|\bRETURNING\b)",
                       re.DOTALL | re.IGNORECASE)
_SET_STATE = re.compile(r"(?:^|,)\s*state\s*=\s*([^,\n]+)", re.IGNORECASE)
_INSERT = re.compile(r"\bINSERT\s+INTO\s+wl_items\s*\(([^)]*)\)", re.IGNORECASE)
_GUARD_EQ = re.compile(r"\b(?:\w+\.)?state(?:\s+COLLATE\s+\"C\")?\s*=\s*('[a-z]+'|[:%]\S+)",
                       re.IGNORECASE)
_GUARD_IN = re.compile(r"\b(?:\w+\.)?state\s+IN\s*\(([^)]*)\)", re.IGNORECASE)


def _code(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def annotated(sql: str) -> set[Pair]:
    found = _MOVES_LINE.findall(sql)
    pairs: set[Pair] = set()
    for line in found:
        for part in line.split(";"):
            source, _, targets = part.partition("->")
            src = source.strip()
            for target in targets.split(","):
                pairs.add((None if src == "(none)" else src, target.strip()))
    return pairs


def derived(sql: str) -> tuple[set[str] | None, set[str] | None, bool]:
    """(literal targets or None if a parameter, literal guards or None if a parameter,
    whether the statement writes wl_items.state at all)."""
    code = _code(sql)
    if (insert := _INSERT.search(code)) is not None:
        columns = [c.strip() for c in insert.group(1).split(",")]
        return (None if "state" in columns else {"pending"}), {"(none)"}, True
    set_list = _SET_LIST.search(code)
    if set_list is None:
        return set(), set(), False
    assigned = _SET_STATE.findall(set_list.group(1))
    if not assigned:
        return set(), set(), False
    value = assigned[0].strip()
    targets = {value.strip("'")} if value.startswith("'") else None
    rest = code.replace(set_list.group(1), " ")
    guards: set[str] | None = set()
    for literal in _GUARD_EQ.findall(rest):
        if not literal.startswith("'"):
            guards = None
            break
        guards.add(literal.strip("'"))
    if guards is not None:
        for listed in _GUARD_IN.findall(rest):
            guards |= {v.strip().strip("'") for v in listed.split(",")}
    return targets, guards, True


def state_writers(dialect: str) -> dict[str, str]:
    return {name: sql for name, sql in queries(dialect).items() if derived(sql)[2]}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_statement_that_writes_an_item_state_says_which_moves_it_makes(
    dialect: str,
) -> None:
    for name, sql in queries(dialect).items():
        writes = derived(sql)[2]
        has_line = bool(_MOVES_LINE.search(sql))
        assert writes == has_line, (
            f"{dialect} {name}: writes wl_items.state={writes} but has a '-- moves:' line="
            f"{has_line}")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_literal_states_in_the_sql_agree_with_the_moves_line(dialect: str) -> None:
    for name, sql in state_writers(dialect).items():
        targets, guards, _ = derived(sql)
        pairs = annotated(sql)
        assert {t for _s, t in pairs} <= STATES, f"{dialect} {name}: unknown state in {pairs}"
        if targets is not None:
            assert {t for _s, t in pairs} == targets, f"{dialect} {name}: SET says {targets}"
        if guards is not None:
            sources = {"(none)" if s is None else s for s, _t in pairs}
            assert sources == guards, f"{dialect} {name}: the guard says {guards}"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_pair_the_sql_can_make_is_a_row_of_the_table(dialect: str) -> None:
    table = {(None if m.source is None else m.source.value, m.target.value) for m in MOVES}
    for name, sql in state_writers(dialect).items():
        missing = annotated(sql) - table
        assert not missing, f"{dialect} {name} makes {missing}, which core/states.py lacks"


def test_both_dialects_make_the_same_moves_per_query() -> None:
    sqlite, postgres = state_writers("sqlite"), state_writers("postgres")
    assert set(sqlite) == set(postgres)
    for name in sqlite:
        assert annotated(sqlite[name]) == annotated(postgres[name]), name


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_row_of_the_table_names_a_query_that_makes_its_move(dialect: str) -> None:
    writers = state_writers(dialect)
    for m in MOVES:
        assert m.where in writers, f"{m.name}: no statement {m.where!r} writes item states"
        pair = (None if m.source is None else m.source.value, m.target.value)
        assert pair in annotated(writers[m.where]), f"{m.name}: {m.where} does not make {pair}"


def test_the_derivation_sees_literal_states_and_parameters() -> None:
    """The parser itself, on statements shaped like ours (so a regex slip cannot pass all)."""
    claim = "UPDATE wl_items SET state = 'claimed', lease_until = 1 WHERE state = 'pending'"
    assert derived(claim) == ({"claimed"}, {"pending"}, True)
    settle = ("UPDATE wl_items SET state = f.state, error = f.error FROM x AS f "
              "WHERE wl_items.state = :from_state")
    assert derived(settle) == (None, None, True)
    pg = "UPDATE wl_items SET lease_until = NULL WHERE state COLLATE \"C\" = 'claimed'"
    assert derived(pg)[2] is False
    insert = "INSERT INTO wl_items (run_id, stage, seq) SELECT 1, 2, 3"
    assert derived(insert) == ({"pending"}, {"(none)"}, True)
