"""The append tail learns of commits from the partitions' changelogs, not their records.

Every commit to a data partition writes a small delta to its changelog in the same Kafka
transaction; following those instead of the records saves a gateway about 1.3 ms of CPU per
MB written to a partition that long-polls wait on (the records were fetched and
decompressed only to be dropped)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from log_store import LogStore, TopicConfig
from log_store.kafka import KafkaSettings, open_kafka_store

pytestmark = pytest.mark.kafka


def test_following_a_busy_partition_reads_its_deltas_not_its_records(
    kafka_store: LogStore,
) -> None:
    store: Any = kafka_store
    store.create_topic("dc1.t", TopicConfig(partitions=2))
    called = threading.Event()
    unfollow = store.follow_appends("dc1.t", 0, called.set)
    try:
        time.sleep(1.0)
        record = bytes(range(256)) * 256  # 64 KiB that compress little
        for _ in range(8):
            called.clear()
            store.append("dc1.t", 0, [record] * 16)  # 1 MiB a commit
            assert called.wait(5), "a commit called no follower"
    finally:
        unfollow()
    # 8 MiB written; the tail read 8 deltas of some bytes each (and the commits before it
    # was assigned, at most STATE_LOOKBACK changelog offsets back)
    assert store._tail.received_bytes < 64 * 1024, store._tail.received_bytes


def test_a_delta_wakes_its_followers_once_its_records_are_readable(
    kafka_store: LogStore, kafka_cluster: Any, kafka_namespace: str
) -> None:
    """A transaction's markers reach its partitions one by one: its delta may be readable
    before its records.  A follower woken then finds nothing and waits again, for a delta
    that already came; so the tail wakes it only once the records are readable.  The
    partition is written by another process's store (a commit of this process's own writer
    is not asked about: see test_append_tail_local_owner.py)."""
    store: Any = kafka_store
    writer = open_kafka_store(
        KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=20)
    )
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    writer.append("dc1.t", 0, [b"made"])
    tail = store._tail
    real_end_of = tail._end_of
    behind = {"looks": 0}

    def end_lagging(kafka_topic: str, partition: int) -> int:
        # the records' marker not there yet for the first three looks
        end = real_end_of(kafka_topic, partition)
        behind["looks"] += 1
        return end - 2 if behind["looks"] <= 3 else end

    called: list[int] = []
    unfollow = store.follow_appends("dc1.t", 0, lambda: called.append(behind["looks"]))
    try:
        time.sleep(1.0)
        tail._end_of = end_lagging
        writer.append("dc1.t", 0, [b"x"])
        deadline = time.monotonic() + 5
        while not called and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        unfollow()
        tail._end_of = real_end_of
        writer.close()
    assert called, "the follower was not called"
    assert called[0] >= 4, f"called after {called[0]} looks, before the records were readable"


def test_the_ends_of_many_partitions_are_asked_in_one_request(kafka_store: LogStore) -> None:
    """More than a few partitions with deltas at once: their last stable offsets in one
    request per leader, the same as asked one by one."""
    store: Any = kafka_store
    store.create_topic("dc1.t", TopicConfig(partitions=6))
    for p in range(6):
        store.append("dc1.t", p, [b"x"] * (p + 1))
    kafka_name = store._check_partition("dc1.t", 0).kafka_name
    partitions = [(kafka_name, p) for p in range(6)]
    assert store._ends_now(partitions) == {
        (kafka_name, p): store.end_offset("dc1.t", p) for p in range(6)
    }
