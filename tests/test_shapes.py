"""One definition per shape: a run's status is ``RunStatus`` (results.py) and an item
``ItemRow`` (storage/port.py); ``--json`` (shapes.py) and the API's schema (http/models.py) are
derived from them, so a new field is one edit and the three cannot drift."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, get_args

import pytest

from workledger.api import RESOLVE_TARGETS, ItemRow, RunStatus
from workledger.http.models import ItemBody, ResolveRequest, StatusBody, SubmissionBody, body_of
from workledger.shapes import STATUS_FIELDS

pytestmark = pytest.mark.unit


def names(shape: type[Any]) -> list[str]:
    return [f.name for f in fields(shape)]


def test_the_status_json_and_schema_are_the_fields_of_run_status() -> None:
    assert list(STATUS_FIELDS) == names(RunStatus)
    assert list(StatusBody.model_fields) == names(RunStatus)
    assert list(SubmissionBody.model_fields) == [*names(RunStatus), "created"]


def test_the_item_schema_is_the_fields_of_item_row_each_required() -> None:
    assert list(ItemBody.model_fields) == names(ItemRow)
    schema = ItemBody.model_json_schema()
    assert schema["required"] == names(ItemRow)  # started_at too: a body carries every field


def test_a_field_added_to_the_dataclass_is_in_the_schema_with_its_type() -> None:
    @dataclass(frozen=True)
    class Grown:
        """A shape."""

        a: int
        b: str | None = None

    body = body_of(Grown, "GrownBody", "A grown shape.")
    schema = body.model_json_schema()
    assert (schema["title"], schema["description"]) == ("GrownBody", "A grown shape.")
    assert list(schema["properties"]) == ["a", "b"] and schema["required"] == ["a", "b"]
    assert schema["properties"]["a"]["type"] == "integer"


def test_the_resolve_request_names_the_targets_of_the_resolve_rows() -> None:
    """A Literal is written out for the type checker: it must stay the table's resolve targets."""
    assert get_args(ResolveRequest.model_fields["as_state"].annotation) == RESOLVE_TARGETS
