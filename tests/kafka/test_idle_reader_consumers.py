"""What a pull reader leaves behind in a gateway: pooled consumers that no read uses any more
are closed (their librdkafka threads and prefetched buffers given back), and a consumer's
prefetch is bounded.  One full read of a 180 MB topic used to leave a gateway 500-800 MB
larger for good."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from log_store.kafka import fetcher as fetcher_module
from log_store.kafka.fetcher import FetcherPool, Watermarks
from log_store.kafka.settings import READER_FETCH_BYTES, READER_QUEUE_BYTES, KafkaSettings

pytestmark = pytest.mark.kafka

RECORDS = 10


@pytest.fixture
def topic(kafka_cluster: Any, kafka_namespace: str) -> Iterator[tuple[KafkaSettings, str]]:
    """A one-partition topic of the test's namespace holding ``RECORDS`` records."""
    settings = KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace)
    name = f"{kafka_namespace}idle-readers"
    admin = AdminClient(settings.admin_config())
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(30)
    producer = Producer({**settings.client_base(), "acks": "all"})
    for i in range(RECORDS):
        producer.produce(name, f"record {i}".encode(), partition=0)
    assert producer.flush(30) == 0
    yield settings, name


def test_a_pooled_consumer_no_read_uses_is_closed_and_reads_go_on(
    topic: tuple[KafkaSettings, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a pooled consumer stayed open (and assigned, prefetching) for the store's life."""
    settings, name = topic
    monkeypatch.setattr(fetcher_module, "IDLE_CLOSE_S", 0.4)
    watermarks = Watermarks(settings)
    pool = FetcherPool(settings, watermarks)
    try:
        first = pool.read(name, 0, 0, 1 << 20, what="first")
        assert [r.offset for r in first.records] == list(range(RECORDS))
        assert len(pool._idle) == 1  # kept for the next read of the partition
        until = time.monotonic() + 5
        while pool._idle and time.monotonic() < until:
            time.sleep(0.05)
        assert pool._idle == [] and pool._count == 0, "the idle consumer was not closed"
        again = pool.read(name, 0, 3, 1 << 20, what="again")  # a new consumer, same answer
        assert [r.offset for r in again.records] == list(range(3, RECORDS))
    finally:
        pool.close()
        watermarks.close()


def test_a_consumer_in_use_is_never_closed_for_idleness(
    topic: tuple[KafkaSettings, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, name = topic
    monkeypatch.setattr(fetcher_module, "IDLE_CLOSE_S", 0.2)
    watermarks = Watermarks(settings)
    pool = FetcherPool(settings, watermarks)
    try:
        pool.read(name, 0, 0, 1, what="start")  # starts the closing thread
        # a wait that outlasts the idle time holds its consumer throughout
        assert pool.wait(name, 0, RECORDS, timeout_s=1.0) is False
        assert pool.close_idle(0.0) == 1  # one consumer in all, idle again now
        assert pool._count == 0
    finally:
        pool.close()
        watermarks.close()


def test_a_reader_consumer_prefetches_a_few_mib_at_most() -> None:
    """Before: 64 MiB per fetch and a 16 MiB queue per pooled consumer."""
    config = KafkaSettings("unused:9092").reader_config("g")
    assert config["fetch.max.bytes"] == READER_FETCH_BYTES <= 8 * 1024 * 1024
    assert config["max.partition.fetch.bytes"] <= READER_FETCH_BYTES
    assert config["queued.max.messages.kbytes"] * 1024 == READER_QUEUE_BYTES <= 4 * 1024 * 1024
