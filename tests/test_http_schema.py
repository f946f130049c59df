"""Schemathesis against ``/openapi.json`` on both backends: generated requests to every route
get no 500 and no response that breaks the declared schema (error bodies included), in
process and over HTTP against a real ``workledger serve`` (its guard, its limits, its h11).

(The operations are driven with hypothesis directly: schemathesis' pytest plugin does not run
under the pytest this project uses.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance
from serve_support import served
from web_support import build, cli_env, make_unknown

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


def test_a_real_server_answers_generated_requests_within_its_schema(db_url: str,
                                                                   tmp_path: Path) -> None:
    ledger = build(db_url)
    ledger.submit("numbers", {"n": 4, "fail": [1]}, key="k")
    ledger.work(until_idle=True, jobs=["numbers"])
    ledger.close()
    token = {"Authorization": "Bearer schema-token"}
    with served(db_url, "--export-dir", str(tmp_path), cwd=tmp_path,
                env=cli_env(WORKLEDGER_TOKEN="schema-token")) as server:
        schema = schemathesis.openapi.from_url(server.url + "openapi.json", headers=token)
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 15
        for operation in operations:
            check_operation(operation, examples=10, base_url=server.url.rstrip("/"),
                            headers=token)
        assert server.get("healthz").status_code == 200


def check_operation(operation: Any, examples: int = 25, **call: Any) -> None:
    @given(case=operation.as_strategy())
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        case.call_and_validate(checks=CHECKS, **call)

    run()
