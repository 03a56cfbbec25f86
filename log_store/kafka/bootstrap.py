"""The bootstrap servers of a Kafka cluster, as librdkafka takes them, whether their names
resolve, whether a broker answers, and whether the cluster takes a member of KIP-848's
consumer group protocol (:func:`check_group_protocol`), which the gateways' group needs.

librdkafka treats a bootstrap name that does not resolve like a broker that does not answer:
it tries again, forever, so a misspelt ``--kafka-bootstrap`` would look like a cluster that is
down.  A name the resolver says does not exist is a mistake in the configuration, told at
once; a resolver that cannot answer now (``EAI_AGAIN``: no network yet) is an outage, waited
for like an unreachable broker (by a gateway; a command asks for a few seconds, see
:func:`check_reachable`).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from log_store.errors import BadRequest, StoreUnavailable
from log_store.kafka import naming
from log_store.kafka.failures import kafka_error
from log_store.kafka.outage import ClientLines
from log_store.kafka.settings import KafkaSettings, refused_property

_DEFAULT_PORT = 9092
REACH_TIMEOUT_S = 5.0
"""How long a command waits for a broker to answer before it says it cannot reach Kafka:
a reachable cluster answers in milliseconds, a TLS and SASL handshake to a remote one in well
under a second, and librdkafka tries a refused connection again every 0.5-1 s, so 5 s is
several tries; a gateway waits for Kafka as long as it takes instead."""


@dataclass(frozen=True)
class BootstrapServer:
    """One ``[PROTOCOL://]HOST[:PORT]`` of ``bootstrap.servers``."""

    host: str
    port: int


def bootstrap_servers(servers: str) -> list[BootstrapServer]:
    """The servers of a comma-separated ``bootstrap.servers`` list, in order.

    Accepts what librdkafka accepts: an optional ``PROTOCOL://`` prefix, IPv6 addresses in
    brackets, and a missing port (9092).  A port that is not a number in 1..65535 is a
    ValueError naming the entry.
    """
    found = []
    for entry in servers.split(","):
        entry = entry.strip()
        if not entry:
            continue
        address = entry.split("://", 1)[-1]
        if address.startswith("["):
            host, _, rest = address[1:].partition("]")
            port_text = rest.removeprefix(":") if rest.startswith(":") else rest
        elif address.count(":") == 1:
            host, _, port_text = address.partition(":")
        else:
            host, port_text = address, ""  # a bare name, or an IPv6 address without a port
        port = _DEFAULT_PORT if port_text == "" else _port(port_text, entry)
        if not host:
            raise ValueError(f"{entry!r} names no host")
        found.append(BootstrapServer(host, port))
    return found


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535")
    return int(text)


def unknown_hosts(servers: str) -> list[str]:
    """The bootstrap hosts that the resolver says do not exist (``EAI_NONAME``,
    ``EAI_NODATA``), in order; a resolver that cannot answer now counts as no answer yet,
    not as a name that does not exist."""
    unknown: list[str] = []
    for server in bootstrap_servers(servers):
        if server.host in unknown or ":" in server.host:
            continue  # an IPv6 address has no name to resolve
        try:
            socket.getaddrinfo(server.host, server.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            if exc.errno in _NO_SUCH_NAME:
                unknown.append(server.host)
        except UnicodeError:  # a label longer than 63 characters, which no name can have
            unknown.append(server.host)
    return unknown


def check_bootstrap_names(servers: str) -> list[str]:
    """The bootstrap hosts whose names do not exist, when others do; BadRequest naming them
    when none does, or when the list is malformed.

    Unknown names beside known ones are not refused: the others may be a working cluster (a
    broker container that is down has no name in Docker's DNS), and librdkafka uses them.
    """
    try:
        hosts = {server.host for server in bootstrap_servers(servers)}
        unknown = unknown_hosts(servers)
    except ValueError as exc:
        raise BadRequest(f"Kafka bootstrap {servers}: {exc}") from None
    if hosts and len(unknown) == len(hosts):
        raise BadRequest(
            f"Kafka bootstrap {servers}: no such host: {', '.join(unknown)} "
            "(the name does not resolve)"
        )
    return unknown


_NO_SUCH_NAME = frozenset(
    code
    for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)


def cluster_answer(client: Any, timeout_s: float) -> Any:
    """The whole cluster's metadata (``list_topics()``) as a broker answered it within
    ``timeout_s``, naming at least one broker; else ``KafkaException``.

    Never DescribeCluster for this: librdkafka (2.3 to 2.16) aborts the whole process when
    a broker that is shutting down answers one (``rdkafka_admin.c:960:
    rd_kafka_admin_response_parse: Assertion 'rko_result' failed``).  Such a broker has been
    fenced by then, so its answer to a request for the brokers only names neither a broker
    nor a topic; librdkafka's metadata parser refuses it (``_PARTIAL``) without setting the
    reply's error, ``rd_kafka_DescribeClusterResponse_parse`` returns that unset error
    (success) with no result, and its caller asserts.  (DescribeTopics shares the flaw, but
    an answer naming the topic asked for passes the parser.)  The same refusal of a plain
    metadata request goes through librdkafka's metadata handler, which asks again or fails
    the call.  An answer with topics and no broker (the same broker, asked for all topics)
    passes that parser: it says nothing of who can be reached, so it is no answer here."""
    metadata = client.list_topics(timeout=timeout_s)
    if not metadata.brokers:
        raise KafkaException(
            KafkaError(KafkaError._PARTIAL, "Kafka's metadata named no broker (one shutting down)")
        )
    return metadata


def check_reachable(settings: KafkaSettings, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Return once a broker of ``settings.bootstrap`` answered a request; else raise, in one
    line, what is wrong: ``BadRequest`` for a name that does not exist or a property librdkafka
    refuses, ``StoreUnavailable`` ("cannot reach Kafka at HOST:PORT: why") when no broker
    answered within ``timeout_s``.  librdkafka's own lines go to the Python logger only."""
    check_bootstrap_names(settings.bootstrap)
    heard = ClientLines()
    config: dict[str, Any] = {**settings.admin_config(), "logger": heard}
    try:
        client = AdminClient(config)
    except KafkaException as exc:
        refused = refused_property(exc)
        if refused is None:
            raise
        raise refused from None
    try:
        # all topics: a request naming one could make a broker with auto-creation create it
        cluster_answer(client, timeout_s)
        return
    except KafkaException as exc:
        error = kafka_error(exc)
        why = error.str() if error is not None else str(exc)
    client.poll(0)  # hands the lines logged meanwhile to ``heard``
    if heard.last_failure is not None:
        why = heard.last_failure
    raise StoreUnavailable(
        f"cannot reach Kafka at {settings.bootstrap}: {why} (no broker answered within "
        f"{timeout_s:g} s)"
    )


GROUP_PROTOCOL_NEEDED = (
    "logbroker on Kafka needs Apache Kafka 4.0 or newer with the consumer group protocol of "
    "KIP-848 (group.coordinator.rebalance.protocols must include consumer)"
)


def group_fatal_error(event: Any) -> str | None:
    """What a group consumer's ``poll`` said if it was a fatal error, else None.

    librdkafka reports a fatal error of a group consumer (the broker refusing its heartbeat,
    say) as an event that ``poll`` returns, with the code ``_FATAL`` (its ``fatal()`` is not
    set, and ``error_cb`` is not called); the consumer is dead from then on, with no
    ``on_lost``: its member stops heartbeating, and the group gives its partitions to others.
    """
    if event is None:
        return None
    error = event.error()
    if error is None or not (error.code() == KafkaError._FATAL or error.fatal()):
        return None
    return str(error.str())


def group_fatal_cause(reason: str) -> str:
    """``reason`` (a fatal error of a group consumer) as an operator should read it: a
    broker without KIP-848's protocol is named as what logbroker needs."""
    refused = KafkaError(KafkaError.UNSUPPORTED_VERSION).str()  # "Broker: API version not ..."
    if "ConsumerGroupHeartbeat" in reason and refused in reason:
        return f"{GROUP_PROTOCOL_NEEDED}; the broker refused it: {reason}"
    return reason


def probe_group(namespace: str) -> str:
    """The group the start-up check joins for a moment (never the gateways' own: joining
    that would move partitions)."""
    return f"{naming.gateway_group(namespace)}-protocol-check"


def check_group_protocol(settings: KafkaSettings, timeout_s: float | None = None) -> bool:
    """Whether the cluster takes a member of a KIP-848 consumer group: True once the broker
    took the probe's member into its group, False if it neither took nor refused it within
    ``timeout_s`` (default ``operation_timeout_s``: a coordinator loading its partitions after
    a cluster's first start takes seconds).  BadRequest, with what logbroker needs, when the
    member's heartbeat fails for good (a broker before 4.0, or one with
    ``group.coordinator.rebalance.protocols=classic``).

    The broker's ApiVersions answer cannot tell: a 4.x broker with the protocol turned off
    still lists ConsumerGroupHeartbeat, and answers it UNSUPPORTED_VERSION.  So the probe
    joins a group of its own, subscribed to a topic that need not exist, and leaves it.
    """
    group = probe_group(settings.namespace)
    consumer = Consumer(
        {
            **settings.client_base(),
            "group.id": group,
            "group.protocol": "consumer",
            "group.remote.assignor": "range",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([group])
        wait = settings.operation_timeout_s if timeout_s is None else timeout_s
        return await_group_answer(consumer, group, time.monotonic() + wait)
    finally:
        consumer.close()


def await_group_answer(consumer: Any, group: str, deadline: float) -> bool:
    """Poll ``consumer`` (subscribed in ``group``) until the broker took its member (True),
    a fatal error (BadRequest naming it), or ``deadline`` (False)."""
    while time.monotonic() < deadline:
        fatal = group_fatal_error(consumer.poll(0.1))
        if fatal is not None:
            raise BadRequest(f"the gateways' group cannot be joined: {group_fatal_cause(fatal)}")
        if member_joined(consumer):
            return True
    return False


_GROUP_METADATA_MAGIC = b"CGMDv2:"
_EPOCH = struct.Struct("=i")


def member_joined(consumer: Any) -> bool:
    """Whether the broker took ``consumer``, a member of a KIP-848 group, into its group:
    its member epoch, which only the coordinator's answer to its heartbeat sets, is above 0
    (librdkafka's own test of a joined member, ``RD_KAFKA_CGRP_HAS_JOINED_CONSUMER``).

    The consumer knows this itself; the broker is not asked.  Asking it (the admin API's
    DescribeConsumerGroups, as this used to) can abort the whole process: librdkafka (2.16,
    and its master of July 2026, issue #4605) frees the request's state when its
    ``request_timeout`` expires before the group coordinator is known, and the lookup that
    ends later (the coordinator loading on a new cluster, a broker reachable again) uses the
    freed state: ``rdkafka_queue.h:1086: rd_kafka_enq_once_del_source_return: Assertion
    'eonce->refcnt > 0' failed``.  Every admin request sent to a group coordinator has that
    flaw (DescribeConsumerGroups, ListConsumerGroupOffsets, AlterConsumerGroupOffsets,
    DeleteConsumerGroupOffsets, DeleteGroups); no gateway makes one.

    The epoch is read from ``consumer_group_metadata()``, librdkafka's serialized form
    (``CGMDv2:``, then the epoch as a native int32); a form this does not know reads as
    not joined (a test holds it to the installed librdkafka).
    """
    try:
        metadata = consumer.consumer_group_metadata()
    except KafkaException:
        return False
    head = len(_GROUP_METADATA_MAGIC)
    if not isinstance(metadata, bytes) or not metadata.startswith(_GROUP_METADATA_MAGIC):
        return False
    if len(metadata) < head + _EPOCH.size:
        return False
    (epoch,) = _EPOCH.unpack_from(metadata, head)
    return bool(epoch > 0)
