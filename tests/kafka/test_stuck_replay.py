"""A replay (a takeover rebuilding a partition's state) whose consumer stopped fetching.

After a broker outage a pooled consumer was seen to hand out nothing more while Kafka had
the records: the replay waited its whole minute, holding the takeover and the writes of its
partition a minute after Kafka was back.  Here such a consumer is a stand-in put into the
pool where the replay picks it; the records are real, on the session's broker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from log_store import TopicConfig
from log_store.errors import StoreUnavailable
from log_store.kafka import fetcher as fetcher_module
from log_store.kafka import open_kafka_store
from log_store.kafka.fetcher import STUCK_CONSUMER_S, FetcherPool, Watermarks, _Fetcher
from log_store.kafka.settings import KafkaSettings

pytestmark = pytest.mark.kafka

RECORDS = 20
TIMEOUT_S = 5.0


class _StuckConsumer:
    """Takes assignments and hands out nothing, ever (a consumer that went through an
    outage and never fetched again)."""

    def __init__(self, *_args: Any) -> None:
        self.closed = threading.Event()

    def assign(self, _partitions: Any) -> None:
        return None

    def unassign(self) -> None:
        return None

    def consume(self, _n: int, _timeout: float) -> list[Any]:
        return []

    def poll(self, timeout: float) -> None:
        time.sleep(timeout)

    def close(self) -> None:
        self.closed.set()


@pytest.fixture
def records(kafka_cluster: Any, kafka_namespace: str) -> Iterator[tuple[KafkaSettings, str]]:
    """A topic of the test's namespace holding ``RECORDS`` committed records."""
    settings = KafkaSettings(
        kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=TIMEOUT_S
    )
    name = f"{kafka_namespace}stuck-replay"
    admin = AdminClient(settings.admin_config())
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(30)
    producer = Producer({**settings.client_base(), "acks": "all"})
    for i in range(RECORDS):
        producer.produce(name, f"record {i}".encode(), partition=0)
    assert producer.flush(30) == 0
    yield settings, name


def _pool_with_a_stuck_consumer(settings: KafkaSettings, name: str) -> FetcherPool:
    pool = FetcherPool(settings, Watermarks(settings))
    stuck = _Fetcher(_StuckConsumer())  # type: ignore[arg-type]
    stuck.seek(name, 0, 0)
    pool._idle.append(stuck)  # where the replay of name/0 from 0 picks it
    pool._count += 1
    return pool


def _replay(pool: FetcherPool, name: str, got: list[int]) -> threading.Thread:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            pool.replay(name, 0, 0, RECORDS, lambda offset, _v: got.append(offset), what="x")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def test_a_replay_whose_pooled_consumer_is_stuck_goes_on_with_a_fresh_one(
    records: tuple[KafkaSettings, str],
) -> None:
    """Before: it waited for its 60 s deadline and failed ("Kafka did not answer a replay")."""
    settings, name = records
    pool = _pool_with_a_stuck_consumer(settings, name)
    got: list[int] = []
    began = time.monotonic()
    thread = _replay(pool, name, got)
    thread.join(STUCK_CONSUMER_S + 6)
    assert not thread.is_alive(), "the replay still waits on its stuck consumer"
    assert thread.errors == []  # type: ignore[attr-defined]
    assert got == list(range(RECORDS))
    assert time.monotonic() - began >= STUCK_CONSUMER_S - 0.5  # it did wait on the stuck one
    pool.close()


def test_a_replay_that_gets_nothing_fails_within_the_operation_timeout(
    records: tuple[KafkaSettings, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every consumer stuck (the fresh ones too): StoreUnavailable once no record came for
    ``operation_timeout_s``, so the takeover fails and the writes waiting for it get 503
    (before: after 60 s, whatever the operation timeout, longer than a request may wait)."""
    settings, name = records
    pool = _pool_with_a_stuck_consumer(settings, name)
    monkeypatch.setattr(fetcher_module, "Consumer", _StuckConsumer)
    began = time.monotonic()
    thread = _replay(pool, name, [])
    thread.join(TIMEOUT_S + 5)
    assert not thread.is_alive(), "the replay still waits"
    (error,) = thread.errors  # type: ignore[attr-defined]
    assert isinstance(error, StoreUnavailable), error
    assert "Kafka did not answer a replay of x in time" in str(error)
    assert time.monotonic() - began >= TIMEOUT_S - 0.5
    pool.close()


def _put_and_append(state: Any) -> list[bytes]:
    state.put("source", b"1")
    return [b"chunk"]


@pytest.mark.parametrize("fresh_ones", ["fetch", "stuck too"])
def test_a_write_waiting_for_a_takeover_whose_replay_is_stuck_is_answered_in_bounded_time(
    kafka_cluster: Any, kafka_namespace: str, monkeypatch: pytest.MonkeyPatch, fresh_ones: str
) -> None:
    """The write path of the F2 outage: the first write after a (re)start takes the partition
    over, which replays its changelog with a pooled consumer that is stuck.  It is written
    after the consumer is replaced, or answered 503 within about the operation timeout when
    no consumer gets anything (before: 60 s either way)."""
    settings = KafkaSettings(
        kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=TIMEOUT_S
    )
    with open_kafka_store(settings) as first:
        first.create_topic("dc1.app", TopicConfig(partitions=1))
        first.transact("dc1.app", 0, _put_and_append)  # a changelog to replay
    store = open_kafka_store(settings)
    try:
        stuck = _Fetcher(_StuckConsumer())  # type: ignore[arg-type]
        store._fetchers._idle.append(stuck)  # the only idle consumer: the replay picks it
        store._fetchers._count += 1
        if fresh_ones == "stuck too":
            monkeypatch.setattr(fetcher_module, "Consumer", _StuckConsumer)
        began = time.monotonic()
        try:
            store.transact("dc1.app", 0, _put_and_append)
            answer = "written"
        except StoreUnavailable as exc:
            answer = str(exc)
        took = time.monotonic() - began
        if fresh_ones == "fetch":
            assert answer == "written"
            assert took < STUCK_CONSUMER_S + 6, took
        else:
            assert "Kafka did not answer a replay of the state of dc1.app/0" in answer
            assert took < TIMEOUT_S + 6, took
    finally:
        store.close()
