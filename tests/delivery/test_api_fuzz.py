"""Schema-driven fuzzing of the read, group, push, replica and legacy endpoints: no 5xx, on a
gateway without auth and on one with tokens (where every request without one must be 401)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import ignored_auth, positive_data_acceptance

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
    "GET /v1/subscriptions/{subscription}",
    "POST /v1/replica/{topic}/partitions/{partition}",
    "POST /store",
    "POST /commit_request",
    "POST /commit",
]


TOKEN = "fuzz-token"


@pytest.fixture(scope="module", params=["open", "with-tokens"])
def api_schema(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("fuzzed-delivery")
    args: list[str] = []
    headers: dict[str, str] = {}
    if request.param == "with-tokens":
        config = base / "gateway.toml"
        config.write_text(f'[tokens.{TOKEN}]\nwrite = ["*"]\nread = ["*"]\nreplicate = ["*"]\n')
        args = ["--config", str(config)]
        headers = {"Authorization": f"Bearer {TOKEN}"}
    gateway = GatewayProcess(base / "data", args, base / "gateway.log").start()
    writer = Writer(gateway.url, token=TOKEN if headers else None)
    writer.write("src0", [1, 2, 3])
    writer.close()
    try:
        yield schemathesis.openapi.from_url(gateway.url + "/openapi.json"), headers
    finally:
        gateway.kill()


@pytest.mark.slow
@pytest.mark.parametrize("operation", OPERATIONS)
def test_delivery_endpoints_answer_generated_requests_without_a_server_error(
    api_schema: Any, operation: str
) -> None:
    api_schema, headers = api_schema

    @given(openapi_operation(api_schema, operation).as_strategy())
    @settings(
        max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    def call(case: Any) -> None:
        case.call_and_validate(
            headers=headers,
            excluded_checks=[positive_data_acceptance],
            additional_checks=[ignored_auth] if headers else [],
        )

    call()
