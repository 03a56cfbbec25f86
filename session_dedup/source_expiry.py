"""Idle source expiry: the state of a source not written for a long time is forgotten.

Every source a partition ever saw keeps a last seqno (and maybe an epoch) in the partition's
state area, and a pin in the topic's state.  Kafka bounds its own producer state the same
way: a producer id that wrote nothing for ``producer.id.expiration.ms`` is dropped.  Here a
source whose seqno and epoch were last set longer than ``idle_ms`` ago (by a write, a fencing
session or a handover) is forgotten: its seqno and epoch are deleted, it leaves the
partition's source count (freeing a place under ``max_sources_per_partition``) and its pin is
deleted.  A source that writes again afterwards is a new source: ``last_seqno`` 0.

Safe by construction:

* The decision is taken inside a transaction of the partition (``LogStore.transact``), under
  the write lock every write of the source takes.  A write committed before it set the
  source's time, so the source is kept; a write queued behind it finds a new source.  Chunks
  in flight are never half-admitted by a source that is half forgotten.
* The deletions are state updates of that transaction: they are written in its batch and
  replayed by the store's recovery like any other, so after a crash a source is either still
  there or forgotten with its count, never in between.
* A pin is deleted only when a new pin would name the same partition (the topic has as many
  partitions as when it was made), and put back if the source wrote meanwhile: a live source
  never moves.  Pins of topics that grew since are kept.
* Values written before times were kept (8 bytes) are given the time of the first pass that
  sees them, so an upgrade expires nothing before ``idle_ms`` has passed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from log_store.errors import UnknownTopic
from log_store.interface import LogStore, PartitionState, StateScan, TopicInfo
from session_dedup.pinning import encode_pin, pin_key, stable_partition
from session_dedup.seqno_table import (
    changed_ms,
    decode_seqno,
    encode_source_value,
    epoch_key,
    forget_source,
    present,
    seqno_key,
)

DEFAULT_IDLE_S = 7 * 24 * 3600.0
_PAGE = 1000
_PREFIXES = {"seq/": seqno_key, "epoch/": epoch_key}
_INTERNAL_PREFIX = "logbroker-internal."
"""Topics the gateway keeps for itself (delivery's state): no sources live there."""

log = logging.getLogger(__name__)


@dataclass
class ExpiryPass:
    """What one pass over the store did."""

    expired: int = 0
    """Sources forgotten."""
    stamped: int = 0
    """Sources whose values had no time yet and were given the pass's."""
    pins_deleted: int = 0


class _Forget:
    """The transaction that forgets the idle ones among ``candidates`` (re-checked here)."""

    __slots__ = ("candidates", "forgotten", "idle_ms", "now_ms", "stamped")

    def __init__(self, candidates: Sequence[str], idle_ms: int, now_ms: int) -> None:
        self.candidates = candidates
        self.idle_ms = idle_ms
        self.now_ms = now_ms
        self.forgotten: list[str] = []
        self.stamped = 0

    def __call__(self, state: PartitionState) -> list[bytes]:
        for source_id in self.candidates:
            values = {
                key(source_id): present(state.get(key(source_id))) for key in _PREFIXES.values()
            }
            times = [changed_ms(v) for v in values.values() if v is not None]
            if not times:
                continue  # forgotten already
            if None in times:
                for key, value in values.items():
                    if value is not None and changed_ms(value) is None:
                        state.put(key, encode_source_value(decode_seqno(value), self.now_ms))
                self.stamped += 1
                continue
            if self.now_ms - max(t for t in times if t is not None) >= self.idle_ms:
                forget_source(state, source_id)
                self.forgotten.append(source_id)
        return []


class SourceExpiry:
    """Forgets sources idle for ``idle_s`` in every topic of a store (:meth:`run_once`)."""

    def __init__(self, store: LogStore, idle_s: float = DEFAULT_IDLE_S) -> None:
        if idle_s <= 0:
            raise ValueError("idle_s must be positive")
        self.store = store
        self.idle_ms = int(idle_s * 1000)

    @property
    def supported(self) -> bool:
        """Whether the store can list state keys (the embedded store can; Kafka cannot yet)."""
        return isinstance(self.store, StateScan)

    def run_once(self, now_ms: int | None = None) -> ExpiryPass:
        """One pass over every partition of every topic but the internal ones."""
        result = ExpiryPass()
        if not self.supported:
            return result
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        for info in self.store.list_topics():
            if info.name.startswith(_INTERNAL_PREFIX):
                continue
            for partition in range(info.config.partitions):
                try:
                    self._expire_partition(info, partition, now, result)
                except UnknownTopic:
                    break  # deleted meanwhile: nothing of it to keep
        return result

    def _idle_candidates(self, topic: str, partition: int, now: int) -> list[str]:
        """Sources whose values look idle or have no time, outside any transaction."""
        assert isinstance(self.store, StateScan)
        found: set[str] = set()
        for prefix in _PREFIXES:
            after = ""
            while True:
                page = self.store.scan_state(topic, partition, prefix, after, _PAGE)
                for key, value in page:
                    changed = changed_ms(value) if value else 0
                    if changed is None or now - changed >= self.idle_ms:
                        found.add(key[len(prefix) :])
                if len(page) < _PAGE:
                    break
                after = page[-1][0]
        return sorted(found)

    def _expire_partition(self, info: TopicInfo, partition: int, now: int, out: ExpiryPass) -> None:
        candidates = self._idle_candidates(info.name, partition, now)
        for i in range(0, len(candidates), _PAGE):
            txn = _Forget(candidates[i : i + _PAGE], self.idle_ms, now)
            self.store.transact(info.name, partition, txn)
            out.stamped += txn.stamped
            out.expired += len(txn.forgotten)
            if txn.forgotten:
                out.pins_deleted += self._delete_pins(info, partition, txn.forgotten)

    def _delete_pins(self, info: TopicInfo, partition: int, sources: list[str]) -> int:
        """Delete the pins that a new pin would make again, and put back any whose source
        wrote meanwhile."""
        assert isinstance(self.store, StateScan)
        pin = encode_pin(partition)
        current = self.store.describe_topic(info.name)
        if current.topic_id != info.topic_id:
            return 0
        same = [s for s in sources if stable_partition(s, current.config.partitions) == partition]
        keys = {pin_key(info.topic_id, s): pin for s in same}
        deleted = self.store.delete_topic_state_if(info.name, keys)
        live = [
            s
            for s in same
            if any(
                present(self.store.get_state(info.name, partition, key(s))) is not None
                for key in _PREFIXES.values()
            )
        ]
        if live:
            self.store.put_topic_state_many_if_absent(
                info.name, {pin_key(info.topic_id, s): pin for s in live}
            )
        return deleted - len(live)
