"""Who owns which partition, as every gateway learns it: claims in a compacted topic.

A gateway process that has taken a partition over claims it in ``__<ns>logbroker-owners``: a
record keyed ``(topic, partition, its URL, its instance)``, the instance being a random id of
the process.  One that gives the partition up withdraws *its own* claim (a tombstone of that
key), never another process's, even one at the same URL.  Every gateway tails the topic from
its start, and a partition's owner is the standing claim that came last.  Compaction keeps
the last record of each key in the order they were written, so a gateway that starts later,
reading what compaction left, sees the same owners as one that read every record.

Why a key per gateway: with one record per partition, a withdrawal overwrote whatever was
announced last, and a gateway slow to give up a partition (a deleted topic's, while the topic
made again was given to another gateway at once: a different topic to the group, the same
name here) erased the new owner's announcement.  The partition then had no owner for every
other gateway until the next takeover, which nothing caused: writes sent there got 503 "no
gateway owns" for as long as the gateways ran.

Why a key per *process*: claims keyed by URL alone let a second gateway started by mistake
with a live gateway's URL withdraw that gateway's claims, once at its start ("what an earlier
process at this URL left") and again at its stop, and the live owner never claimed again
partitions it had not lost.  Now nothing withdraws another process's claim except the next
owner of the partition (see below), and an owner whose claim disappeared all the same claims
again (:meth:`OwnerDirectory.own_claims`, called by the gateways' group every few seconds).

Claims left by a process that died (SIGKILL) are withdrawn by the partition's next owner when
it announces itself: its takeover fenced every earlier writer, so every other standing claim
on the partition is stale.  (A gateway that starts no longer withdraws claims at its URL: it
cannot tell a dead predecessor from a live process sharing the URL by mistake.)

The map is only a hint: a claim can be stale (its gateway died), and the receiver checks that
it owns the partition before it runs anything; a stale claim costs a retry, never a wrong
write (fencing decides who may write, not this map).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from log_store.kafka import naming
from log_store.kafka.failures import as_store_error, kafka_error
from log_store.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)

_STOP_S = 5.0


def new_instance_id() -> str:
    """A random id of one gateway process, different at every start."""
    return secrets.token_hex(8)


def _key(topic: str, partition: int, claimant: str) -> bytes:
    if claimant == _LEGACY:
        return f"{topic}\x00{partition}".encode()
    return f"{topic}\x00{partition}\x00{claimant}".encode()


_LEGACY = ""
"""The claimant of a record keyed ``(topic, partition)`` alone, as gateways before per-gateway
claims wrote them: whoever wrote it, its tombstone withdraws that record's claim.  Records of
gateways before per-process claims are keyed ``(topic, partition, URL)``: their claimant is
the URL."""


class OwnerDirectory:
    """The map of partition owners, kept up to date by tailing the announcements topic."""

    def __init__(
        self, settings: KafkaSettings, *, self_url: str, instance: str | None = None
    ) -> None:
        self._settings = settings
        self.self_url = self_url
        self.instance = instance or new_instance_id()
        """This process's id: its claims are its own, whoever else uses its URL."""
        self._claimant = f"{self_url}\x00{self.instance}"
        self._topic = naming.owners_topic(settings.namespace)
        self._claims: dict[tuple[str, int], dict[str, tuple[int, str]]] = {}
        """Per partition, each claimant's standing claim: (order read, URL).  A claimant is
        ``URL\x00instance`` (or what older gateways keyed their claims by, see ``_LEGACY``)."""
        self._order = 0
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
        if not self._caught_up.wait(self._settings.operation_timeout_s):
            log.warning("ownership claims not read in time: the map of owners fills later")

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
            producer = self._producer
            try:
                if producer is not None:
                    # its lines and delivery reports, also while nothing is announced (Kafka
                    # away: its failed connections, handed to the settings' ``lines``)
                    producer.poll(0)
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
        topic, _, rest = key.decode(errors="replace").partition("\x00")
        partition, _, claimant = rest.partition("\x00")
        if not partition.isdigit():
            return
        url = None
        if value:
            try:
                url = json.loads(value).get("url")
            except (ValueError, AttributeError):
                return
        at = (topic, int(partition))
        with self._cond:
            claims = self._claims.setdefault(at, {})
            if url:
                self._order += 1
                claims[claimant] = (self._order, url)
            else:
                claims.pop(claimant, None)
                if not claims:
                    del self._claims[at]
            self._cond.notify_all()

    def _owner(self, at: tuple[str, int]) -> str | None:
        """The URL of the standing claim made last (caller holds ``_cond``)."""
        claims = self._claims.get(at)
        return max(claims.values())[1] if claims else None

    # -- announcing -------------------------------------------------------------------------------
    def announce(self, topic: str, partition: int) -> None:
        """This gateway owns the partition now (its takeover finished, fencing every earlier
        writer): its claim, and the withdrawal of the claims others left on the partition
        (stale now: a process that died owning it, or one slow to give it up)."""
        log.debug("claiming %s/%d for %s", topic, partition, self.self_url)
        with self._cond:
            stale = [c for c in self._claims.get((topic, partition), {}) if c != self._claimant]
        self._publish(
            topic,
            partition,
            {"url": self.self_url, "instance": self.instance, "at_ms": int(time.time() * 1000)},
        )
        for claimant in stale:
            log.debug("withdrawing a stale claim on %s/%d: %r", topic, partition, claimant)
            self._publish(topic, partition, None, claimant=claimant)

    def withdraw(self, topic: str, partition: int) -> None:
        """This gateway gave the partition up: its own claim goes, every other one stays
        (another process's at the same URL too)."""
        with self._cond:
            if self._claimant not in self._claims.get((topic, partition), {}):
                return
        log.debug("withdrawing the claim of %s on %s/%d", self.self_url, topic, partition)
        self._publish(topic, partition, None)

    def own_claims(self) -> set[tuple[str, int]]:
        """The partitions this process's standing claims name, as the topic says (a claim
        Kafka did not take is not among them); serves the announcements' callbacks."""
        producer = self._producer
        if producer is not None:
            producer.poll(0)
        with self._cond:
            return {at for at, claims in self._claims.items() if self._claimant in claims}

    def _publish(
        self,
        topic: str,
        partition: int,
        doc: dict[str, object] | None,
        *,
        claimant: str | None = None,
    ) -> None:
        """Write this process's claim (``doc``) or its withdrawal (``None``); ``claimant``
        names another claimant's key to withdraw (a stale claim, see :meth:`announce`)."""
        producer = self._producer
        if producer is None:
            return
        value = None if doc is None else json.dumps(doc).encode()
        key = _key(topic, partition, self._claimant if claimant is None else claimant)

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None and doc is not None:
                # Kafka did not take the claim: out of the local view, so that it is made again
                log.warning("claiming %s/%d: %s", topic, partition, err)
                self._apply(key, None)

        try:
            producer.produce(self._topic, value, key=key, partition=0, on_delivery=delivered)
            producer.poll(0)
        except (KafkaException, BufferError) as exc:
            log.warning("announcing the owner of %s/%d: %s", topic, partition, exc)
            return
        # local view first: this gateway forwards nothing to itself while Kafka catches up
        self._apply(key, value)

    # -- looking up -------------------------------------------------------------------------------
    def owner(
        self, topic: str, partition: int, *, not_url: str | None = None, wait_s: float = 0.0
    ) -> str | None:
        """The announced owner's URL (other than ``not_url``), waiting up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                url = self._owner((topic, partition))
                if url is not None and url != not_url:
                    return url
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def snapshot(self) -> dict[tuple[str, int], str]:
        with self._cond:
            return {at: url for at in self._claims if (url := self._owner(at)) is not None}
