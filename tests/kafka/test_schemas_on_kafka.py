"""The schema registry on the Kafka backend: two gateways share it through Kafka, a registration
on one is enforced by the other, and it outlives a SIGKILL of the gateway that registered."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from log_store import LogStore
from schema_registry import SchemaRegistry
from tests.conftest import GatewayProcess
from tests.gateway.conftest import meta
from tests.kafka.conftest import envelopes
from tests.schemas.conftest import ORDER_BROKEN, ORDER_V1, ORDER_V2

pytestmark = pytest.mark.kafka


def _write(url: str, source: str, data: bytes) -> httpx.Response:
    body = encode_binary([(meta(source, "orders"), [(1, 0, data)])])
    return httpx.post(
        url + "/v1/write",
        content=body,
        headers={"content-type": BINARY_MEDIA_TYPE},
        timeout=60,
    )


def test_two_gateways_on_kafka_share_the_registry_and_it_survives_a_sigkill(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore
) -> None:
    first = start_kafka_gateway()
    second = start_kafka_gateway()
    registered = httpx.post(
        first.url + "/v1/schemas/orders/versions", json={"schema": ORDER_V1}, timeout=60
    )
    assert registered.status_code == 201, registered.text
    v1 = registered.json()["id"]
    # the other gateway enforces it at once: its first look at the log type is uncached
    refused = _write(second.url, "s-bad", b'{"id": "one"}\n')
    assert refused.status_code == 400 and refused.json()["error"] == "bad_record"
    ok = _write(second.url, "s-good", b'{"id": 1, "amount": 2.5, "city": "Oslo"}\n')
    assert ok.status_code == 200, ok.text
    first.kill()
    # the registry's partition may be the dead gateway's: 503 (Retry-After) within about a
    # second, until the gateways' group hands it on
    deadline = time.monotonic() + 60
    while True:
        incompatible = httpx.post(
            second.url + "/v1/schemas/orders/versions", json={"schema": ORDER_BROKEN}, timeout=60
        )
        if incompatible.status_code != 503 or time.monotonic() > deadline:
            break
        assert incompatible.headers.get("Retry-After"), incompatible.text
        time.sleep(0.5)
    assert incompatible.status_code == 409, incompatible.text
    v2 = httpx.post(
        second.url + "/v1/schemas/orders/versions", json={"schema": ORDER_V2}, timeout=60
    )
    assert v2.status_code == 201 and v2.json()["version"] == 2
    stamped = {
        env.source_id: f"{env.schema_id:016x}"
        for records in envelopes(kafka_store, "dc1.orders").values()
        for _, env in records
    }
    assert stamped == {"s-good": v1}
    # what any process over the same Kafka cluster reads
    found = SchemaRegistry(kafka_store).log_type("orders")
    assert found is not None
    assert [json.loads(v.schema.text) for v in found.versions] == [ORDER_V1, ORDER_V2]
