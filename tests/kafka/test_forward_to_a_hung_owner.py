"""A write whose partition's owner hangs is answered within the operation timeout and a few
seconds, through the gateway that forwarded it: not after the timeout and 10 s more, waited
for once per try (20-35 s with Kafka away, beyond a 30 s client's patience)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import httpx
import pytest

from log_store import LogStore, TopicConfig
from tests.conftest import GatewayProcess
from tests.gateway.conftest import Client
from tests.kafka.conftest import source_seqnos, wait_until

pytestmark = pytest.mark.kafka

OPERATION_TIMEOUT_S = 10.0  # the Kafka test gateways' (tests/kafka/conftest.py)


def _owners(url: str) -> dict[int, str]:
    answer = httpx.get(f"{url}/v1/topics/dc1.app/owners", timeout=10)
    if answer.status_code != 200:
        return {}
    return {p["partition"]: (p["owner"] or "").rstrip("/") for p in answer.json()["partitions"]}


def test_a_write_forwarded_to_a_hung_owner_is_answered_within_the_operation_timeout(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore
) -> None:
    kafka_store.create_topic("dc1.app", TopicConfig(partitions=4))
    first, second = start_kafka_gateway(), start_kafka_gateway()
    wait_until(
        lambda: set(_owners(first.url).values()) == {first.url, second.url}, 60, "both to own"
    )
    client = Client(first.url, timeout_s=120)
    owners = _owners(first.url)
    source = next(
        s
        for s in (f"hung-{n}" for n in range(64))
        if owners.get(client.session(s)["partition"]) == second.url
    )
    assert [a["status"] for a in client.acks(source, [1])] == ["written"]
    assert second.proc is not None
    os.kill(second.proc.pid, signal.SIGSTOP)  # the owner hangs: connections open, no answer
    try:
        started = time.monotonic()
        response = client.write(source, [2])
        took = time.monotonic() - started
        assert response.status_code in (200, 503), response.text
        assert took < OPERATION_TIMEOUT_S + 4, f"answered after {took:.1f} s: {response.text}"
    finally:
        os.kill(second.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 60
    while client.write(source, [2]).status_code != 200:  # the client's resend
        assert time.monotonic() < deadline, "never acked"
        time.sleep(0.2)
    client.close()
    _partitions, seqnos = source_seqnos(kafka_store, "dc1.app")[source]
    assert seqnos == [1, 2]
