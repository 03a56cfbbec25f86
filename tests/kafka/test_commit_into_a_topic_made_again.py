"""A partition owner's commit whose data records land in a topic made again, on Kafka.

The data topic is written by name.  A transaction of an owner of the deleted topic can put its
state update into the deleted topic's changelog (named by topic id: it was still there) and
its data records into the topic made again (librdkafka retries a produce refused while the
name has no topic until the name has one again).  Committed, those records are in the new
topic with no trace in its seqno table: the caller is told the write failed (its records are
not where the owner expected them, or its topic is gone), and the retry writes the same
chunks again.  Seen as a chunk twice in a partition of the new topic in
``test_topic_deleted_across_gateways.py`` (about one run in ten).

Here the data topic alone is deleted and made again under a running owner, its changelog
left in place: the owner's next transaction must not commit anything into the new topic.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from log_store import LogStore, PartitionState, TopicConfig
from log_store.errors import LogbrokerError
from log_store.kafka import KafkaSettings, naming, open_kafka_store
from tests.kafka.conftest import wait_until

pytestmark = pytest.mark.kafka

TOPIC = "dc1.app"


@pytest.fixture
def store(kafka_cluster: Any, kafka_namespace: str) -> Iterator[LogStore]:
    opened = open_kafka_store(
        KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=10)
    )
    yield opened
    opened.close()


def _write(store: LogStore, line: bytes | None) -> None:
    """A transaction putting ``line`` in the state and, unless None, in the data."""

    def fn(state: PartitionState) -> list[bytes]:
        state.put("last", line or b"")
        return [] if line is None else [line]

    store.transact(TOPIC, 0, fn)


def _make_data_topic_again(bootstrap: str, kafka_topic: str) -> None:
    """Delete the data topic and create it again under the same name (its changelog stays)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([kafka_topic])[kafka_topic].result(30)
    wait_until(lambda: kafka_topic not in admin.list_topics(timeout=10).topics, 30, "the deletion")
    deadline = time.monotonic() + 30
    while True:  # refused while the deletion is still being finished
        try:
            admin.create_topics([NewTopic(kafka_topic, 1, 1)])[kafka_topic].result(30)
            break
        except Exception:
            assert time.monotonic() < deadline, "the topic could not be made again"
            time.sleep(0.2)
    wait_until(
        lambda: not admin.list_topics(kafka_topic, timeout=10).topics[kafka_topic].error,
        30,
        "the topic made again",
    )


def _committed(bootstrap: str, kafka_topic: str) -> list[bytes]:
    """The committed records of the data topic's partition 0 (read_committed)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(kafka_topic, 0), timeout=10)
        consumer.assign([TopicPartition(kafka_topic, 0, 0)])
        found: list[bytes] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            position = consumer.position([TopicPartition(kafka_topic, 0)])[0].offset
            if position >= high:
                break
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                found.append(bytes(message.value()))
        return found
    finally:
        consumer.close()


@pytest.mark.parametrize("written_before", [True, False], ids=["after a commit", "first commit"])
def test_an_owner_commits_nothing_into_a_data_topic_made_again_under_it(
    store: LogStore, kafka_cluster: Any, kafka_namespace: str, written_before: bool
) -> None:
    store.create_topic(TOPIC, TopicConfig(partitions=1))
    # the owner expects its next records at offset 2, or (a state-only commit) at 0
    _write(store, b"before\n" if written_before else None)
    kafka_topic = naming.data_topic(kafka_namespace, TOPIC)
    _make_data_topic_again(kafka_cluster.bootstrap, kafka_topic)
    with pytest.raises(LogbrokerError):
        _write(store, b"stray\n")
    assert _committed(kafka_cluster.bootstrap, kafka_topic) == []
