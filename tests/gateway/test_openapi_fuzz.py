"""Schema-driven fuzzing: schemathesis, driven by ``/openapi.json``, finds no 5xx and no drift.

Every operation the gateway serves is exercised with valid and invalid data; the responses
must be documented statuses with documented bodies, and never a server error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import ignored_auth, positive_data_acceptance

from ingest_api.framing import BINARY_MEDIA_TYPE, NDJSON_MEDIA_TYPE
from tests.conftest import GatewayProcess, openapi_operation

schemathesis.serializer.alias(BINARY_MEDIA_TYPE, "application/octet-stream")


@schemathesis.serializer(NDJSON_MEDIA_TYPE)
def _ndjson(ctx: Any, value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, bytes):
        return value
    return orjson.dumps(value)


TOKEN = "fuzz-token"


@pytest.fixture(scope="module", params=["open", "with-tokens"])
def api_schema(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """The schema of a gateway without auth, and of one with bearer tokens (and its headers)."""
    base = tmp_path_factory.mktemp("fuzzed-gateway")
    args: list[str] = []
    headers: dict[str, str] = {}
    if request.param == "with-tokens":
        config = base / "gateway.toml"
        config.write_text(f'[tokens.{TOKEN}]\nwrite = ["*"]\nread = ["*"]\nmetrics = true\n')
        args = ["--config", str(config)]
        headers = {"Authorization": f"Bearer {TOKEN}"}
    gateway = GatewayProcess(base / "data", args, base / "gateway.log").start()
    try:
        yield schemathesis.openapi.from_url(gateway.url + "/openapi.json"), headers
    finally:
        gateway.kill()


OPERATIONS = [
    "POST /v1/sessions",
    "POST /v1/write",
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
]


@pytest.mark.slow
@pytest.mark.parametrize("operation", OPERATIONS)
def test_api_answers_generated_requests_without_a_server_error(
    api_schema: Any, operation: str
) -> None:
    api_schema, headers = api_schema
    path = operation.split(" ")[1]

    @given(openapi_operation(api_schema, operation).as_strategy())
    @settings(
        max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    def call(case: Any) -> None:
        response = case.call_and_validate(
            headers=headers, excluded_checks=excluded, additional_checks=extra
        )
        statuses.append(response.status_code)

    # JSON Schema cannot say which byte strings are valid binary framing, so a generated
    # "schema-valid" binary body is almost always rejected, rightly, with 400
    excluded = [positive_data_acceptance] if path == "/v1/write" else []
    # with tokens: the same requests without the token must be refused
    extra = [ignored_auth] if headers and path.startswith("/v1/") else []
    statuses: list[int] = []

    call()
    if path == "/v1/sessions":
        assert 200 in statuses, "no generated session request was accepted"
