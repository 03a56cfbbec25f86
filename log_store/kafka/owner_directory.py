"""Who owns which partition, as every gateway learns it: announcements in a compacted topic.

A gateway that has taken a partition over announces ``(topic, partition) -> its URL`` in
``__<ns>logbroker-owners`` (compacted, one record per partition survives); one that gives a
partition up withdraws the announcement.  Every gateway tails the topic from its start and
keeps the map, so a transaction for a partition owned elsewhere is sent to the URL announced
last.  The map is only a hint: an announcement can be stale (its gateway died), and the
receiver checks that it owns the partition before it runs anything; a stale entry costs a
retry, never a wrong write (fencing decides who may write, not this map).
"""

from __future__ import annotations

import json
import logging
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from log_store.kafka import naming
from log_store.kafka.failures import as_store_error, kafka_error
from log_store.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)

_STOP_S = 5.0


def _key(topic: str, partition: int) -> bytes:
    return f"{topic}\x00{partition}".encode()


class OwnerDirectory:
    """The map of partition owners, kept up to date by tailing the announcements topic."""

    def __init__(self, settings: KafkaSettings, *, self_url: str) -> None:
        self._settings = settings
        self.self_url = self_url
        self._topic = naming.owners_topic(settings.namespace)
        self._owners: dict[tuple[str, int], str] = {}
        self._cond = threading.Condition()
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._caught_up = threading.Event()

    # -- life -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._ensure_topic()
        self._producer = Producer(
            {**self._settings.client_base(), "enable.idempotence": True, "acks": "all"}
        )
        self._consumer = Consumer(
            {
                **self._settings.client_base(),
                "group.id": naming.reader_group(self._settings.namespace),
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 50,
            }
        )
        self._consumer.assign([TopicPartition(self._topic, 0, 0)])
        self._thread = threading.Thread(target=self._tail, name="logbroker-owners", daemon=True)
        self._thread.start()
        self._caught_up.wait(self._settings.operation_timeout_s)

    def _ensure_topic(self) -> None:
        admin = AdminClient(self._settings.admin_config())
        new = NewTopic(
            self._topic,
            num_partitions=1,
            replication_factor=self._settings.replication_factor,
            config={"cleanup.policy": "compact", "segment.bytes": str(8 * 1024 * 1024)},
        )
        future = admin.create_topics([new], request_timeout=self._settings.operation_timeout_s)[
            self._topic
        ]
        try:
            future.result(timeout=self._settings.operation_timeout_s + 5)
        except KafkaException as exc:
            error = kafka_error(exc)
            if error is None or error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise as_store_error(exc, "creating the owners topic") from exc

    def stop(self, timeout_s: float = _STOP_S) -> None:
        """Stop tailing and send what was announced, taking at most ``timeout_s``.

        An announcement or withdrawal Kafka has not taken by then (it is unreachable) is
        dropped: the map is a hint, and a stale entry costs a retry, never a wrong write.
        """
        deadline = time.monotonic() + timeout_s
        self._stopping = True  # the tail sees it within a poll and closes its consumer
        if self._thread is not None:
            self._thread.join(timeout_s)
        elif self._consumer is not None:  # never started tailing
            self._consumer.close()
        self._consumer = None
        producer, self._producer = self._producer, None
        if producer is not None:
            left = producer.flush(max(0.0, deadline - time.monotonic()))
            if left:
                log.warning("%d ownership announcement(s) not sent: Kafka did not take them", left)

    def _tail(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        try:
            self._read(consumer)
        finally:
            # closed here, by the thread that polls it, never under a poll in progress
            consumer.close()

    def _read(self, consumer: Consumer) -> None:
        while not self._stopping:
            try:
                message = consumer.poll(0.2)
            except Exception as exc:  # a broker hiccup
                log.warning("reading ownership announcements: %s", exc)
                time.sleep(0.5)
                continue
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._caught_up.set()
                else:
                    log.warning("reading ownership announcements: %s", error)
                continue
            self._apply(message.key(), message.value())

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if not key:
            return
        topic, _, partition = key.decode().partition("\x00")
        url = None
        if value:
            try:
                url = json.loads(value).get("url")
            except ValueError:
                return
        with self._cond:
            if url:
                self._owners[(topic, int(partition))] = url
            else:
                self._owners.pop((topic, int(partition)), None)
            self._cond.notify_all()

    # -- announcing -------------------------------------------------------------------------------
    def announce(self, topic: str, partition: int) -> None:
        """This gateway owns the partition now (its takeover finished)."""
        self._publish(topic, partition, {"url": self.self_url, "at_ms": int(time.time() * 1000)})

    def withdraw(self, topic: str, partition: int) -> None:
        """This gateway gave the partition up (only if the announcement is still its own)."""
        with self._cond:
            if self._owners.get((topic, partition)) != self.self_url:
                return
        self._publish(topic, partition, None)

    def _publish(self, topic: str, partition: int, doc: dict[str, object] | None) -> None:
        producer = self._producer
        if producer is None:
            return
        value = None if doc is None else json.dumps(doc).encode()
        try:
            producer.produce(self._topic, value, key=_key(topic, partition), partition=0)
            producer.poll(0)
        except (KafkaException, BufferError) as exc:
            log.warning("announcing the owner of %s/%d: %s", topic, partition, exc)
            return
        # local view first: this gateway forwards nothing to itself while Kafka catches up
        self._apply(_key(topic, partition), value)

    # -- looking up -------------------------------------------------------------------------------
    def owner(
        self, topic: str, partition: int, *, not_url: str | None = None, wait_s: float = 0.0
    ) -> str | None:
        """The announced owner's URL (other than ``not_url``), waiting up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                url = self._owners.get((topic, partition))
                if url is not None and url != not_url:
                    return url
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def snapshot(self) -> dict[tuple[str, int], str]:
        with self._cond:
            return dict(self._owners)
