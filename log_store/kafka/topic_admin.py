"""Topics on Kafka: the data topics users see and the state topics behind them.

A logbroker topic is the Kafka topic of the same name (under the namespace) plus its state
topic, named by the data topic's Kafka topic id.  Kafka gives every topic an id at creation,
so a topic deleted and created again is a new identity, and state can never leak from the
old one into the new one: the old state topic has another name.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

from log_store.errors import BadRequest, StoreUnavailable, TopicExists, UnknownTopic
from log_store.interface import PartitionInfo, TopicConfig
from log_store.kafka import naming
from log_store.kafka.bootstrap import cluster_answer
from log_store.kafka.failures import (
    as_store_error,
    ask_again,
    is_metadata_lag,
    is_topic_gone,
    kafka_error,
    known_offset,
)
from log_store.kafka.settings import KafkaSettings, refused_property

log = logging.getLogger(__name__)

MAX_PARTITIONS = 1024
KAFKA_MIN_SEGMENT_BYTES = 1024 * 1024
"""Kafka refuses smaller segments; a smaller ``segment_bytes`` is raised to this."""
_STATE_SEGMENT_BYTES = 16 * 1024 * 1024
_RECREATE_WAIT_S = 30.0
_NEW_TOPIC_S = 10.0
_BESIDE_S = 10.0
"""How old the list of other installations' namespaces may be (see ``_other_installations``)."""
_CONFIRM_LOOK_S = 1.0
"""What each of :func:`confirmed_gone`'s two looks gives Kafka to answer."""
_CONFIRM_PAUSE_S = 0.2
"""Between :func:`confirmed_gone`'s two looks."""
RENEW_AFTER_S = 5.0
"""How long the admin client's calls may go unanswered (no broker usable, no controller, no
answer in time) before a new client is asked whether Kafka answers it.  librdkafka tries a
refused connection again every second at most (``reconnect.backoff.max.ms``), so a client
that is still failing this long after Kafka came back will not recover by itself."""
_RENEW_LOOK_S = 2.0
"""What the new client (and then the old one) gives Kafka to answer."""
NO_BROKER_CODES = frozenset(
    (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN)
)
"""librdkafka's own errors for a request no broker answered: the ones a stuck client gives."""


@dataclass(frozen=True)
class KafkaTopic:
    """What Kafka says a topic is right now."""

    name: str
    kafka_name: str
    topic_id: str
    partitions: int


def _config_dict(config: TopicConfig, settings: KafkaSettings) -> dict[str, str]:
    values = {
        "cleanup.policy": "delete",
        "retention.ms": str(-1 if config.retention_ms is None else config.retention_ms),
        "retention.bytes": str(-1 if config.retention_bytes is None else config.retention_bytes),
        "segment.bytes": str(max(KAFKA_MIN_SEGMENT_BYTES, config.segment_bytes)),
        "max.message.bytes": str(settings.max_message_bytes),
        "message.timestamp.type": "CreateTime",
    }
    if settings.min_insync_replicas is not None:
        values["min.insync.replicas"] = str(settings.min_insync_replicas)
    return values


def check_config(config: TopicConfig) -> None:
    if not 1 <= config.partitions <= MAX_PARTITIONS:
        raise BadRequest(f"partitions must be 1..{MAX_PARTITIONS}, got {config.partitions}")
    if config.segment_bytes < 4096:
        raise BadRequest("segment_bytes must be at least 4096")
    for name in ("retention_ms", "retention_bytes"):
        value = getattr(config, name)
        if value is not None and value < 0:
            raise BadRequest(f"{name} must not be negative")


def named_in(metadata: Any, kafka_topic: str, partition: int | None = None) -> bool | None:
    """What one answer to a request for the whole cluster's metadata says of ``kafka_topic``
    (and its ``partition``): True there, False not there, None: the answer cannot say.

    An answer naming no broker cannot say: every broker that has loaded the cluster's
    metadata knows at least itself (its registration is part of that metadata), so such an
    answer is empty, not a cluster without the topic.  (An answer naming brokers and no topic
    is an empty cluster: a store opened on a new cluster asks about topics before Kafka has
    made its own.)  A topic listed with an error (its leaders being elected) is there, its
    partitions unknown."""
    if not metadata.brokers or metadata.orig_broker_id < 0:
        return None
    topic = metadata.topics.get(kafka_topic)
    if topic is None:
        return False
    if partition is None or partition in topic.partitions:
        return True
    return None if topic.error is not None else False


def confirmed_gone(
    list_all: Callable[[float], Any],
    kafka_topic: str,
    partition: int | None = None,
    *,
    suspicion: KafkaError | None = None,
) -> bool:
    """True only if Kafka says for certain that ``kafka_topic`` (or its ``partition``) does
    not exist; False if it exists or Kafka cannot say.

    ``list_all(timeout_s)`` asks a broker for the whole cluster's metadata (``list_topics()``
    of any librdkafka client); ``suspicion``: the error that made the caller ask.  Certain
    is two answers that agree: a broker's own "unknown topic" (a positive error code) and
    one answer that can say (see :func:`named_in`) not naming it, or, after anything else
    (librdkafka's own "unknown partition", from the metadata it cached, which a broker
    shutting down empties for a moment), two such answers :data:`_CONFIRM_PAUSE_S` apart.
    A broker that cannot be reached, or an answer naming no broker, never confirms: a reader
    told "deleted" drops its position, told "unavailable" it asks again later."""
    broker_said = suspicion is not None and suspicion.code() > 0
    for look in range(1 if broker_said else 2):
        if look:
            time.sleep(_CONFIRM_PAUSE_S)
        try:
            metadata = list_all(_CONFIRM_LOOK_S)
        except KafkaException:
            return False
        if named_in(metadata, kafka_topic, partition) is not False:
            return False
    return True


def _new_topic_unknown(exc: Exception) -> float | None:
    """How long "unknown topic" is asked again: the topic may be just created, and the broker
    asked not have heard of it yet."""
    if isinstance(exc, KafkaException) and is_topic_gone(kafka_error(exc)):
        return _NEW_TOPIC_S
    return None


def _unreached(client: AdminClient) -> BaseException | None:
    """Why ``client`` got no answer from Kafka within :data:`_RENEW_LOOK_S`; None if it did."""
    try:
        cluster_answer(client, _RENEW_LOOK_S)  # not DescribeCluster: see cluster_answer
    except KafkaException as exc:
        return exc
    return None


class TopicAdmin:
    """Create, describe, grow, alter and delete topics (data and state) with one AdminClient.

    The client is made anew when its calls have gone unanswered for :data:`RENEW_AFTER_S`
    while a new client reaches Kafka: after a broker outage of half a minute a gateway's
    client was seen failing every call ("Failed while waiting for controller", "Failed to get
    metadata: Local: Broker transport failure") for minutes, while the gateway's other
    clients, and every client made after the outage, talked to the same broker."""

    def __init__(self, settings: KafkaSettings, logger: Any = None) -> None:
        """``logger``: librdkafka's ``logger`` for every client made (its lines reach it when
        :meth:`serve_log` is called); without one they go where ``settings`` says."""
        self.settings = settings
        self._logger = logger
        self.ns = settings.namespace
        self.client = self._new_client()
        self._timeout = settings.operation_timeout_s
        self._beside: tuple[str, ...] = ()
        self._beside_at = -_BESIDE_S
        self._unanswered_since: float | None = None
        self._renewing = threading.Lock()
        self._renew_looked = -RENEW_AFTER_S
        self.renewals = 0
        """How many times the client was replaced (see :meth:`_renew`)."""

    def _new_client(self) -> AdminClient:
        try:
            config = self.settings.admin_config()
            if self._logger is not None:
                config["logger"] = self._logger
            return AdminClient(config)
        except KafkaException as exc:
            refused = refused_property(exc)
            if refused is None:
                raise
            raise refused from None

    # -- a client that stays broken -----------------------------------------------------------
    def _answered(self) -> None:
        self._unanswered_since = None

    def _unanswered(self, error: KafkaError | None) -> None:
        """Note a call that failed; one that no broker answered, for :data:`RENEW_AFTER_S`
        in a row, starts a look (in the background) whether a new client does better."""
        if error is not None and error.code() not in NO_BROKER_CODES:
            self._answered()  # a broker answered, if only with an error
            return
        now = time.monotonic()
        since = self._unanswered_since
        if since is None:
            self._unanswered_since = now
            return
        if now - since < RENEW_AFTER_S or now - self._renew_looked < RENEW_AFTER_S:
            return
        if not self._renewing.acquire(blocking=False):
            return  # a look is under way
        self._renew_looked = now
        threading.Thread(
            target=self._renew, args=(now - since,), name="logbroker-admin-renew", daemon=True
        ).start()

    def _renew(self, failing_s: float) -> None:
        """Replace the client if a new one reaches Kafka and the old one, asked right after,
        still does not; keep it if Kafka is away for the new one too (the old one then
        reconnects as usual once Kafka is back).  The old client is used no more and dropped
        once the calls in flight on it have had their timeout."""
        retired: AdminClient | None = None
        try:
            fresh = self._new_client()
            failure = _unreached(fresh)
            if failure is not None:
                log.debug("a new admin client does not reach Kafka either: %s", failure)
                return
            # Kafka has just come back, most likely: the old client is given the same chance
            old = self.client
            if _unreached(old) is None:
                self._answered()
                return
            retired, self.client = old, fresh
            self._unanswered_since = None
            self.renewals += 1
            log.warning(
                "the Kafka admin client's calls went unanswered for %.0f s while a new "
                "client reaches Kafka: replaced by the new one",
                failing_s,
            )
        except Exception:  # the look must never take the gateway down
            log.exception("renewing the Kafka admin client")
        finally:
            self._renewing.release()
        if retired is not None:
            time.sleep(self._timeout + 5)
            del retired  # librdkafka's destroy runs here, not in a caller's thread

    def serve_log(self) -> None:
        """Hand the lines the client logged since to the ``logger`` it was made with."""
        self.client.poll(0)

    def _list_all(self, timeout_s: float) -> Any:
        """The whole cluster's metadata (``list_topics``)."""
        try:
            metadata = self.client.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            self._unanswered(kafka_error(exc))
            raise
        self._answered()
        return metadata

    def _other_installations(
        self, kafka_names: Iterable[str] | None = None, timeout_s: float | None = None
    ) -> tuple[str, ...]:
        """The namespaces of other installations this one's names could reach into (see
        ``naming.namespaces_beside``), from ``kafka_names`` or a listing at most
        :data:`_BESIDE_S` old."""
        now = time.monotonic()
        if kafka_names is None:
            if now - self._beside_at < _BESIDE_S:
                return self._beside
            try:
                kafka_names = self._list_all(timeout_s or self._timeout).topics
            except KafkaException as exc:
                raise as_store_error(exc, "listing topics") from exc
        self._beside = naming.namespaces_beside(self.ns, kafka_names)
        self._beside_at = now
        return self._beside

    def _unknown_or_unavailable(
        self, name: str, exc: BaseException, what: str
    ) -> UnknownTopic | StoreUnavailable:
        """``UnknownTopic`` for a topic Kafka said it does not know, if Kafka confirms it
        (:func:`confirmed_gone`); ``StoreUnavailable`` if it does not."""
        kafka_name = naming.data_topic(self.ns, name)
        if confirmed_gone(
            self._list_all,
            kafka_name,
            suspicion=kafka_error(exc),
        ):
            return UnknownTopic(f"unknown topic {name!r}")
        return StoreUnavailable(
            f"Kafka unavailable ({what}): {kafka_error(exc) or exc}; yet its metadata does "
            f"not show {name!r} gone"
        )

    def _refuse_another_installations(self, name: str, timeout_s: float | None = None) -> None:
        """UnknownTopic for a name that is another installation's topic (its namespace starts
        with this one's), or a Kafka topic no logbroker topic can be (``__...``: Kafka's own,
        an installation's owners or state topics, reached through a namespace starting with
        ``__``): it is not this installation's to read, write or delete."""
        kafka_name = naming.data_topic(self.ns, name)
        if naming.logbroker_topic(self.ns, kafka_name) is None:
            raise UnknownTopic(
                f"unknown topic {name!r}: {kafka_name!r} is an internal topic (of Kafka or "
                "of a logbroker installation), never a logbroker topic"
            )
        beside = self._other_installations(timeout_s=timeout_s)
        other = next((o for o in beside if kafka_name.startswith(o)), None)
        if other is not None:
            raise UnknownTopic(
                f"unknown topic {name!r}: {kafka_name!r} is a topic of the installation of "
                f"namespace {other!r} on this Kafka cluster"
            )

    def _wait(
        self, future: concurrent.futures.Future[object], what: str, timeout_s: float | None = None
    ) -> object:
        try:
            result = future.result(timeout=(timeout_s or self._timeout) + 5)
        except concurrent.futures.TimeoutError:
            self._unanswered(None)
            raise StoreUnavailable(f"Kafka did not answer ({what}) in time") from None
        except KafkaException as exc:
            self._unanswered(kafka_error(exc))
            raise
        self._answered()
        return result

    # -- looking ------------------------------------------------------------------------------
    def describe(self, name: str, *, timeout_s: float | None = None) -> KafkaTopic:
        """The topic's identity and partition count; ``UnknownTopic`` if Kafka has none.

        A broker that does not know a topic the cluster's metadata names (made a moment ago,
        by another gateway) is asked again for up to :data:`_NEW_TOPIC_S`, within
        ``timeout_s``: what Kafka is given to answer (default: the operation timeout)."""
        kafka_name = naming.data_topic(self.ns, name)
        timeout = timeout_s or self._timeout
        self._refuse_another_installations(name, timeout)

        def ask(_remaining_s: float) -> Any:
            futures = self.client.describe_topics(
                TopicCollection([kafka_name]), request_timeout=timeout
            )
            return self._wait(futures[kafka_name], f"describing {name}", timeout)

        # what the cluster's metadata said of the topic after the last "unknown topic"
        last_listing: list[bool | None] = [None]

        def retried_for(exc: Exception) -> float | None:
            # A topic another gateway has just made: the metadata names it before every
            # broker can describe it.  Asked again for the moment that takes, as after this
            # gateway's own creation (see ``create``), not answered 503 at once: the
            # gateways that lost the race to make a new log type's topic did that, and their
            # push-clients failed over.
            last_listing[0] = None
            if not isinstance(exc, KafkaException) or not is_topic_gone(kafka_error(exc)):
                return None
            try:
                named = named_in(self._list_all(_CONFIRM_LOOK_S), kafka_name)
            except KafkaException:
                return None
            last_listing[0] = named
            return min(_NEW_TOPIC_S, timeout) if named else None

        try:
            description: Any = ask_again(
                ask, timeout_s=timeout, retried_for=retried_for, pause_s=0.05
            )
        except KafkaException as exc:
            error = as_store_error(exc, f"describing {name}")
            if isinstance(error, UnknownTopic):
                suspicion = kafka_error(exc)
                if last_listing[0] is False and suspicion is not None and suspicion.code() > 0:
                    # A broker's "unknown topic" and the cluster's metadata not naming it
                    # right after: the certainty ``confirmed_gone`` asks for, already had.
                    # Not looked at again: a topic made between the two looks (another
                    # gateway's first write of a new log type) was answered "unavailable".
                    # Said as the embedded store says it: "the topic is gone" with Kafka's
                    # code read as a deletion, of a name that never was a topic.
                    raise UnknownTopic(f"unknown topic {name!r}") from None
                raise self._unknown_or_unavailable(name, exc, f"describing {name}") from None
            raise error from exc
        return KafkaTopic(
            name,
            kafka_name,
            naming.topic_id_text(description.topic_id),
            len(description.partitions),
        )

    def reachable(self, timeout_s: float) -> str | None:
        """Return the cluster's id (None if the broker does not say) once a broker answered a
        metadata request, or raise StoreUnavailable."""
        # the metadata of all topics, not DescribeCluster, which a broker shutting down makes
        # librdkafka abort the process on (see cluster_answer), nor of one topic, which a
        # broker with auto.create.topics.enable would create
        try:
            metadata = cluster_answer(self.client, timeout_s)
        except KafkaException as exc:
            self._unanswered(kafka_error(exc))
            raise as_store_error(exc, "asking Kafka for the cluster's metadata") from exc
        self._answered()
        cluster_id = getattr(metadata, "cluster_id", None)
        return str(cluster_id) if cluster_id else None

    def names(self) -> list[str]:
        """Every logbroker topic of this namespace, sorted."""
        try:
            metadata = self._list_all(self._timeout)
        except KafkaException as exc:
            raise as_store_error(exc, "listing topics") from exc
        names = []
        beside = self._other_installations(metadata.topics)
        for kafka_name in metadata.topics:
            name = naming.logbroker_topic(self.ns, kafka_name, beside)
            if name is not None:
                names.append(name)
        return sorted(names)

    def config(self, name: str) -> TopicConfig:
        """The topic's settings (``partitions`` left 0), for a topic known to exist.

        A broker that has not heard of a topic just created says it does not exist: that is
        asked again for a few seconds before it is believed.
        """
        resource = ConfigResource(ConfigResource.Type.TOPIC, naming.data_topic(self.ns, name))

        def ask(_remaining_s: float) -> object:
            futures = self.client.describe_configs([resource], request_timeout=self._timeout)
            return self._wait(futures[resource], f"describing {name}'s configuration")

        try:
            entries = ask_again(
                ask, timeout_s=self._timeout, retried_for=_new_topic_unknown, pause_s=0.1
            )
        except KafkaException as exc:
            error = as_store_error(exc, f"describing {name}")
            if isinstance(error, UnknownTopic):
                raise self._unknown_or_unavailable(name, exc, f"describing {name}") from None
            raise error from exc
        assert isinstance(entries, dict)

        def number(key: str) -> int | None:
            entry = entries.get(key)
            if entry is None or entry.value is None:
                return None
            value = int(entry.value)
            return None if value < 0 else value

        return TopicConfig(
            partitions=0,
            retention_ms=number("retention.ms"),
            retention_bytes=number("retention.bytes"),
            segment_bytes=number("segment.bytes") or KAFKA_MIN_SEGMENT_BYTES,
        )

    def partition_infos(self, topic: KafkaTopic) -> list[PartitionInfo]:
        """Start and end (last stable) offsets of every partition, in two requests."""
        parts = [TopicPartition(topic.kafka_name, p) for p in range(topic.partitions)]

        def ask(_remaining_s: float) -> tuple[dict[int, int], dict[int, int]]:
            earliest = self._list_offsets({tp: OffsetSpec.earliest() for tp in parts}, topic.name)
            latest = self._list_offsets({tp: OffsetSpec.latest() for tp in parts}, topic.name)
            return earliest, latest

        def retried_for(exc: Exception) -> float | None:
            if isinstance(exc, UnknownTopic):  # a topic just created, unknown to the broker asked
                return _NEW_TOPIC_S
            # a leader that moved (a cluster starting, a broker gone): asked again once
            # librdkafka's metadata names the new one, within the operation timeout
            if isinstance(exc, StoreUnavailable) and is_metadata_lag(kafka_error(exc)):
                return self._timeout
            return None

        try:
            earliest, latest = ask_again(
                ask, timeout_s=self._timeout, retried_for=retried_for, pause_s=0.1
            )
        except UnknownTopic as exc:
            raise self._unknown_or_unavailable(topic.name, exc, f"offsets of {topic.name}") from exc
        return [
            PartitionInfo(p, earliest[p], max(earliest[p], latest[p]), None, None)
            for p in range(topic.partitions)
        ]

    def _list_offsets(self, specs: dict[TopicPartition, OffsetSpec], name: str) -> dict[int, int]:
        """The offsets ``specs`` ask for, per partition.

        A partition's leader just elected answers ``OFFSET_NOT_AVAILABLE`` ("Leader high
        watermark is not caught up") until its followers caught up: asked again within the
        operation timeout, then ``StoreUnavailable``.  (librdkafka does not call it
        retriable; taken for a failure at once, a push delivery and a reader failed for a
        moment after every leader change.)"""
        if not specs:
            return {}
        what = f"offsets of {name}"

        def ask(_remaining_s: float) -> dict[int, int]:
            futures = self.client.list_offsets(
                specs,
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=self._timeout,
            )
            found: dict[int, int] = {}
            for tp, future in futures.items():
                result: Any = self._wait(future, what)
                found[tp.partition] = known_offset(int(result.offset), what)
            return found

        def retried_for(exc: Exception) -> float | None:
            error = kafka_error(exc)
            if error is not None and error.code() == KafkaError.OFFSET_NOT_AVAILABLE:
                return self._timeout
            return None

        try:
            return ask_again(ask, timeout_s=self._timeout, retried_for=retried_for, pause_s=0.1)
        except KafkaException as exc:
            raise as_store_error(exc, what) from exc

    # -- changing -----------------------------------------------------------------------------
    def create(self, name: str, config: TopicConfig, *, exist_ok: bool) -> KafkaTopic:
        kafka_name = naming.data_topic(self.ns, name)
        try:
            self._refuse_another_installations(name)
        except UnknownTopic as exc:
            raise BadRequest(f"{exc}; it is not created here") from None
        new = NewTopic(
            kafka_name,
            num_partitions=config.partitions,
            replication_factor=self.settings.replication_factor,
            config=_config_dict(config, self.settings),
        )
        deadline = time.monotonic() + _RECREATE_WAIT_S
        while True:
            futures = self.client.create_topics([new], request_timeout=self._timeout)
            try:
                self._wait(futures[kafka_name], f"creating {name}")
                break
            except KafkaException as exc:
                error = kafka_error(exc)
                code = error.code() if error is not None else None
                if code == KafkaError.TOPIC_ALREADY_EXISTS:
                    if not exist_ok:
                        raise TopicExists(f"topic {name!r} exists") from None
                    break
                if code == KafkaError.INVALID_REPLICATION_FACTOR:
                    raise StoreUnavailable(f"creating {name}: {error}") from None
                if code in (KafkaError.INVALID_PARTITIONS, KafkaError.INVALID_CONFIG):
                    raise BadRequest(f"creating {name}: {error}") from None
                if code == KafkaError.TOPIC_EXCEPTION:
                    # a name Kafka refuses: above all one that collides with an existing
                    # topic's, since Kafka's metrics take '.' and '_' for the same
                    detail = error.str() if error is not None else str(exc)
                    raise BadRequest(
                        f"topic {name!r} cannot be made on Kafka: {detail} (Kafka takes "
                        "'.' and '_' in topic names for the same); use another name"
                    ) from None
                # a topic of this name that is still being deleted: wait for it to go
                if time.monotonic() > deadline or (error is not None and not error.retriable()):
                    raise as_store_error(exc, f"creating {name}") from exc
                time.sleep(0.2)
        # A topic just created may take a moment to show in the metadata brokers answer with.
        # (or a broker says it does not know it while the metadata shows it: unavailable)
        try:
            topic = ask_again(
                lambda _remaining_s: self.describe(name),
                timeout_s=self._timeout,
                retried_for=lambda exc: (
                    self._timeout if isinstance(exc, UnknownTopic | StoreUnavailable) else None
                ),
                pause_s=0.05,
            )
        except UnknownTopic:
            raise StoreUnavailable(f"created {name}, but Kafka does not show it") from None
        self.ensure_state_topic(topic)
        return topic

    def ensure_state_topic(self, topic: KafkaTopic) -> tuple[str, bool]:
        """The topic's state topic, created or grown to the data topic's partitions; and
        whether this call created it (then a caller that finds the data topic deleted
        meanwhile deletes it again, see :meth:`delete_state_topic`)."""
        state = naming.state_topic(self.ns, topic.topic_id)
        new = NewTopic(
            state,
            num_partitions=topic.partitions,
            replication_factor=self.settings.replication_factor,
            config={
                # deleted below snapshots by logbroker, never by time or size
                "cleanup.policy": "delete",
                "retention.ms": "-1",
                "retention.bytes": "-1",
                "segment.bytes": str(_STATE_SEGMENT_BYTES),
                "max.message.bytes": str(self.settings.max_message_bytes),
                **(
                    {"min.insync.replicas": str(self.settings.min_insync_replicas)}
                    if self.settings.min_insync_replicas is not None
                    else {}
                ),
            },
        )
        futures = self.client.create_topics([new], request_timeout=self._timeout)
        try:
            self._wait(futures[state], f"creating the state of {topic.name}")
            return state, True
        except KafkaException as exc:
            error = kafka_error(exc)
            if error is None or error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise as_store_error(exc, f"creating the state of {topic.name}") from exc
        self._grow(state, topic.partitions, f"the state of {topic.name}")
        return state, False

    def delete_state_topic(self, topic: KafkaTopic) -> None:
        """Delete the state topic of a data topic that is gone (made again by a writer that
        looked at the data topic just before its deletion); a failure is only logged."""
        state = naming.state_topic(self.ns, topic.topic_id)
        futures = self.client.delete_topics([state], request_timeout=self._timeout)
        try:
            self._wait(futures[state], f"deleting the state of deleted {topic.name}")
        except (KafkaException, StoreUnavailable) as exc:
            log.warning("deleting the state topic %s of deleted %s: %s", state, topic.name, exc)

    def _grow(self, kafka_name: str, count: int, what: str) -> None:
        futures = self.client.create_partitions(
            [NewPartitions(kafka_name, count)], request_timeout=self._timeout
        )
        try:
            self._wait(futures[kafka_name], f"growing {what}")
        except KafkaException as exc:
            error = kafka_error(exc)
            # "already has N partitions" (or more): nothing to do, partitions never shrink;
            # callers check a request to shrink before they get here
            if error is not None and error.code() == KafkaError.INVALID_PARTITIONS:
                return
            raise as_store_error(exc, f"growing {what}") from exc

    def _partition_count(self, kafka_name: str) -> int | None:
        futures = self.client.describe_topics(
            TopicCollection([kafka_name]), request_timeout=self._timeout
        )
        try:
            description = self._wait(futures[kafka_name], f"describing {kafka_name}")
        except KafkaException:
            return None
        return len(description.partitions)  # type: ignore[attr-defined]

    def grow(self, topic: KafkaTopic, count: int) -> None:
        if count < topic.partitions:
            raise BadRequest(
                f"topic {topic.name!r} has {topic.partitions} partitions; partitions never shrink"
            )
        if count > MAX_PARTITIONS:
            raise BadRequest(f"partitions must be at most {MAX_PARTITIONS}")
        if count == topic.partitions:
            return
        # state first: a data partition never exists without its changelog partition
        state = naming.state_topic(self.ns, topic.topic_id)
        if self._partition_count(state) is not None:
            self._grow(state, count, f"the state of {topic.name}")
        self._grow(topic.kafka_name, count, topic.name)

    def alter(self, name: str, config: TopicConfig) -> None:
        resource = ConfigResource(
            ConfigResource.Type.TOPIC,
            naming.data_topic(self.ns, name),
            incremental_configs=[
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
                for key, value in _config_dict(config, self.settings).items()
                if key in ("retention.ms", "retention.bytes", "segment.bytes")
            ],
        )
        futures = self.client.incremental_alter_configs([resource], request_timeout=self._timeout)
        try:
            self._wait(futures[resource], f"altering {name}")
        except KafkaException as exc:
            raise as_store_error(exc, f"altering {name}") from exc

    def delete(self, topic: KafkaTopic) -> None:
        """Delete the data topic and its state topic, in one request.

        Together, not one after the other: a writer that took a partition over just before
        the deletion writes each commit's records to the data topic *by name* and its state
        change to the state topic of the old identity, so once both are gone its commits
        fail, also into a topic made again under the name meanwhile (which the data topic
        deleted alone, the state topic still there, would have let one through)."""
        names = [topic.kafka_name, naming.state_topic(self.ns, topic.topic_id)]
        futures = self.client.delete_topics(names, request_timeout=self._timeout)
        for kafka_name in names:
            try:
                self._wait(futures[kafka_name], f"deleting {topic.name}")
            except KafkaException as exc:
                error = kafka_error(exc)
                if error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue
                raise as_store_error(exc, f"deleting {topic.name}") from exc

    def delete_records(self, kafka_name: str, partition: int, before: int) -> int:
        """Delete the records below ``before``; returns the new log start offset."""
        futures = self.client.delete_records(
            [TopicPartition(kafka_name, partition, before)], request_timeout=self._timeout
        )
        try:
            for future in futures.values():
                result = self._wait(future, f"deleting records of {kafka_name}/{partition}")
                return int(result.low_watermark)  # type: ignore[attr-defined]
        except KafkaException as exc:
            raise as_store_error(exc, f"deleting records of {kafka_name}/{partition}") from exc
        raise StoreUnavailable("Kafka answered no delete_records result")

    def delete_records_later(self, kafka_name: str, partition: int, before: int) -> None:
        """Like :meth:`delete_records` without waiting; a failure is only logged (the next
        snapshot deletes the same records again)."""
        futures = self.client.delete_records(
            [TopicPartition(kafka_name, partition, before)], request_timeout=self._timeout
        )
        for future in futures.values():
            future.add_done_callback(_log_failure)

    def fetch_topics(self, names: Iterable[str]) -> list[KafkaTopic]:
        """Describe several topics at once; topics gone meanwhile are left out."""
        beside = self._other_installations()
        names = [n for n in names if naming.logbroker_topic(self.ns, self.ns + n, beside)]
        kafka_names = [naming.data_topic(self.ns, n) for n in names]
        if not kafka_names:
            return []
        futures = self.client.describe_topics(
            TopicCollection(kafka_names), request_timeout=self._timeout
        )
        found = []
        for name, kafka_name in zip(names, kafka_names, strict=True):
            try:
                description = self._wait(futures[kafka_name], f"describing {name}")
            except KafkaException as exc:
                error = as_store_error(exc, f"describing {name}")
                if isinstance(error, UnknownTopic):
                    error = self._unknown_or_unavailable(name, exc, f"describing {name}")
                    if isinstance(error, UnknownTopic):
                        continue  # deleted since the listing
                raise error from exc
            found.append(
                KafkaTopic(
                    name,
                    kafka_name,
                    naming.topic_id_text(description.topic_id),  # type: ignore[attr-defined]
                    len(description.partitions),  # type: ignore[attr-defined]
                )
            )
        return found


def _log_failure(future: concurrent.futures.Future[object]) -> None:
    exc = future.exception()
    if exc is not None:
        log.warning("deleting changelog records before a snapshot failed: %s", exc)
