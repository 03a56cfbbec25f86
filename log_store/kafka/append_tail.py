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
        self._starts: dict[KafkaPartition, int] = {}
        """Followed partitions the consumer is not assigned yet -> the offset to start at."""
        self._assigned: set[KafkaPartition] = set()
        """What the consumer is assigned (by the tail's thread only)."""
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
        the partition's end now), until the function returned is called.

        Returns at once: the consumer is assigned the partition by the tail's thread, with
        every other partition followed or let go meanwhile, between two of its ``consume``
        calls (librdkafka's assign waits for a ``consume`` in progress, half a second: a
        long-poll of 100 new partitions took 50 s to follow them one by one).  A record
        appended before that is still received, from ``start``."""
        tp = (kafka_topic, partition)
        with self._lock:
            if self._closed:
                return lambda: None
            self._started()
            followers = self._followers.get(tp)
            if followers is None:
                self._followers[tp] = followers = []
                self._starts[tp] = start
            followers.append(on_append)

        def unfollow() -> None:
            with self._lock:
                followers = self._followers.get(tp)
                if followers is None or on_append not in followers:
                    return
                followers.remove(on_append)
                if not followers:
                    del self._followers[tp]
                    self._starts.pop(tp, None)

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

    def _reassign(self, consumer: Consumer) -> None:
        """Assign the consumer the partitions followed since the last call and let go of
        those nobody follows now, each in one call (in the tail's thread)."""
        with self._lock:
            starts, self._starts = self._starts, {}
            gone = [tp for tp in self._assigned if tp not in self._followers]
        new = [
            TopicPartition(*tp, start)
            for tp, start in starts.items()
            if tp not in self._assigned and tp in self._followers
        ]
        if gone:
            try:
                consumer.incremental_unassign([TopicPartition(*tp) for tp in gone])
            except Exception as exc:  # a broken consumer: nothing is fetched for them
                log.debug("unassigning %d partitions: %s", len(gone), exc)
            self._assigned.difference_update(gone)
        if new:
            try:
                consumer.incremental_assign(new)
            except Exception as exc:
                # not assigned, so no append wakes their followers: their readers look
                # when their waits end
                log.warning("the append tail could not follow %d partitions: %s", len(new), exc)
                return
            self._assigned.update((tp.topic, tp.partition) for tp in new)

    def _run(self, consumer: Consumer) -> None:
        while not self._closed:
            self._reassign(consumer)
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
            if tp not in self._followers or tp not in self._assigned:
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
            self._starts.clear()
        if self._thread is not None:
            self._thread.join(_CONSUME_S * 4)
        if consumer is not None:
            consumer.close()
