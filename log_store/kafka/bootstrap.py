"""The bootstrap servers of a Kafka cluster, as librdkafka takes them, and whether their
names resolve.

librdkafka treats a bootstrap name that does not resolve like a broker that does not answer:
it tries again, forever, so a misspelt ``--kafka-bootstrap`` would look like a cluster that is
down.  A name the resolver says does not exist is a mistake in the configuration, told at
once; a resolver that cannot answer now (``EAI_AGAIN``: no network yet) is an outage, waited
for like an unreachable broker.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from log_store.errors import BadRequest

_DEFAULT_PORT = 9092


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
