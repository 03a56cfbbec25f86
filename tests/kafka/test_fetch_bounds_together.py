"""A fetch of many partitions looks at their bounds together, not one partition at a time.

Each read, follow and end look of a Kafka partition asked its leader for the partition's
start and last stable offset (two requests, one after the other): a ``/v1/fetch`` of 132
partitions no write had made took 0.13-0.3 s on a quiet machine, about 1 s under load, most
of it those looks.  Within ``reads_of`` (what a fetch and a long-poll's wait use), the
bounds of all of them are asked in one request per leader, and each partition's first call
answers from that look; the answers are what the look of each would have said.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from delivery.append_watch import AppendWatch
from delivery.partition_reader import PartitionReader
from log_store import LogStore, OffsetOutOfRange, TopicConfig
from log_store.kafka import KafkaLogStore
from tests.conftest import GatewayProcess
from tests.gateway.test_long_poll_cost import ADMIN, CONFIG, READER, make_topics
from tests.kafka.conftest import metric

pytestmark = pytest.mark.kafka


def test_a_fetch_of_many_partitions_looks_at_their_bounds_together(kafka_store: LogStore) -> None:
    store = kafka_store
    assert isinstance(store, KafkaLogStore)
    store.create_topic("dc1.web", TopicConfig(partitions=24))
    store.create_topic("dc1.app", TopicConfig(partitions=2))
    store.append("dc1.app", 1, [b"one", b"two", b"three"])
    partitions = [("dc1.web", p) for p in range(24)] + [("dc1.app", 0), ("dc1.app", 1)]
    for topic, partition in partitions:
        store.read(topic, partition, 0)  # the topics known here, the leaders too
    reader = PartitionReader(store)

    looks = store.partition_looks
    with store.reads_of(partitions):
        batches = [
            reader.read(
                topic, partition, 1 if (topic, partition) == ("dc1.app", 1) else 0, raw=True
            )
            for topic, partition in partitions
        ]
    # one look per partition before: 26
    assert store.partition_looks - looks == 0
    for batch in batches[:-1]:
        assert (batch.start_offset, batch.end_offset, batch.next_offset) == (0, 0, 0), batch
        assert batch.messages == []
    written = batches[-1]
    assert [m.value for m in written.messages] == [b"two", b"three"]
    assert (written.start_offset, written.end_offset) == (0, 4)  # 3 records and a marker

    # An offset past the end is refused with the bounds the look found.
    with store.reads_of(partitions), pytest.raises(OffsetOutOfRange) as refused:
        reader.read("dc1.app", 1, 7)
    assert (refused.value.start_offset, refused.value.end_offset) == (0, 4)

    # A long-poll's wait follows its partitions and looks at their ends: together too, and
    # an append after the reads wakes it.
    watch = AppendWatch(store)
    try:
        looks = store.partition_looks
        positions = [(t, p, 4 if t == "dc1.app" and p == 1 else 0) for t, p in partitions]
        assert not asyncio.run(watch.wait_any(positions, 0.5))
        assert store.partition_looks - looks == 0  # two per partition before: 52

        async def wait_then_append() -> bool:
            waiting = asyncio.ensure_future(watch.wait_any(positions, 20))
            await asyncio.sleep(1)
            await asyncio.to_thread(store.append, "dc1.web", 5, [b"news"])
            return await waiting

        assert asyncio.run(wait_then_append())
    finally:
        watch.close()
    # a second call of a partition in the context asks afresh (the look was used once)
    looks = store.partition_looks
    with store.reads_of(partitions):
        assert store.end_offset("dc1.web", 5) == 2
        assert store.end_offset("dc1.web", 5) == 2
    assert store.partition_looks - looks == 1


def test_a_gateway_fetch_of_132_partitions_no_write_made_looks_at_them_together(
    start_kafka_gateway: Callable[..., GatewayProcess],
) -> None:
    """The gateway's ``/v1/fetch`` reads its partitions within ``reads_of``; its metric
    ``logbroker_kafka_partition_looks`` counts the looks at one partition's bounds."""
    tables = CONFIG.replace("partitions = 4\n", "", 1)
    gw = start_kafka_gateway(
        top=f'partitions = 4\npeer_token = "{"p" * 32}"\n', ownership="on_demand", tables=tables
    )
    positions = make_topics(gw.url, 4, 32)
    headers = {"Authorization": f"Bearer {READER}"}
    body = {"partitions": positions}
    first = httpx.post(gw.url + "/v1/fetch", json=body, headers=headers, timeout=60)
    assert first.status_code == 200, first.text
    looks = metric(gw.url, "logbroker_kafka_partition_looks", ADMIN)
    assert looks is not None
    for _ in range(3):
        again = httpx.post(gw.url + "/v1/fetch", json=body, headers=headers, timeout=60)
        assert again.status_code == 200, again.text
        assert all(p["messages"] == [] for p in again.json()["partitions"])
    # 3 x 132 before (a look per partition); the idle gateway looks at some of its own
    # (about 15 a second here, for its internal topics)
    assert (metric(gw.url, "logbroker_kafka_partition_looks", ADMIN) or 0) - looks < 132


def test_the_joint_look_asks_about_a_topic_not_there_once_not_per_partition(
    kafka_store: LogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-poll may name many partitions of a topic not made yet; the look before the
    reads asks about the topic once (each read still asks as ever: it says the topic is
    not there)."""
    store = kafka_store
    assert isinstance(store, KafkaLogStore)
    store.create_topic("dc1.web", TopicConfig(partitions=2))
    admin = store._admin
    asked: list[str] = []
    describe = admin.describe

    def counted(name: str, *args: object, **kwargs: object) -> object:
        asked.append(name)
        return describe(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(admin, "describe", counted)
    partitions = [("dc1.later", p) for p in range(20)] + [("dc1.web", 0), ("dc1.web", 1)]
    with store.reads_of(partitions):
        pass
    assert asked.count("dc1.later") == 1  # 20 before this look asked per topic
    assert asked.count("dc1.web") <= 1
