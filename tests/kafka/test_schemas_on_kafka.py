"""The schema registry on the Kafka backend: two gateways share it through Kafka, a registration
on one is enforced by the other, and it outlives a SIGKILL of the gateway that registered;
``logbroker schemas register`` right after its owner's SIGKILL waits out the 503s."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from log_store import LogStore
from schema_registry import REGISTRY_TOPIC, SchemaRegistry
from tests.conftest import GatewayProcess, logbroker_cmd
from tests.gateway.conftest import meta
from tests.kafka.conftest import envelopes, wait_until
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


def test_a_register_right_after_the_registrys_owner_died_waits_for_the_next_owner(
    start_kafka_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    # the group takes a dead gateway for dead after 15 s: the registry's partition stays
    # without a live owner (503) for longer than the command takes to start
    gateways = [
        start_kafka_gateway("--log-level", "info", session_timeout_ms=15_000) for _ in range(2)
    ]
    first = httpx.post(
        gateways[0].url + "/v1/schemas/orders/versions", json={"schema": ORDER_V1}, timeout=60
    )
    assert first.status_code == 201, first.text

    def owner() -> GatewayProcess | None:
        """The gateway whose last word on the registry's partition is that it took it over."""
        holding = []
        for gateway in gateways:
            last = ""
            for line in gateway.log_path.read_text().splitlines():
                if f"took over {REGISTRY_TOPIC}/0 in " in line:
                    last = "took over"
                elif re.search(rf"gives up .*{re.escape(REGISTRY_TOPIC)}/0\b", line):
                    last = "gave up"
            if last == "took over":
                holding.append(gateway)
        return holding[0] if len(holding) == 1 else None

    wait_until(owner, 30, "the registry's partition to be taken over")
    time.sleep(5)  # the other gateway's look at the new topic may move it: wait for that
    dead = wait_until(owner, 30, "one owner of the registry's partition")
    survivor = next(g for g in gateways if g is not dead)
    dead.kill()
    v2 = tmp_path / "v2.avsc"
    v2.write_text(json.dumps(ORDER_V2))
    done = subprocess.run(
        logbroker_cmd("schemas", "register", "--server", survivor.url, "orders", str(v2)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("orders: registered as version 2"), done.stdout
    # it met the partition without a live owner, said so once, and waited
    assert "503 partition_unavailable" in done.stderr, done.stderr
    assert done.stderr.count("waiting for a gateway to answer") == 1, done.stderr
