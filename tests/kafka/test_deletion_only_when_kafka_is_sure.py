"""A topic is "deleted" (404 ``unknown_topic``) only when Kafka says so for certain.

While a broker shuts down, librdkafka's own view of a partition empties for a few seconds and
its watermark queries answer "Local: Unknown partition" (seen in a restart of the local
broker: ``NOT_LEADER_FOR_PARTITION``, then ``_UNKNOWN_PARTITION`` from 0.3 s to 7 s after the
stop began, then "all brokers down").  A pull read that asked then was answered 404: a reader
drops its position on 404.  Here that answer is made at the confluent-kafka boundary (the
watermark query of the readers' consumer) while the way to the broker is cut with a TCP
proxy, so that nothing can confirm it: the read must be 503 (``StoreUnavailable``).  A broker
that answers with metadata still naming the topic, or with no metadata at all, does not
confirm it either; a topic really deleted still is ``UnknownTopic``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ClusterMetadata

from log_store import LogStore, StoreUnavailable, TopicConfig, UnknownTopic
from log_store.kafka import KafkaSettings
from log_store.kafka.fetcher import FetcherPool, Watermarks
from log_store.kafka.topic_admin import TopicAdmin
from tests.kafka.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.kafka]

TOPIC = "dc1.app"


class _LocalVerdict:
    """The readers' consumer, except that its watermark queries answer what librdkafka
    answers from the metadata a broker shutting down left it: "Local: Unknown partition"."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    def get_watermark_offsets(self, *_args: Any, **_kwargs: Any) -> tuple[int, int]:
        raise KafkaException(
            KafkaError(KafkaError._UNKNOWN_PARTITION, "Failed to get watermark offsets")
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


@pytest.fixture
def written(kafka_store: LogStore, kafka_namespace: str) -> str:
    """The Kafka name of a topic with two records in partition 0."""
    kafka_store.create_topic(TOPIC, TopicConfig(partitions=2))
    kafka_store.append(TOPIC, 0, [b"a", b"b"])
    return kafka_namespace + TOPIC


@pytest.fixture
def proxy(kafka_cluster: Any) -> Iterator[TcpProxy]:
    node = kafka_cluster.nodes[0]
    proxy = TcpProxy(node.proxied_advertised_port, node.proxied_port).start()
    yield proxy
    proxy.close()


@pytest.fixture
def readers(kafka_cluster: Any, kafka_namespace: str) -> Iterator[FetcherPool]:
    """A store's readers, reaching the broker only through the proxy."""
    settings = KafkaSettings(
        kafka_cluster.proxied_bootstrap, namespace=kafka_namespace, operation_timeout_s=2.0
    )
    watermarks = Watermarks(settings)
    pool = FetcherPool(settings, watermarks)
    yield pool
    pool.close()
    watermarks.close()


def test_a_read_while_the_broker_is_away_and_librdkafka_knows_no_partition_is_503(
    written: str, proxy: TcpProxy, readers: FetcherPool
) -> None:
    assert [r.value for r in readers.read(written, 0, 0, 1000, what=TOPIC).records] == [
        b"a",
        b"b",
    ]
    proxy.cut()
    readers.watermarks._consumer = _LocalVerdict(readers.watermarks._consumer)  # type: ignore[assignment]
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):  # it was UnknownTopic: 404, "deleted"
        readers.read(written, 0, 0, 1000, what=TOPIC)
    with pytest.raises(StoreUnavailable):
        readers.wait(written, 0, 3, 0.5)
    assert time.monotonic() - started < 10


def test_metadata_that_still_names_the_topic_is_no_deletion(
    written: str, proxy: TcpProxy, readers: FetcherPool
) -> None:
    readers.watermarks._consumer = _LocalVerdict(readers.watermarks._consumer)  # type: ignore[assignment]
    with pytest.raises(StoreUnavailable, match="does not show the topic gone"):
        readers.read(written, 0, 0, 1000, what=TOPIC)


def test_a_topic_really_deleted_is_still_unknown(
    kafka_store: LogStore, written: str, proxy: TcpProxy, readers: FetcherPool
) -> None:
    assert len(readers.read(written, 0, 0, 1000, what=TOPIC).records) == 2
    kafka_store.delete_topic(TOPIC)
    started = time.monotonic()
    with pytest.raises(UnknownTopic):
        readers.read(written, 0, 0, 1000, what=TOPIC)
    assert time.monotonic() - started < 5


class _EmptyMetadata:
    """An admin client whose broker says it knows no such topic and whose full metadata
    answer is empty, as a broker that has not loaded the cluster's metadata would give."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def describe_topics(self, topics: Any, **_kwargs: Any) -> dict[str, Any]:
        import concurrent.futures

        futures = {}
        for name in topics.topic_names:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            future.set_exception(
                KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "unknown"))
            )
            futures[name] = future
        return futures

    def list_topics(self, *_args: Any, **_kwargs: Any) -> ClusterMetadata:
        return ClusterMetadata()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_broker_with_empty_metadata_does_not_make_a_topic_unknown(
    kafka_cluster: Any, kafka_namespace: str, written: str
) -> None:
    # (librdkafka's lines to the Python logger: the client outlives the session's broker)
    settings = KafkaSettings(
        kafka_cluster.bootstrap, namespace=kafka_namespace, librdkafka_log="debug"
    )
    admin = TopicAdmin(settings)
    assert admin.describe(TOPIC).partitions == 2
    real = admin.client
    admin.client = _EmptyMetadata(real)  # type: ignore[assignment]
    admin._beside_at = time.monotonic()  # the other installations: as listed just now
    with pytest.raises(StoreUnavailable):  # it was UnknownTopic
        admin.describe(TOPIC)
    admin.client = real
    with pytest.raises(UnknownTopic):
        admin.describe("dc1.never-made")
