"""A gateway refuses to start on a cluster without KIP-848's consumer group protocol.

On a broker before 4.0, or a 4.x broker with ``group.coordinator.rebalance.protocols=classic``,
a gateway used to start, answer ``/readyz`` 200, and own no partition: its group member's
heartbeat was refused (one librdkafka ``FATAL`` line), and every write was 503 "no gateway
owns" for ever.  The broker's ApiVersions answer does not tell (a 4.x broker with the
protocol off still lists ConsumerGroupHeartbeat), so the gateway joins a probe group of its
own before serving, and exits 2 with what logbroker needs if the heartbeat fails for good.

No test here starts a broker without the protocol (the session has one broker, with it):
its refusal is a stand-in consumer returning librdkafka's fatal error, with the reviewer's
exact line; the real broker checks that the probe passes with the protocol on, that a real
fatal error of a real consumer reaches the probe the way it is looked for, and that ``serve``
exits 2 with the sentence (a stand-in refusal inside a real gateway process).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient

from log_store.errors import BadRequest
from log_store.kafka import bootstrap
from log_store.kafka.gateway_group import GatewayGroup
from log_store.kafka.settings import KafkaSettings
from tests.kafka.conftest import serve_patched

NEEDED = (
    "needs Apache Kafka 4.0 or newer with the consumer group protocol of KIP-848 "
    "(group.coordinator.rebalance.protocols must include consumer)"
)
# what librdkafka 2.x said at a gateway on a 4.1 broker with the protocol turned off
REFUSED = (
    "Fatal error: Broker: API version not supported: ConsumerGroupHeartbeat fatal error: "
    "Broker: API version not supported"
)


class _Event:
    def __init__(self, error: KafkaError | None) -> None:
        self._error = error

    def error(self) -> KafkaError | None:
        return self._error


class RefusedConsumer:
    """A group consumer on a broker without KIP-848: its first poll is the fatal error."""

    made: list[RefusedConsumer] = []

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = config
        self.closed = False
        RefusedConsumer.made.append(self)

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.topics = topics

    def poll(self, timeout: float) -> _Event:
        return _Event(KafkaError(KafkaError._FATAL, REFUSED))

    def memberid(self) -> str:
        return "m1"

    def assignment(self) -> list[Any]:
        return []

    def close(self) -> None:
        self.closed = True


def test_the_refused_heartbeat_is_told_as_what_logbroker_needs() -> None:
    with pytest.raises(BadRequest) as refused:
        bootstrap.await_group_answer(RefusedConsumer(), "g", time.monotonic() + 5)
    assert NEEDED in str(refused.value)
    assert "API version not supported" in str(refused.value)  # the broker's own words too


def test_a_gateway_group_does_not_start_when_the_probe_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    RefusedConsumer.made.clear()
    monkeypatch.setattr(bootstrap, "Consumer", RefusedConsumer)
    group = GatewayGroup(
        KafkaSettings("127.0.0.1:9", namespace="ns.", operation_timeout_s=5),
        url="http://127.0.0.1:1",
        link=None,  # type: ignore[arg-type]
    )
    started = time.monotonic()
    with pytest.raises(BadRequest, match="KIP-848"):
        group.start(None)  # type: ignore[arg-type]
    assert time.monotonic() - started < 3
    assert group._thread is None  # nothing joined, nothing announced
    probe = RefusedConsumer.made[0]
    assert probe.closed
    assert probe.config is not None
    assert probe.config["group.id"] == "ns.logbroker-gateways-protocol-check"  # not the gateways'
    assert probe.config["group.protocol"] == "consumer"


def test_a_broker_with_the_protocol_takes_the_probe(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    settings = KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace)
    assert bootstrap.check_group_protocol(settings, timeout_s=20.0)


def test_a_real_fatal_error_of_a_group_consumer_reaches_the_probe(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    """librdkafka hands a group member's fatal error to ``poll`` (code ``_FATAL``), which is
    where the probe and the gateways' group look: a real broker refusing a real member (here
    for an assignor it does not have, which librdkafka also takes as fatal)."""
    group = f"{kafka_namespace}fatal"
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "group.remote.assignor": "no-such-assignor",
        }
    )
    try:
        consumer.subscribe([group])
        with pytest.raises(BadRequest, match="assignor") as refused:
            bootstrap.await_group_answer(consumer, group, time.monotonic() + 20)
        assert "KIP-848" not in str(refused.value)  # another cause is named as it is
    finally:
        consumer.close()


_SERVE_REFUSED = """
import sys
from log_store.kafka import bootstrap
from tests.kafka.test_group_protocol_check import RefusedConsumer
bootstrap.Consumer = RefusedConsumer
from ops.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_serve_exits_2_on_a_broker_refusing_the_protocol(
    tmp_path: Path, kafka_cluster: Any, kafka_namespace: str
) -> None:
    done = serve_patched(_SERVE_REFUSED, tmp_path, kafka_cluster, kafka_namespace)
    assert done.returncode == 2, done.stderr[-3000:]
    assert NEEDED in done.stderr
    assert "logbroker gateway on" not in done.stderr  # it never served


def test_a_gateway_starts_on_a_broker_with_the_protocol_and_leaves_the_probe_group(
    start_kafka_gateway: Any, kafka_cluster: Any, kafka_namespace: str
) -> None:
    gateway = start_kafka_gateway()
    assert "neither took nor refused" not in gateway.log()  # the broker took the probe
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    probe = bootstrap.probe_group(kafka_namespace)
    described = admin.describe_consumer_groups([probe])[probe].result(timeout=10)
    assert described.members == []  # the probe left; only the gateways' group holds it
    ready = httpx.get(gateway.url + "/readyz", timeout=5)
    assert ready.status_code == 200, ready.text
