"""The append tail asks Kafka for no end of a commit this process's own writer made.

A changelog delta can be readable a moment before the records it names, so the tail wakes a
partition's followers once the partition's last stable offset reached the delta's data end:
it asked the leader, once per commit and followed partition (or more, every few ms, while
the records were not readable yet).  When the writer of that commit is in this process, it
has asked already: it answers its callers only once it saw the commit readable.  The tail
takes that from the writer instead.  A partition written by another process is still asked
of Kafka.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from log_store import TopicConfig
from log_store.kafka import KafkaLogStore, KafkaSettings, open_kafka_store

pytestmark = pytest.mark.kafka


def _follow(store: KafkaLogStore, topic: str, partition: int) -> threading.Event:
    woken = threading.Event()
    store.follow_appends(topic, partition, woken.set)
    time.sleep(1.5)  # the tail's consumer assigned the changelog, its first fetch made
    return woken


def _wait_woken(woken: threading.Event, store: KafkaLogStore, topic: str, end: int) -> None:
    """The follower is woken, and a read then sees every record up to ``end``."""
    assert woken.wait(10), "the follower was not woken by the commit"
    woken.clear()
    assert store.end_offset(topic, 0) >= end


def test_commits_of_a_writer_here_wake_followers_without_asking_kafka_for_the_end(
    kafka_cluster: object,
) -> None:
    bootstrap = kafka_cluster.bootstrap  # type: ignore[attr-defined]
    namespace = f"t{uuid.uuid4().hex[:8]}."
    settings = KafkaSettings(bootstrap, namespace=namespace, operation_timeout_s=20)
    with open_kafka_store(settings) as here, open_kafka_store(settings) as elsewhere:
        assert isinstance(here, KafkaLogStore)
        assert isinstance(elsewhere, KafkaLogStore)
        here.create_topic("dc1.mine", TopicConfig(partitions=1))
        here.create_topic("dc1.theirs", TopicConfig(partitions=1))
        here.append("dc1.mine", 0, [b"first"])  # taken over here
        elsewhere.append("dc1.theirs", 0, [b"first"])  # taken over by the other store
        mine = _follow(here, "dc1.mine", 0)
        theirs = _follow(here, "dc1.theirs", 0)

        looks = here.tail_end_looks
        for n in range(10):
            result = here.append("dc1.mine", 0, [b"record %d" % n] * 3)
            _wait_woken(mine, here, "dc1.mine", result.last_offset + 1)
        # one or more per commit before (each a request to the partition's leader)
        assert here.tail_end_looks - looks == 0
        assert here.commits.commits >= 10

        looks = here.tail_end_looks
        for n in range(5):
            result = elsewhere.append("dc1.theirs", 0, [b"record %d" % n])
            _wait_woken(theirs, here, "dc1.theirs", result.last_offset + 1)
        # the other process's commits: asked of Kafka, as ever
        assert here.tail_end_looks - looks >= 5
