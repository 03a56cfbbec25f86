"""The Kafka names logbroker makes, all in one place and all under the settings' namespace.

=====================================  ==========================================================
data topic                             ``<ns><topic>`` (the logbroker topic name itself)
state changelog of a topic             ``__<ns>logbroker-state.<topic id>``, one partition per
                                       data partition; named by the data topic's identity, so
                                       a topic deleted and created again never inherits it
ownership announcements                ``__<ns>logbroker-owners`` (compacted)
transactional id of a partition        ``<ns>logbroker-<topic>-<partition>``: every writer of
                                       the partition uses it, so each new one fences the last
snapshot positions                     consumer group ``<ns>logbroker-state-snapshots``
the gateways' group                    consumer group ``<ns>logbroker-gateways``
=====================================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

_MASK = (1 << 64) - 1
_OWNERS = "logbroker-owners"


def data_topic(namespace: str, topic: str) -> str:
    return f"{namespace}{topic}"


def logbroker_topic(namespace: str, kafka_topic: str, beside: Sequence[str] = ()) -> str | None:
    """The logbroker topic a Kafka topic is, or None if it is not one of this namespace's
    (``beside``: the namespaces of other installations that start with this one's, see
    :func:`namespaces_beside`)."""
    if not kafka_topic.startswith(namespace) or kafka_topic.startswith("__"):
        return None
    if any(kafka_topic.startswith(other) for other in beside):
        return None
    return kafka_topic[len(namespace) :]


def namespaces_beside(namespace: str, kafka_topics: Iterable[str]) -> tuple[str, ...]:
    """The namespaces of the other installations on the cluster whose topic names start with
    this namespace (every other one, for the default empty namespace): without them, this
    installation would take their topics for its own, read, take over and delete them.

    Each installation's gateways keep an ownership topic, ``__<ns>logbroker-owners``; an
    installation that never ran a gateway is not seen."""
    found = []
    for name in kafka_topics:
        if name.startswith("__") and name.endswith(_OWNERS):
            other = name[2 : -len(_OWNERS)]
            if other != namespace and other.startswith(namespace):
                found.append(other)
    return tuple(sorted(found))


def state_topic(namespace: str, topic_id: str) -> str:
    return f"__{namespace}logbroker-state.{topic_id}"


def owners_topic(namespace: str) -> str:
    return f"__{namespace}{_OWNERS}"


def transactional_id(namespace: str, topic: str, partition: int) -> str:
    return f"{namespace}logbroker-{topic}-{partition}"


def snapshot_group(namespace: str) -> str:
    return f"{namespace}logbroker-state-snapshots"


def gateway_group(namespace: str) -> str:
    return f"{namespace}logbroker-gateways"


def reader_group(namespace: str) -> str:
    """The group id readers must carry; they never join it or commit to it."""
    return f"{namespace}logbroker-readers"


def topic_id_text(uuid: Any) -> str:
    """A Kafka topic id (``confluent_kafka.Uuid``) as 32 hex digits, usable in topic names."""
    msb = uuid.get_most_significant_bits() & _MASK
    lsb = uuid.get_least_significant_bits() & _MASK
    return f"{msb:016x}{lsb:016x}"
