"""Schema-driven fuzzing of the read, group, push, replica and legacy endpoints: no 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance

from delivery.framing import BINARY_MEDIA_TYPE
from tests.conftest import GatewayProcess, openapi_operation
from tests.delivery.conftest import Writer

schemathesis.serializer.alias(BINARY_MEDIA_TYPE, "application/octet-stream")

OPERATIONS = [
    "GET /v1/topics",
    "GET /v1/topics/{topic}",
    "GET /v1/topics/{topic}/partitions/{partition}/messages",
    "POST /v1/fetch",
    "GET /v1/groups/{group}",
    "POST /v1/groups/{group}/members",
    "POST /v1/groups/{group}/members/{member}/heartbeat",
    "DELETE /v1/groups/{group}/members/{member}",
    "POST /v1/groups/{group}/offsets",
    "POST /v1/subscriptions",
    "GET /v1/subscriptions/{name}",
    "POST /v1/replica/{topic}/partitions/{partition}",
    "POST /store",
    "POST /commit_request",
    "POST /commit",
]


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("fuzzed-delivery")
    gateway = GatewayProcess(base / "data", [], base / "gateway.log").start()
    writer = Writer(gateway.url)
    writer.write("src0", [1, 2, 3])
    writer.close()
    try:
        yield schemathesis.openapi.from_url(gateway.url + "/openapi.json")
    finally:
        gateway.kill()


@pytest.mark.slow
@pytest.mark.parametrize("operation", OPERATIONS)
def test_delivery_endpoints_answer_generated_requests_without_a_server_error(
    api_schema: Any, operation: str
) -> None:
    @given(openapi_operation(api_schema, operation).as_strategy())
    @settings(
        max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    def call(case: Any) -> None:
        case.call_and_validate(excluded_checks=[positive_data_acceptance])

    call()
