"""Following appends on Kafka: one read_committed consumer tails every followed partition.

A long-poll waits on partitions that any gateway may write (their owners are anywhere).  A
record that becomes visible to a read_committed consumer *is* such an append, so one consumer
of the store is assigned each followed partition from its end when it is first followed, and
whatever it receives wakes that partition's followers.  However many partitions are followed,
that is one consumer and one thread (librdkafka's own threads are per broker, not per
partition), and an idle partition costs the broker a place in the consumer's fetch session,
not a request of its own.  What the consumer receives is dropped: it keeps small fetches so
that following a busy partition does not read it a second time in big pieces.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, TopicPartition

from log_store.kafka.naming import reader_group
from log_store.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)

_CONSUME_S = 0.5
"""How long one ``consume`` waits; also how soon the thread sees that the store closed."""
_TAIL_FETCH_BYTES = 64 * 1024
_TAIL_QUEUE_KBYTES = 1024

KafkaPartition = tuple[str, int]


def _call(followers: list[Callable[[], None]]) -> None:
    for on_append in followers:
        try:
            on_append()
        except Exception:
            log.exception("a follower of appends failed")


class AppendTail:
    """One consumer, started on the first follow, assigned the followed partitions."""

    def __init__(self, settings: KafkaSettings, end_of: Callable[[str, int], int]) -> None:
        """``end_of(kafka_topic, partition)``: the partition's end (LSO) now, quickly."""
        self._settings = settings
        self._end_of = end_of
        self._lock = threading.Lock()
        self._followers: dict[KafkaPartition, list[Callable[[], None]]] = {}
        self._consumer: Consumer | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def followed(self) -> int:
        """How many partitions the consumer is assigned now."""
        with self._lock:
            return len(self._followers)

    def follow(
        self, kafka_topic: str, partition: int, start: int, on_append: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_append`` for every record at or after ``start`` (an offset at or below
        the partition's end now), until the function returned is called."""
        tp = (kafka_topic, partition)
        with self._lock:
            if self._closed:
                return lambda: None
            consumer = self._started()
            followers = self._followers.get(tp)
            if followers is None:
                # librdkafka's calls are thread-safe: assigned here, fetched by the tail's
                # thread at once (a consume in progress included)
                consumer.incremental_assign([TopicPartition(kafka_topic, partition, start)])
                self._followers[tp] = followers = []
            followers.append(on_append)

        def unfollow() -> None:
            with self._lock:
                followers = self._followers.get(tp)
                if followers is None or on_append not in followers:
                    return
                followers.remove(on_append)
                if followers or self._consumer is None:
                    return
                del self._followers[tp]
                try:
                    self._consumer.incremental_unassign([TopicPartition(kafka_topic, partition)])
                except Exception as exc:  # a broken consumer: nothing is fetched for it
                    log.debug("unassigning %s/%d: %s", kafka_topic, partition, exc)

        return unfollow

    def _started(self) -> Consumer:
        """The consumer, made with its thread on first use (lock held)."""
        if self._consumer is None:
            config = self._settings.reader_config(reader_group(self._settings.namespace))
            config.update(
                {
                    "enable.partition.eof": False,
                    "max.partition.fetch.bytes": _TAIL_FETCH_BYTES,
                    "queued.max.messages.kbytes": _TAIL_QUEUE_KBYTES,
                }
            )
            self._consumer = Consumer(config)
            self._thread = threading.Thread(
                target=self._run, args=(self._consumer,), name="logbroker-append-tail", daemon=True
            )
            self._thread.start()
        return self._consumer

    def _run(self, consumer: Consumer) -> None:
        while not self._closed:
            try:
                messages = consumer.consume(num_messages=1000, timeout=_CONSUME_S)
            except Exception as exc:
                if self._closed:
                    return
                log.warning("the append tail's consumer failed: %s", exc)
                self._wake_all()  # their readers look for themselves
                time.sleep(_CONSUME_S)
                continue
            changed: dict[KafkaPartition, None] = {}
            failed: dict[KafkaPartition, None] = {}
            for message in messages:
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    continue
                topic, partition = message.topic(), message.partition()
                if topic is None or partition is None or partition < 0:
                    if error is not None:
                        # an error of no one partition (a broker away): the readers look
                        log.debug("append tail: %s", error)
                    continue
                # a record, or an error of the partition (deleted, its records expired
                # under the tail): either way its readers read it again
                changed[topic, partition] = None
                if error is not None:
                    failed[topic, partition] = None
            for tp in failed:
                self._assign_again(consumer, tp)
            with self._lock:
                followers = [f for tp in changed for f in self._followers.get(tp, ())]
            _call(followers)

    def _assign_again(self, consumer: Consumer, tp: KafkaPartition) -> None:
        """Fetch ``tp`` again from its end: after an error (a topic deleted and made again
        under the tail, whose offsets start over; records expired below it) librdkafka
        fetches it no more.  Its followers are called after this, so that their readers'
        next look sees what came before it."""
        with self._lock:
            if tp not in self._followers:
                return
        try:
            end = self._end_of(*tp)
            consumer.incremental_unassign([TopicPartition(*tp)])
            consumer.incremental_assign([TopicPartition(tp[0], tp[1], end)])
        except Exception as exc:  # not there (yet): the next error tries again
            log.debug("assigning %s/%d again: %s", *tp, exc)

    def _wake_all(self) -> None:
        with self._lock:
            followers = [f for fs in self._followers.values() for f in fs]
        _call(followers)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            consumer, self._consumer = self._consumer, None
            self._followers.clear()
        if self._thread is not None:
            self._thread.join(_CONSUME_S * 4)
        if consumer is not None:
            consumer.close()
