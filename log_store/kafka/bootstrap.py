"""The bootstrap servers of a Kafka cluster, as librdkafka takes them, whether their names
resolve, and whether a broker answers.

librdkafka treats a bootstrap name that does not resolve like a broker that does not answer:
it tries again, forever, so a misspelt ``--kafka-bootstrap`` would look like a cluster that is
down.  A name the resolver says does not exist is a mistake in the configuration, told at
once; a resolver that cannot answer now (``EAI_AGAIN``: no network yet) is an outage, waited
for like an unreachable broker (by a gateway; a command asks for a few seconds, see
:func:`check_reachable`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from log_store.errors import BadRequest, StoreUnavailable
from log_store.kafka.failures import kafka_error
from log_store.kafka.settings import DEBUG_LOG, KafkaSettings, refused_property

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


class _LastFailure:
    """A librdkafka ``logger`` that keeps the last error line (why a broker was not reached)
    and passes every line on to :data:`~log_store.kafka.settings.DEBUG_LOG`."""

    def __init__(self) -> None:
        self.last: str | None = None

    def log(self, level: int, msg: str, *args: object) -> None:
        DEBUG_LOG.log(level, msg, *args)
        if level >= logging.ERROR:
            self.last = (msg % args) if args else msg


def _reason(line: str) -> str:
    """``Connect to ipv4#127.0.0.1:9 failed: Connection refused`` out of a librdkafka line
    ``FAIL [name] [thrd:...]: 127.0.0.1:9/bootstrap: Connect to ... (after 0ms in state
    CONNECT)``."""
    text = line.rsplit("]: ", 1)[-1]
    broker, sep, rest = text.partition(": ")
    if sep and "/" in broker:
        text = rest
    return text.split(" (after ", 1)[0].strip()


def check_reachable(settings: KafkaSettings, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Return once a broker of ``settings.bootstrap`` answered a request; else raise, in one
    line, what is wrong: ``BadRequest`` for a name that does not exist or a property librdkafka
    refuses, ``StoreUnavailable`` ("cannot reach Kafka at HOST:PORT: why") when no broker
    answered within ``timeout_s``.  librdkafka's own lines go to the Python logger only."""
    check_bootstrap_names(settings.bootstrap)
    heard = _LastFailure()
    config: dict[str, Any] = {**settings.admin_config(), "logger": heard}
    try:
        client = AdminClient(config)
    except KafkaException as exc:
        refused = refused_property(exc)
        if refused is None:
            raise
        raise refused from None
    # DescribeCluster: never creates a topic, whatever the broker's auto-creation
    future = client.describe_cluster(request_timeout=timeout_s)
    try:
        future.result(timeout=timeout_s + 0.5)
        return
    except KafkaException as exc:
        error = kafka_error(exc)
        why = error.str() if error is not None else str(exc)
    except concurrent.futures.TimeoutError:
        why = "no answer"
    client.poll(0)  # hands the lines logged meanwhile to ``heard``
    if heard.last is not None:
        why = _reason(heard.last)
    raise StoreUnavailable(
        f"cannot reach Kafka at {settings.bootstrap}: {why} (no broker answered within "
        f"{timeout_s:g} s)"
    )
