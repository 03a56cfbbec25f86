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
* A pin is deleted only when its source has no state and a new pin would name the same
  partition (the topic has as many partitions as when it was made); pins of topics that grew
  since are kept.  A process that still routes the source from its cache and gives it state
  again puts the pin back (``SourceRouter.confirm_pins``), so a live source never moves.
  Besides the pins of the sources it forgets, each pass looks at up to ``_PIN_PAGE`` pins of
  every topic (continuing where the last pass stopped) and deletes those of sources without
  state: sessions of sources never written, sections refused by ``max_sources_per_partition``,
  a crash between a source's expiry and its pin's deletion.
* Values written before times were kept (8 bytes) are given the time of the first pass that
  sees them, so an upgrade expires nothing before ``idle_ms`` has passed.

On a store whose partitions are written by several processes, each the owner of some (the
Kafka backend, :class:`PartitionOwners`), every process looks only at the partitions it owns
and at the pins kept in them: the decision is its owner's, in the partition's Kafka
transaction, and a stale owner (fenced by a new one) commits nothing; its transaction is
run again by the new owner against the table as the new owner has it.  The deletions are
changelog entries of that transaction, so a takeover rebuilds the table without them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from log_store.errors import PartitionDamaged, UnknownTopic
from log_store.interface import LogStore, PartitionState, StateScan, TopicInfo
from session_dedup.pinning import (
    decode_pin,
    encode_pin,
    pin_deletions_key,
    pin_key,
    stable_partition,
)
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
_PIN_PAGE = 10_000
_PREFIXES = {"seq/": seqno_key, "epoch/": epoch_key}
_INTERNAL_PREFIX = "logbroker-internal."
"""Topics the gateway keeps for itself (delivery's state): no sources live there."""

log = logging.getLogger(__name__)


@runtime_checkable
class PartitionOwners(Protocol):
    """A store shared by processes that each own (write) some of its partitions."""

    def owns_partition(self, topic: str, partition: int) -> bool:
        """True if this process is the partition's writer: it expires the partition's sources
        and sweeps the pins kept there (``scan_topic_state`` lists those only)."""
        ...


@runtime_checkable
class ManyStateReads(Protocol):
    """A store that reads many state keys of a partition in one step (one owner's read)."""

    def get_state_many(
        self, topic: str, partition: int, keys: Sequence[str]
    ) -> dict[str, bytes | None]: ...


@dataclass
class ExpiryPass:
    """What one pass over the store did."""

    expired: int = 0
    """Sources forgotten."""
    stamped: int = 0
    """Sources whose values had no time yet and were given the pass's."""
    pins_deleted: int = 0
    """Pins deleted: of the sources forgotten, and of sources that had no state."""
    damaged: list[tuple[str, int]] = field(default_factory=list)
    """Partitions left out because they are damaged (:class:`PartitionDamaged`): their
    sources and the topic's pins are kept as they are for the operator."""


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
        # It may run more than once: again at a new owner after a fenced commit, or after a
        # forwarded run met a conflict.  Only the run that commits is what happened.
        self.forgotten = []
        self.stamped = 0
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
        self._pin_cursors: dict[str, str] = {}
        """Per topic id, the last pin key looked at (a pass looks at ``_PIN_PAGE`` of them)."""

    @property
    def supported(self) -> bool:
        """Whether the store can list state keys (both backends can)."""
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
            try:
                damaged = len(result.damaged)
                for partition in range(info.config.partitions):
                    if self._owns(info.name, partition):
                        self._expire_damaged_aside(info, partition, now, result)
                if len(result.damaged) == damaged:
                    self._sweep_pins(info, result)
            except UnknownTopic:
                continue  # deleted meanwhile: nothing of it to keep
            except PartitionDamaged as exc:
                # a pin of a damaged partition was looked at: the topic's pins wait
                log.warning("source expiry: pins of %s not swept: %s", info.name, exc)
        return result

    def _expire_damaged_aside(
        self, info: TopicInfo, partition: int, now: int, out: ExpiryPass
    ) -> None:
        """Expire the partition's idle sources; a damaged partition is left out (as
        retention leaves it), and the pass goes on with the others."""
        try:
            self._expire_partition(info, partition, now, out)
        except PartitionDamaged as exc:
            out.damaged.append((info.name, partition))
            log.warning("source expiry: %s/%d left out: %s", info.name, partition, exc)

    def _owns(self, topic: str, partition: int) -> bool:
        store = self.store
        return not isinstance(store, PartitionOwners) or store.owns_partition(topic, partition)

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
                forgotten = dict.fromkeys(txn.forgotten, partition)
                out.pins_deleted += self._delete_stateless_pins(info, forgotten)

    def _sweep_pins(self, info: TopicInfo, out: ExpiryPass) -> None:
        """Look at the next ``_PIN_PAGE`` pins of the topic; delete those whose source has
        no state (sessions of sources never written, sections refused by a limit, pins left
        by a crash between a source's expiry and its pin's deletion)."""
        assert isinstance(self.store, StateScan)
        prefix = pin_key(info.topic_id, "")
        after = self._pin_cursors.get(info.topic_id, "")
        page = self.store.scan_topic_state(info.name, prefix, after, _PIN_PAGE)
        if len(page) == _PIN_PAGE:
            self._pin_cursors[info.topic_id] = page[-1][0]
        else:
            self._pin_cursors.pop(info.topic_id, None)
        pins: dict[str, int] = {}
        for key, value in page:
            with contextlib.suppress(ValueError):
                pins[key[len(prefix) :]] = decode_pin(value)
        if pins:
            out.pins_deleted += self._delete_stateless_pins(info, pins)

    def _with_state(self, topic: str, pins: dict[str, int]) -> set[str]:
        """Those of the pinned sources that have state in their partition (one read a
        partition where the store can)."""
        by_partition: dict[int, list[str]] = {}
        for source_id, partition in pins.items():
            by_partition.setdefault(partition, []).append(source_id)
        live: set[str] = set()
        for partition, sources in by_partition.items():
            keys = [key(s) for s in sources for key in _PREFIXES.values()]
            if isinstance(self.store, ManyStateReads):
                values = self.store.get_state_many(topic, partition, keys)
            else:
                values = {k: self.store.get_state(topic, partition, k) for k in keys}
            live.update(
                s
                for s in sources
                if any(present(values[key(s)]) is not None for key in _PREFIXES.values())
            )
        return live

    def _delete_stateless_pins(self, info: TopicInfo, pins: dict[str, int]) -> int:
        """Delete the pins of sources without state that a new pin would make again (the
        topic has as many partitions as when they were made); put back any whose source got
        state meanwhile.  How many stay deleted."""
        assert isinstance(self.store, StateScan)
        current = self.store.describe_topic(info.name)
        if current.topic_id != info.topic_id:
            return 0
        count = current.config.partitions
        stable = {s: p for s, p in pins.items() if stable_partition(s, count) == p}
        with_state = self._with_state(info.name, stable)
        doomed = {s: p for s, p in stable.items() if s not in with_state}
        if not doomed:
            return 0
        deleted = self.store.delete_topic_state_if(
            info.name,
            {pin_key(info.topic_id, s): encode_pin(p) for s, p in doomed.items()},
            deletions_key=pin_deletions_key(info.topic_id),
        )
        # A write that gave the source state meanwhile puts its pin back itself
        # (SourceRouter.confirm_pins); this covers one that did so before the deletion (or,
        # on Kafka, before the deletion count was raised, just after the deletions).
        live = {s: doomed[s] for s in self._with_state(info.name, doomed)}
        if live:
            self.store.put_topic_state_many_if_absent(
                info.name, {pin_key(info.topic_id, s): encode_pin(p) for s, p in live.items()}
            )
        return deleted - len(live)
