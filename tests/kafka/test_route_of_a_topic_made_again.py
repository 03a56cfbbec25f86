"""A route cached under a topic that was deleted and made again, on Kafka.

Two gateways' writers on one namespace: the first routed a source to partition 1 of a topic
of 4 partitions and keeps that route cached; the second deletes the topic and makes it again
with 3, where the source is pinned to partition 0, and writes it.  A retry of the same chunks
through the first must find them there (duplicates), not write them into partition 1 of the
new topic (the data topic is written by name): the source would be in two partitions and its
seqnos twice.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from log_store.errors import StoreUnavailable
from log_store.kafka import KafkaSettings, open_kafka_store
from session_dedup.exactly_once import WRITTEN, ChunkBatch, ExactlyOnceWriter
from session_dedup.pinning import stable_partition
from session_dedup.source import source_meta
from tests.kafka.conftest import envelopes

pytestmark = pytest.mark.kafka


def test_a_route_cached_under_a_deleted_topic_does_not_write_into_the_topic_made_again(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    source = "host1:/var/log/app0.log"
    assert (stable_partition(source, 4), stable_partition(source, 3)) == (1, 0)
    settings = KafkaSettings(
        kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=20
    )
    store_a, store_b = open_kafka_store(settings), open_kafka_store(settings)
    try:
        gateway_a = ExactlyOnceWriter(store_a, dc="dc1", partitions=4)
        gateway_b = ExactlyOnceWriter(store_b, dc="dc1", partitions=3)
        meta = source_meta(log_type="app", source_id=source)
        assert gateway_a.write(meta, ChunkBatch([1], [0], [b"old\n"])).route.partition == 1
        store_b.delete_topic("dc1.app")
        lines = [b"a\n", b"b\n", b"c\n"]
        again = gateway_b.write(meta, ChunkBatch([1, 2, 3], [0] * 3, lines))
        assert again.route.partition == 0
        deadline = time.monotonic() + 60
        while True:  # as a client does: a 503 while this store still sees the deleted topic
            try:
                retried = gateway_a.write(meta, ChunkBatch([1, 2, 3], [0] * 3, lines))
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "the topic made again was never routed"
                time.sleep(0.5)
        assert retried.route.partition == 0
        assert WRITTEN not in retried.written
        found = {
            p: [env.seqno for _, env in recs] for p, recs in envelopes(store_b, "dc1.app").items()
        }
        assert found.get(0) == [1, 2, 3] and not any(found.get(p) for p in (1, 2)), found
    finally:
        store_a.close()
        store_b.close()
