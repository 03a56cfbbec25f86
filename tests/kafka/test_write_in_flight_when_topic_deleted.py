"""A write in flight while its topic is deleted (and made again with fewer partitions) ends
within seconds of the deletion, not after the operation timeout.

The writer here took partition 6 over between the deletion's fence and the deletion (as a
gateway's writer may when the topic is deleted under it), so nothing fenced it afterwards.
The topic made again has 4 partitions: Kafka answers "unknown partition" for 6, which is
also what a partition just added answers for a moment, and was asked again until the
operation timeout (30 s here).  Now the writer looks at the topic's identity every second
meanwhile, and answers ``UnknownTopic`` (the gateway routes the source again, into the new
topic) as soon as the identity changed.  And a record of such a writer that Kafka put into
the topic made again (it goes by name) is not committed there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from log_store import LogbrokerError, TopicConfig, UnknownTopic
from log_store.kafka import KafkaSettings, open_kafka_store
from log_store.kafka.partition_owner import PartitionOwner
from log_store.kafka.store import KafkaLogStore

pytestmark = pytest.mark.kafka

TOPIC = "dc1.t"
OPERATION_TIMEOUT_S = 30.0
ENDED_WITHIN_S = 5.0
"""After the deletion (and the topic made again) was answered: a second to see the new
identity, and slack for two shared cores."""


@pytest.fixture
def stores(kafka_cluster: Any, kafka_namespace: str) -> Iterator[tuple[KafkaLogStore, Any]]:
    settings = KafkaSettings(
        kafka_cluster.bootstrap,
        namespace=kafka_namespace,
        operation_timeout_s=OPERATION_TIMEOUT_S,
    )
    writer, deleter = open_kafka_store(settings), open_kafka_store(settings)
    assert isinstance(writer, KafkaLogStore)
    try:
        yield writer, deleter
    finally:
        writer.close()
        deleter.close()


def _delete_and_make_again(deleter: Any, deleted_at: list[float]) -> None:
    deleter.delete_topic(TOPIC)
    deleter.create_topic(TOPIC, TopicConfig(partitions=4))
    deleted_at.append(time.monotonic())


def _ends_refused(write: Callable[[], Any], deleted_at: list[float]) -> float:
    """Seconds from the deletion's answer to ``write``'s end, which must be UnknownTopic."""
    with pytest.raises(UnknownTopic):
        write()
    assert deleted_at, "the topic was never deleted"
    return time.monotonic() - deleted_at[0]


def _only_the_new_write_in_the_new_topic(writer: KafkaLogStore) -> None:
    """The refused write is nowhere in the topic made again; written again (as the gateway
    does, routed in the new topic), it is there once."""
    again = writer.append(TOPIC, 2, [b"in flight"])
    found = [
        (p.partition, r.value)
        for p in writer.describe_topic(TOPIC).partitions
        for r in writer.read(TOPIC, p.partition, p.start_offset, 1 << 20).records
    ]
    assert found == [(2, b"in flight")], found
    assert again.count == 1


def _in_flight_write_ends_soon(
    writer: KafkaLogStore, deleted_at: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write to partition 6, while the fault set up by the test deletes the topic, is
    refused within ``ENDED_WITHIN_S`` of the deletion; then only later writes are in the
    topic made again."""
    took = _ends_refused(lambda: writer.append(TOPIC, 6, [b"in flight"]), deleted_at)
    assert took < ENDED_WITHIN_S, f"the write ended {took:.1f} s after the deletion"
    monkeypatch.undo()
    _only_the_new_write_in_the_new_topic(writer)


def test_a_commit_waiting_to_be_readable_ends_soon_after_its_topic_is_deleted(
    stores: tuple[KafkaLogStore, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit went through; before readers saw it, its topic was deleted (its records
    with it) and made again without its partition.  Before: answered after 30 s."""
    writer, deleter = stores
    writer.create_topic(TOPIC, TopicConfig(partitions=8))
    writer.append(TOPIC, 6, [b"before"])
    watermarks = writer._watermarks
    real_get = watermarks.get
    deleted_at: list[float] = []

    def get(kafka_topic: str, partition: int, what: str = "watermarks", **kw: Any) -> Any:
        if what == "visibility" and partition == 6 and not deleted_at:
            _delete_and_make_again(deleter, deleted_at)
        return real_get(kafka_topic, partition, what, **kw)

    monkeypatch.setattr(watermarks, "get", get)
    _in_flight_write_ends_soon(writer, deleted_at, monkeypatch)


def test_a_takeover_between_the_fence_and_the_deletion_ends_soon_after_it(
    stores: tuple[KafkaLogStore, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer fenced and saw the topic still there; then the topic was deleted and made
    again without its partition, and the takeover asked for the data's end.  Before: the
    write waiting for the takeover was answered after 30 s."""
    writer, deleter = stores
    writer.create_topic(TOPIC, TopicConfig(partitions=8))
    ctx = writer._ctx
    real_committed_snapshot = ctx.committed_snapshot
    deleted_at: list[float] = []

    def committed_snapshot(state_topic: str, partition: int) -> int | None:
        # called after the takeover's second look at the topic, before it reads the ends
        if partition == 6 and not deleted_at:
            _delete_and_make_again(deleter, deleted_at)
        return real_committed_snapshot(state_topic, partition)

    monkeypatch.setattr(ctx, "committed_snapshot", committed_snapshot)
    _in_flight_write_ends_soon(writer, deleted_at, monkeypatch)


def test_records_that_land_in_the_topic_made_again_are_not_committed(
    stores: tuple[KafkaLogStore, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's records go to the data topic by name: a record whose first try failed
    as the topic went, and whose retry came after the topic was made again, is written
    into the new topic, while the state change went to the deleted topic's state topic.
    The records are now delivered before the commit; at other offsets than expected, the
    transaction is aborted.  Before: it was committed,
    answered ``UnknownTopic``, and the gateway's retry wrote the chunk a second time into
    the new topic (seen in the two-gateway test)."""
    writer, deleter = stores
    writer.create_topic(TOPIC, TopicConfig(partitions=8))
    deleter.append(TOPIC, 1, [b"a", b"b"])  # the writer's records are expected at 3
    data_topic = writer._topic(TOPIC).kafka_name
    real_produce = PartitionOwner._produce
    held: list[tuple[str, bytes, Any]] = []
    deleted_at: list[float] = []

    def produce(owner: PartitionOwner, topic: str, value: bytes, on_delivery: Any) -> None:
        if not deleted_at and topic == data_topic:
            held.append((topic, value, on_delivery))  # its first try: lost with the topic
            return
        real_produce(owner, topic, value, on_delivery)
        if not deleted_at and held:
            assert owner._producer is not None
            owner._producer.flush(10)  # the state change is in the old state topic
            # deleted as by another writer's request, after this one fenced
            deleter._admin.delete(deleter._topic(TOPIC, fresh=True))
            deleter.create_topic(TOPIC, TopicConfig(partitions=8))
            deleted_at.append(time.monotonic())
            for args in held:
                real_produce(owner, *args)

    monkeypatch.setattr(PartitionOwner, "_produce", produce)
    with pytest.raises(LogbrokerError):
        writer.append(TOPIC, 1, [b"in flight"])
    monkeypatch.undo()
    assert deleted_at
    found = [
        (p.partition, r.value)
        for p in writer.describe_topic(TOPIC).partitions
        for r in writer.read(TOPIC, p.partition, p.start_offset, 1 << 20).records
    ]
    assert found == [], f"a write answered as failed is in the topic made again: {found}"
