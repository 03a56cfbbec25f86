"""Delivery's server-side state (groups, offsets, push positions) kept in the log store.

The state lives in the state area of an internal topic's partitions, so every gateway process
over the same store (several uvicorn workers, or several gateways over one Kafka cluster) sees
the same groups and offsets: no per-instance consumer state, nothing like "consumer instance
not found" behind a load balancer.  Each document is JSON under one key and is changed only
inside the partition's write lock, so a read-modify-write is atomic across processes.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

from log_store.errors import TopicExists
from log_store.interface import LogStore, PartitionState, TopicConfig

INTERNAL_TOPIC = "logbroker-internal.delivery"
INTERNAL_PREFIX = "logbroker-internal."
_PARTITIONS = 4
_DELETED = b""

T = TypeVar("T")
Doc = dict[str, Any]


def is_internal(topic: str) -> bool:
    return topic.startswith(INTERNAL_PREFIX)


class InternalState:
    """JSON documents by key, each updated atomically."""

    def __init__(self, store: LogStore) -> None:
        self._store = store
        # Another process may create it between exist_ok's check and our create.
        with contextlib.suppress(TopicExists):
            store.create_topic(INTERNAL_TOPIC, TopicConfig(partitions=_PARTITIONS), exist_ok=True)
        if len(store.describe_topic(INTERNAL_TOPIC).partitions) < _PARTITIONS:
            store.set_partitions(INTERNAL_TOPIC, _PARTITIONS)

    @staticmethod
    def _partition(key: str) -> int:
        # Always the constant count, never the topic's current one: every process, started
        # before or after someone grew the topic, must find a key in the same partition.
        return zlib.crc32(key.encode("utf-8")) % _PARTITIONS

    def get(self, key: str) -> Doc | None:
        raw = self._store.get_state(INTERNAL_TOPIC, self._partition(key), key)
        if not raw:
            return None
        doc: Doc = orjson.loads(raw)
        return doc

    def update(self, key: str, change: Callable[[Doc | None], tuple[Doc | None, T]]) -> T:
        """Apply ``change(old) -> (new, result)`` atomically; ``new`` None deletes the key.

        ``change`` runs under the partition's write lock: it must be quick and must not touch
        the store.  An exception from it changes nothing and is raised here.
        """
        box: list[T] = []

        def fn(state: PartitionState) -> list[bytes]:
            raw = state.get(key) or None
            # ``change`` may edit the document it is given in place; compare bytes, not dicts.
            new, result = change(orjson.loads(raw) if raw else None)
            new_raw = None if new is None else orjson.dumps(new)
            if new_raw != raw:
                state.put(key, _DELETED if new_raw is None else new_raw)
            box.append(result)
            return []

        self._store.transact(INTERNAL_TOPIC, self._partition(key), fn)
        return box[-1]
