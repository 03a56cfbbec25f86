"""The Kafka store says which sources wait for a partition of pins that has no reachable owner.

A topic's pins are spread over its partitions (each key in a *home* partition).  Routing new
sources reads their pins from every home they live in; when one home has no reachable owner
only the sources whose pins it holds wait, and the error names them (the gateway answers 503
``partition_unavailable`` naming their ``source_ids``; before, it named the partition only,
and a push-client held back every file of the request).

The store runs in this process on the session's Kafka and owns every partition but one; the
owner of that one is never announced.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from log_store import TopicConfig
from log_store.errors import LogbrokerError
from log_store.kafka import KafkaSettings, open_kafka_store
from log_store.kafka.remote_transaction import (
    CommitAnswer,
    ForwardedTransaction,
    RemoteTransactions,
)
from log_store.kafka.store import KafkaLogStore, home_partition
from session_dedup.exactly_once import PinsUnavailable, SourceRouter
from session_dedup.pinning import pin_deletions_key, pin_key

pytestmark = pytest.mark.kafka

TOPIC = "dc1.app"
PARTITIONS = 3


class _NoOwner:
    """Nobody announces an owner: each look waits as long as it may."""

    def owner(self, topic: str, partition: int, *, wait_s: float = 0.0, **_kw: Any) -> str | None:
        time.sleep(wait_s)
        return None


class _NoLink:
    def read_state(self, *_args: Any) -> tuple[dict[str, bytes | None], int]:
        raise AssertionError("no owner was announced: nobody is asked")

    def commit_many(
        self, url: str, items: Sequence[ForwardedTransaction]
    ) -> list[CommitAnswer | LogbrokerError]:
        raise AssertionError("no owner was announced: nobody is asked")

    def close(self) -> None:
        return None


class _AllButOne:
    """Owns every partition but ``TOPIC``/``cut``, which it cannot reach."""

    def __init__(self) -> None:
        self.remote_transactions = RemoteTransactions(_NoOwner(), _NoLink(), timeout_s=0.5)
        self.cut = -1

    def owns(self, topic: str, partition: int) -> bool:
        return (topic, partition) != (TOPIC, self.cut)

    def remote(self) -> RemoteTransactions:
        return self.remote_transactions

    def topics_changed(self) -> None:
        return None


@pytest.fixture
def store(kafka_cluster: Any, kafka_namespace: str) -> Iterator[KafkaLogStore]:
    settings = KafkaSettings(
        kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=10
    )
    opened = open_kafka_store(settings, placement=_AllButOne())
    yield opened
    opened.close()


def test_routing_new_sources_names_those_whose_pins_the_unreachable_partition_holds(
    store: KafkaLogStore,
) -> None:
    store.create_topic(TOPIC, TopicConfig(partitions=PARTITIONS))
    topic_id = store.describe_topic(TOPIC).topic_id
    # not the partition of the topic's record (0), nor that of its count of deleted pins,
    # which every source's routing reads: then every new source would wait, and be named
    shared = home_partition(pin_deletions_key(topic_id), PARTITIONS)
    cut = next(p for p in range(1, PARTITIONS) if p != shared)
    placement = store.placement
    assert isinstance(placement, _AllButOne)
    placement.cut = cut
    # sixteen sources, four of them pinned in the cut partition (the topic id is random: a
    # fixed list of names missed that partition about once in a hundred runs)
    candidates = [f"src-{i}" for i in range(400)]
    on_cut = [s for s in candidates if home_partition(pin_key(topic_id, s), PARTITIONS) == cut]
    elsewhere = [s for s in candidates if s not in set(on_cut)]
    sources = sorted([*on_cut[:4], *elsewhere[:12]], key=candidates.index)
    waiting = [s for s in sources if home_partition(pin_key(topic_id, s), PARTITIONS) == cut]
    assert waiting and len(waiting) < len(sources)
    router = SourceRouter(store, partitions=PARTITIONS)
    # the first routing makes the pins (and the topic's record): those of the cut partition
    # cannot be made; the second reads them: those of the cut partition cannot be read
    for making in (True, False):
        with pytest.raises(PinsUnavailable) as raised:
            router.route_many([(TOPIC, s) for s in sources])
        assert (raised.value.topic, raised.value.partition) == (TOPIC, cut)
        assert list(raised.value.source_ids) == waiting, making
    # the others are routed without the cut partition
    others = [s for s in sources if s not in waiting]
    assert len(router.route_many([(TOPIC, s) for s in others])) == len(others)
