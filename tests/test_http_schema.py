"""Schemathesis against ``/openapi.json`` on both backends: generated requests to every route
get no 500 and no response that breaks the declared schema (error bodies included).

(The operations are driven with hypothesis directly: schemathesis' pytest plugin does not run
under the pytest this project uses.)
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance
from web_support import build, make_unknown

from workledger.http import create_app

pytestmark = pytest.mark.integration
CHECKS = [not_a_server_error, response_schema_conformance]


def test_no_server_error_and_every_response_matches_the_schema(db_url: str) -> None:
    ledger = build(db_url)
    try:
        ledger.submit("numbers", {"n": 4, "fail": [1], "skip": [0]}, key="k")
        ledger.work(until_idle=True, jobs=["numbers"])
        make_unknown(ledger, ledger.submit("sends", {"n": 2}, key="s").run_id)
        schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(ledger))
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 15
        for operation in operations:
            check_operation(operation)
    finally:
        ledger.close()


def check_operation(operation: Any) -> None:
    @given(case=operation.as_strategy())
    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        case.call_and_validate(checks=CHECKS)

    run()
