"""A partition given to a gateway while Kafka is away is taken over once Kafka is back.

The gateway's store in this process, talking to the broker through a TCP proxy that the test
cuts while the partition is given (``take_over``, what the gateways' group calls): only a
successful takeover announces the gateway as the owner, and without one every other gateway
answers the partition's writes 503 "no gateway owns".
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from log_store import LogStore, TopicConfig
from log_store.kafka import KafkaSettings, open_kafka_store
from tests.kafka.conftest import wait_until
from tests.kafka.tcp_proxy import TcpProxy

pytestmark = pytest.mark.kafka


def test_a_takeover_that_failed_is_tried_again_without_a_write(
    kafka_cluster: Any, kafka_store: LogStore, kafka_namespace: str
) -> None:
    """Before: the takeover failed once and nothing tried again until a write reached this
    gateway itself, which forwards from the others (finding no owner announced) never are."""
    kafka_store.create_topic("dc1.app", TopicConfig(partitions=1))
    node = kafka_cluster.nodes[0]
    proxy = TcpProxy(node.proxied_advertised_port, node.proxied_port).start()
    taken: list[float] = []
    done = threading.Event()

    def note(topic: str, partition: int, seconds: float, entries: int) -> None:
        taken.append(time.monotonic())
        done.set()

    try:
        store = open_kafka_store(
            KafkaSettings(
                kafka_cluster.proxied_bootstrap, namespace=kafka_namespace, operation_timeout_s=3
            )
        )
        try:
            store.takeover_listener = note
            proxy.cut()
            owner = store.take_over("dc1.app", 0)
            wait_until(lambda: owner._failure is not None, 30, "the takeover to fail")
            assert not done.is_set()
            proxy.restore()
            restored = time.monotonic()
            assert done.wait(30), "the partition was never taken over"
            assert taken[0] - restored < 20  # retried after 1, 2, 4, 8 s, then every 10 s
            assert store.local_owner("dc1.app", 0) is owner
        finally:
            store.close()
    finally:
        proxy.close()
