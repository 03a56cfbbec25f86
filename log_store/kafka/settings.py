"""How the Kafka backend talks to a cluster: one frozen object, and the client configs from it.

Every librdkafka client logbroker makes (transactional producers, read_committed consumers,
the admin client, the gateways' group member) starts from :meth:`KafkaSettings.client_base`:
the bootstrap servers plus ``properties`` passed through unchanged, which is where TLS and
SASL go (``security.protocol``, ``ssl.ca.location``, ``sasl.mechanism``, ...).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from log_store.errors import BadRequest
from log_store.kafka.outage import ClientLines

COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
LIBRDKAFKA_LOGS = ("gateway", "debug")
READER_FETCH_BYTES = 4 * 1024 * 1024
"""What one pull-read consumer asks for per fetch (of its one partition)."""
READER_QUEUE_BYTES = 2 * 1024 * 1024
"""What one pull-read consumer keeps prefetched at most, besides the fetch in flight."""
_NAMESPACE = re.compile(r"[a-z0-9._-]{0,40}")
# What logbroker sets itself: a pass-through property may not change exactly-once.
_RESERVED = frozenset(
    {
        "bootstrap.servers",
        "transactional.id",
        "enable.idempotence",
        "acks",
        "isolation.level",
        "group.id",
        "enable.auto.commit",
        "enable.partition.eof",
    }
)


@dataclass(frozen=True)
class KafkaSettings:
    """Settings of the Kafka backend (see ``docs/kafka.md`` for each one)."""

    bootstrap: str
    namespace: str = ""
    """Prefix of every Kafka topic, group and transactional id logbroker makes: several
    installations (or test runs) can share one cluster without seeing each other."""
    compression: str = "lz4"
    linger_ms: float = 0.0
    """The producers' ``linger.ms``.  0: a transaction's records are produced all at once and
    its commit sends them anyway; a linger only delays each commit (measured: 5 ms made a
    transaction cycle 1.5x longer)."""
    replication_factor: int = -1
    """Of every topic logbroker creates; -1 takes the broker's ``default.replication.factor``."""
    min_insync_replicas: int | None = None
    """Of every topic logbroker creates; None takes the broker's ``min.insync.replicas``."""
    properties: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    transaction_timeout_ms: int = 60_000
    operation_timeout_s: float = 15.0
    """How long an append or a takeover waits for the cluster before giving up (503)."""
    max_message_bytes: int = 16 * 1024 * 1024 + 64 * 1024
    snapshot_min_entries: int = 20_000
    """A partition's state is snapshotted once replaying its tail would cost about this many
    entries (or the table's size, if larger); takeover reads the snapshot plus that tail."""
    session_timeout_ms: int = 10_000
    """The gateways' group: a gateway silent this long loses its partitions to the others."""
    librdkafka_log: str = "gateway"
    """Where librdkafka's own warnings and errors go.  ``gateway``: to the Python logger
    ``log_store.kafka.librdkafka`` at DEBUG (fatal ones at their level), through
    :attr:`lines`, which keeps the last failure and whether a
    client lost every broker: the gateway says itself, now and then, that Kafka is away and
    why (see :mod:`log_store.kafka.outage`; the partition owners' producers' lines pass
    through ``partition_owner._ProducerLog`` first, a fenced one's at INFO).  ``debug``: every
    client's to that logger at DEBUG and nothing else, for commands that say themselves in
    one line what went wrong (``topics``, ``audit``)."""

    lines: ClientLines = field(default_factory=ClientLines, compare=False, repr=False)
    """What the clients made from these settings said (the ``logger`` and ``error_cb`` of each,
    with ``librdkafka_log = "gateway"``): the store's watch of Kafka reads it (see
    :mod:`log_store.kafka.outage`).  Settings copied with ``dataclasses.replace`` share it."""

    def __post_init__(self) -> None:
        if not self.bootstrap or not isinstance(self.bootstrap, str):
            raise BadRequest("kafka bootstrap servers (HOST:PORT[,HOST:PORT...]) are required")
        if not _NAMESPACE.fullmatch(self.namespace):
            raise BadRequest("kafka namespace must be 0-40 characters of [a-z0-9._-]")
        if self.compression not in COMPRESSIONS:
            raise BadRequest(f"kafka compression must be one of {', '.join(COMPRESSIONS)}")
        if self.linger_ms < 0:
            raise BadRequest("kafka linger_ms must not be negative")
        if self.replication_factor == 0 or self.replication_factor < -1:
            raise BadRequest("kafka replication_factor must be positive (or -1: broker default)")
        if self.min_insync_replicas is not None and self.min_insync_replicas < 1:
            raise BadRequest("kafka min_insync_replicas must be positive")
        if self.operation_timeout_s <= 0:
            raise BadRequest("kafka operation_timeout_s must be positive")
        if self.session_timeout_ms < 1000:
            raise BadRequest("kafka session_timeout_ms must be at least 1000")
        if self.librdkafka_log not in LIBRDKAFKA_LOGS:
            raise BadRequest(f"kafka librdkafka_log must be one of {', '.join(LIBRDKAFKA_LOGS)}")
        reserved = sorted(set(self.properties) & _RESERVED)
        if reserved:
            raise BadRequest(
                f"kafka properties {', '.join(reserved)} are set by logbroker itself "
                "(exactly-once depends on them)"
            )
        for key, value in self.properties.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise BadRequest("kafka properties must map strings to strings")

    # -- client configurations --------------------------------------------------------------
    def client_base(self) -> dict[str, Any]:
        lines: dict[str, Any] = (
            {"logger": DEBUG_LOG}
            if self.librdkafka_log == "debug"
            else {"logger": self.lines, "error_cb": self.lines.error}
        )
        return {
            "bootstrap.servers": self.bootstrap,
            "client.id": f"{self.namespace}logbroker",
            "log_level": 4,  # librdkafka's warnings and errors, to ``logger``
            **lines,
            "socket.keepalive.enable": True,
            # While the cluster is away, a consumer (it has a group id) asks for its group's
            # coordinator over and over, and with a 50 ms backoff librdkafka tried to
            # connect, and logged the failure, every 25 ms: 40 lines a second per consumer,
            # over 100 a second per gateway.  After an outage of more than a few seconds the
            # backoff has grown to its maximum anyway, so a client is back within about a
            # second of the cluster, as before.
            "reconnect.backoff.ms": 500,
            "reconnect.backoff.max.ms": 1000,
            # a broker that died is replaced (as leader, coordinator, controller) in the
            # clients' view within seconds, not at the next 5-minute refresh
            "topic.metadata.refresh.interval.ms": 2000,
            **self.properties,
        }

    def producer_config(self, transactional_id: str) -> dict[str, Any]:
        """A transactional (so idempotent, ``acks=all``) producer of one partition owner."""
        return {
            **self.client_base(),
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": self.compression,
            "linger.ms": self.linger_ms,
            "message.max.bytes": self.max_message_bytes + 4096,
            "batch.size": 16 * 1024 * 1024,
            "transaction.timeout.ms": self.transaction_timeout_ms,
            "message.timeout.ms": min(self.transaction_timeout_ms, 300_000),
            "queue.buffering.max.messages": 1_000_000,
            # a topic deleted under a writer fails its records in 2 s, not after 30 s
            "topic.metadata.propagation.max.ms": 2000,
            "retry.backoff.ms": 20,
            "retry.backoff.max.ms": 250,
        }

    def reader_config(self, group: str) -> dict[str, Any]:
        """A read_committed consumer that is assigned partitions by hand (never subscribes)."""
        return {
            **self.client_base(),
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 100,
            # What a consumer holds ahead of its reads: a fetch in flight plus its queue, and
            # a pooled consumer keeps prefetching while no read uses it.  A read asks for
            # 16 MiB shared among its partitions, so a few MiB per partition keep a reader
            # as fast (measured: a catching-up read was not slower) for a fraction of the
            # memory (with 64 + 16 MiB, one full read took a gateway from 80 to 600 MB).
            # A record batch larger than these is still fetched, alone.
            "fetch.max.bytes": READER_FETCH_BYTES,
            "max.partition.fetch.bytes": READER_FETCH_BYTES,
            "queued.max.messages.kbytes": READER_QUEUE_BYTES // 1024,
        }

    def admin_config(self) -> dict[str, Any]:
        return self.client_base()


class LibrdkafkaLog:
    """A librdkafka ``logger``: its lines, whatever their level, to the Python logger
    ``log_store.kafka.librdkafka`` at DEBUG.  (Lines reach it when the client is polled.)"""

    def __init__(self) -> None:
        self.logger = logging.getLogger("log_store.kafka.librdkafka")

    def log(self, level: int, msg: str, *args: object) -> None:
        self.logger.debug(msg, *args)


DEBUG_LOG = LibrdkafkaLog()


def refused_property(exc: KafkaException) -> BadRequest | None:
    """The settings' mistake if librdkafka refused a client's configuration (an unknown
    property in ``[kafka.properties]``, or a bad value), else None."""
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError) and error.code() == KafkaError._INVALID_ARG:
        return BadRequest(f"Kafka client settings: {error.str()}")
    return None
