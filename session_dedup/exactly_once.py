"""The exactly-once write: route a source to its pinned partition, drop seqnos already written.

The dedup check and the append are one transaction of the partition (``LogStore.submit``): the
function reads the source's last seqno from the partition's state area, keeps the chunks above
it, encodes their envelopes and records the new last seqno; the store commits records and state
together and resolves the future only after the fsync.  Appends submitted while a commit is in
flight share one fsync (group commit), so a request with chunks of many sources, or many
requests at once, cost about one fsync per commit, not one per chunk.

Several worker processes and several gateways may serve one source at once: the partition's
write lock serializes their transactions, so exactly one of two racing writers of a seqno
writes it and the other is told ``duplicate``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

from log_store.errors import (
    LimitReached,
    PartitionUnavailable,
    StoreUnavailable,
    TopicDeletedInFlight,
    UnknownPartition,
    UnknownTopic,
)
from log_store.interface import (
    TOPIC_ID_KEY,
    AppendResult,
    LateCommitHook,
    LogStore,
    PartitionState,
    PrefetchingState,
    StateScan,
    TopicInfo,
)
from log_store.topic_quota import TopicLimits, TopicQuota
from session_dedup.envelope import EnvelopeWriter
from session_dedup.pinning import (
    decode_count,
    decode_pin,
    encode_pin,
    pin_deletions_key,
    pin_key,
    stable_partition,
)
from session_dedup.seqno_table import (
    SOURCE_COUNT_KEY,
    admit_new_source,
    decode_seqno,
    encode_seqno,
    encode_source_value,
    epoch_key,
    present,
    seqno_key,
)
from session_dedup.source import SourceMeta

TOPIC_REFRESH_S = 5.0
_log = logging.getLogger(__name__)
_MAX_CACHED = 1_000_000
_MAX_TOPIC_NAMES = 10_000


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class SourceRoute:
    """Where a source's chunks go: its topic (by identity) and pinned partition.

    ``pin_deletions`` is the topic's count of deleted pins read before the source's pin was
    seen (see :meth:`SourceRouter.confirm_pins`); always 0 on a store that never deletes pins.
    """

    topic: str
    topic_id: str
    partition: int
    pin_deletions: int = 0


@dataclass(frozen=True, slots=True)
class Session:
    """The answer to a session open: where the source writes, where its log ends, its epoch.

    ``refused`` is set when the session asked to fence a source new to a partition that holds
    ``max_sources_per_partition`` sources already: nothing was changed.
    """

    topic: str
    partition: int
    last_seqno: int
    epoch: int = 0
    refused: LimitReached | None = None


@dataclass(slots=True)
class ChunkBatch:
    """Chunks of one source in request order, as parallel sequences (no object per chunk).

    Two optional conditions refuse the whole batch (nothing written): ``epoch`` that is not
    the source's current epoch (:data:`FENCED`), and ``prev_seqno`` above the source's last
    seqno, i.e. an earlier batch of the writer is not in the log yet (:data:`OUT_OF_ORDER`).
    """

    seqnos: list[int]
    create_times: list[int]
    datas: list[bytes | memoryview]
    epoch: int | None = None
    prev_seqno: int | None = None
    lines: list[int] | None = None
    """Each chunk's line count, when the write path decompressed a compressed batch to check
    it: the audit counts these, here and at a partition's owner, with no decompression of
    its own."""

    def __len__(self) -> int:
        return len(self.seqnos)


DUPLICATE = 0
WRITTEN = 1
FENCED = 2
OUT_OF_ORDER = 3
REFUSED = 4
CHUNK_STATUSES = ("duplicate", "written", "fenced", "out_of_order", "refused")
"""The name of each per-chunk outcome code, indexed by the code.

How each is decided, for the chunks of one source in one request (docs/protocol.md says the
same to clients), with ``last`` the source's last seqno when its section is decided:

* :data:`FENCED`: the section names an ``epoch`` that is not the source's current one.
* :data:`OUT_OF_ORDER` for the whole section: its ``prev_seqno`` is above ``last``: what the
  client says precedes the section is not in the log (a gap, or a request that overtook its
  predecessor).  Nothing is written; ``last_seqno`` in the answer is where the log ends.
* :data:`OUT_OF_ORDER` for one chunk: its seqno is not above every seqno before it in the same
  section.  It was not written, and cannot be now without breaking the source's order.
* :data:`DUPLICATE`: otherwise, a seqno at or below ``last``: the log already holds the source
  up to there.  With ``prev_seqno`` on every section a client sends, this proves the chunk
  itself is in the log; without it, a chunk that was reordered behind a later one across
  requests is indistinguishable from a resend.
* :data:`WRITTEN`: otherwise; ``last`` becomes its seqno.
* :data:`REFUSED` for the whole section: the source is new to a partition that holds
  ``max_sources_per_partition`` sources (``WriteOutcome.refused`` says so).
"""

DEFAULT_MAX_SOURCES_PER_PARTITION = 1_000_000


@dataclass(slots=True)
class WriteOutcome:
    """What one source's write did: a code per chunk (:data:`WRITTEN`, ...), and offsets.

    ``first_offset`` is the offset of the first written chunk; written chunks have consecutive
    offsets in request order.  ``last_seqno`` is the source's last seqno after the write and
    ``epoch`` its current writer epoch (0 if never fenced).  ``refused`` is set when the whole
    section was refused by a limit (every chunk :data:`REFUSED`).
    """

    route: SourceRoute
    written: bytearray
    first_offset: int
    last_seqno: int
    epoch: int = 0
    refused: LimitReached | None = None
    new_source: bool = False
    """The write gave the source its first state in the partition (see :meth:`SourceRouter.
    confirm_pins`)."""
    counted_elsewhere: bool = False
    """Committed by another process (the partition's owner gateway), whose audit counted it
    (see :func:`~log_store.interface.late_commit_hook`)."""

    @property
    def written_count(self) -> int:
        return self.written.count(1)


class PinsUnavailable(PartitionUnavailable):
    """The partition that holds the pins of sources being routed (their first write here:
    no pin cached) has no reachable owner.  ``source_ids`` are those of them that wait for
    it; the others could be routed (on Kafka a topic's pins are spread over its partitions)."""

    def __init__(self, cause: PartitionUnavailable, source_ids: Sequence[str]) -> None:
        super().__init__(str(cause), cause.topic, cause.partition, keys=cause.keys)
        self.source_ids = tuple(source_ids)


def _source_limit(maximum: int) -> LimitReached:
    return LimitReached(
        f"the source's partition holds {maximum} sources, its limit; a new source is refused "
        "there until the limit is raised",
        "max_sources_per_partition",
        maximum,
    )


class SourceRouter:
    """Creates topics on first use and resolves each source's pinned partition, with caches.

    Pins are made before the data they route (:meth:`route_many`), so a source's first write
    never lands on a partition its pin does not name.  Only idle source expiry deletes pins
    (on a store that can list state, :class:`~log_store.interface.StateScan`), and it counts
    them in the topic's state (:func:`~session_dedup.pinning.pin_deletions_key`) in the same
    catalog transaction.  Every route remembers that count as it was read before its pin was
    seen, and every pin in the cache of a topic was seen under the same count
    (``_deletions``): a count that moved drops the topic's cached pins.
    """

    def __init__(
        self,
        store: LogStore,
        *,
        partitions: int,
        refresh_s: float = TOPIC_REFRESH_S,
        quota: TopicQuota | None = None,
    ) -> None:
        self._store = store
        self._quota = quota or TopicQuota(store, TopicLimits())
        self._partitions = partitions
        self._refresh_s = refresh_s
        self._topics: dict[str, tuple[TopicInfo, float]] = {}
        self._pins: dict[str, dict[str, SourceRoute]] = {}
        """Per topic id, the cached route of each pinned source."""
        self._cached_pins = 0
        self._deletions: dict[str, int] = {}
        """Per topic id, the pin deletion count under which its cached pins were seen."""
        self._pins_deletable = isinstance(store, StateScan)
        self._lock = threading.Lock()

    def _topic_infos(
        self, topics: Sequence[str], creator: str | None
    ) -> list[TopicInfo | LimitReached]:
        """The topics' catalog entries, the missing topics created (counted as ``creator``'s):
        all of them or, over ``max_topics`` or the creator's share, none
        (:meth:`~log_store.topic_quota.TopicQuota.create_all`), each missing topic's entry
        then the :class:`LimitReached` that refused it."""
        now = time.monotonic()
        infos: dict[str, TopicInfo | LimitReached] = {}
        looked_up: dict[str, TopicInfo] = {}
        missing: list[str] = []
        for topic in topics:
            cached = self._topics.get(topic)
            if cached is not None and now - cached[1] < self._refresh_s:
                infos[topic] = cached[0]
                continue
            try:
                # describe, not create: a topic's partition count may have grown elsewhere
                looked_up[topic] = self._store.describe_topic(topic)
            except UnknownTopic:
                missing.append(topic)
        if missing:
            try:
                created = self._quota.create_all(missing, self._partitions, creator)
            except LimitReached as refused:
                infos.update((topic, refused) for topic in missing)
            else:
                looked_up.update(zip(missing, created, strict=True))
        infos.update(looked_up)
        with self._lock:
            for topic, info in looked_up.items():
                cached = self._topics.get(topic)
                if cached is not None and cached[0].topic_id != info.topic_id:
                    self._drop_pins(cached[0].topic_id)
                    self._deletions.pop(cached[0].topic_id, None)
                self._topics[topic] = (info, now)
        return [infos[topic] for topic in topics]

    def _drop_pins(self, topic_id: str) -> None:
        dropped = self._pins.pop(topic_id, None)
        if dropped is not None:
            self._cached_pins -= len(dropped)

    def _pin_deletions(self, topic: str, topic_id: str) -> int:
        """How many pins of the topic were deleted so far (0 on a store that never does)."""
        if not self._pins_deletable:
            return 0
        return decode_count(self._store.get_topic_state(topic, pin_deletions_key(topic_id)))

    def _saw_deletions(self, topic_id: str, count: int) -> bool:
        """Note that pins of ``topic_id`` were seen under deletion count ``count`` (with
        ``self._lock`` held); whether pins seen under it may be cached."""
        cached = self._deletions.get(topic_id)
        if cached is None or count > cached:
            if cached is not None:
                self._drop_pins(topic_id)  # seen before deletions that may have taken them
            self._deletions[topic_id] = count
            return True
        return count == cached

    def cached_route(self, topic: str, source_id: str) -> SourceRoute | None:
        """The route if the topic and the pin are cached (no I/O).

        A pin never changes for a topic identity, so a cached pin stays right however old the
        cached topic is; a topic deleted meanwhile shows as ``UnknownTopic`` at the append.
        """
        cached = self._topics.get(topic)
        if cached is None:
            return None
        pins = self._pins.get(cached[0].topic_id)
        return None if pins is None else pins.get(source_id)

    def route(self, topic: str, source_id: str) -> SourceRoute:
        """The source's route, creating the topic and the pin if they do not exist yet."""
        return self.route_many([(topic, source_id)])[0]

    def route_many(
        self, sources: Sequence[tuple[str, str]], creator: str | None = None
    ) -> list[SourceRoute]:
        """Routes of many ``(topic, source_id)``; new pins of a topic are made in one step.

        A topic created on first use is counted as ``creator``'s (see
        :class:`~log_store.topic_quota.TopicQuota`); :class:`LimitReached` if a topic could
        not be created.  :class:`PinsUnavailable` if a partition holding pins (or the topic's
        own record) has no reachable owner, naming the sources that wait for it."""
        routes = self.route_each(sources, creator)
        for route in routes:
            if isinstance(route, LimitReached):
                raise route
        return cast(list[SourceRoute], routes)

    def route_each(
        self, sources: Sequence[tuple[str, str]], creator: str | None = None
    ) -> list[SourceRoute | LimitReached]:
        """Like :meth:`route_many`, but a source of a topic that could not be created (over
        ``max_topics`` or the creator's share) gets the :class:`LimitReached` in its place:
        the sources of topics that exist are routed all the same."""
        try:
            return self._route_many_checked(sources, creator)
        except PartitionUnavailable as exc:
            raise self._pins_unavailable(exc, sources) from None

    def _route_many_checked(
        self, sources: Sequence[tuple[str, str]], creator: str | None
    ) -> list[SourceRoute | LimitReached]:
        try:
            return self._route_many_once(sources, creator)
        except UnknownTopic:
            # deleted between our look at the catalog and the pin: look again (re-creating it)
            for topic in {t for t, _ in sources}:
                self.forget(topic)
            try:
                return self._route_many_once(sources, creator)
            except UnknownTopic:
                raise _topic_vanished(sources[0][0]) from None

    def _pins_unavailable(
        self, exc: PartitionUnavailable, sources: Sequence[tuple[str, str]]
    ) -> PinsUnavailable:
        """``exc`` naming which of ``sources`` wait for its partition: those whose pin it
        holds, if the store says which keys wait (else, or if the key is one all of them
        need, such as the topic's count of deleted pins: every source of its topic)."""
        asked = list(dict.fromkeys(s for t, s in sources if t == exc.topic))
        cached = self._topics.get(exc.topic)
        if exc.keys is None or cached is None:
            return PinsUnavailable(exc, asked)
        topic_id = cached[0].topic_id
        held = [s for s in asked if pin_key(topic_id, s) in exc.keys]
        return PinsUnavailable(exc, held or asked)

    def _route_many_once(
        self, sources: Sequence[tuple[str, str]], creator: str | None
    ) -> list[SourceRoute | LimitReached]:
        by_topic: dict[str, list[str]] = {}
        for topic, source_id in sources:
            by_topic.setdefault(topic, []).append(source_id)
        found: dict[str, dict[str, SourceRoute]] = {}
        refused: dict[str, LimitReached] = {}
        infos = self._topic_infos(list(by_topic), creator)
        for (topic, source_ids), info in zip(by_topic.items(), infos, strict=True):
            if isinstance(info, LimitReached):
                refused[topic] = info
                continue
            topic_id = info.topic_id
            # read before any pin is seen: a deletion after it moves the count
            deletions = self._pin_deletions(topic, topic_id)
            source_ids = list(dict.fromkeys(source_ids))
            keys = [pin_key(topic_id, s) for s in source_ids]
            # most sources seen after a restart are pinned already: one read settles them
            stored = self._store.get_topic_state_many(topic, keys)
            wanted: dict[str, bytes] = {}
            partitions = info.config.partitions
            for source_id, key in zip(source_ids, keys, strict=True):
                if stored[key] is None:
                    wanted[key] = encode_pin(stable_partition(source_id, partitions))
            if wanted:
                # One step for every pin not found: a pin made meanwhile (by any process)
                # wins over the one offered.
                stored.update(self._store.put_topic_state_many_if_absent(topic, wanted))
            # routes are immutable: one per partition serves every source pinned to it
            routes: dict[bytes, SourceRoute] = {}
            pins: dict[str, SourceRoute] = {}
            for source_id, key in zip(source_ids, keys, strict=True):
                value = stored[key]
                if value is None:  # the store answered without it: the topic went away
                    raise UnknownTopic(f"topic {topic!r} was deleted")
                route = routes.get(value)
                if route is None:
                    route = SourceRoute(topic, topic_id, decode_pin(value), deletions)
                    routes[value] = route
                pins[source_id] = route
            found[topic] = pins
            with self._lock:
                if self._saw_deletions(topic_id, deletions):
                    if self._cached_pins + len(pins) > _MAX_CACHED:
                        self._pins.clear()
                        self._cached_pins = 0
                    cache = self._pins.setdefault(topic_id, {})
                    before = len(cache)
                    cache.update(pins)
                    self._cached_pins += len(cache) - before
        if len(found) == 1 and not refused:
            (pins,) = found.values()
            return [pins[source_id] for _, source_id in sources]
        return [
            refused[topic] if topic in refused else found[topic][source_id]
            for topic, source_id in sources
        ]

    def confirm_pins(self, routes: Sequence[tuple[SourceRoute, str]]) -> None:
        """Make sure each source that just got its first state in a partition is pinned there.

        Idle source expiry deletes the pins of sources it forgets (and of sources that never
        had state), while this process may still route such a source from its cache; its next
        write gives it state again, and this puts its pin back before another process can
        pin it anywhere else.

        A pin seen before the write under the deletion count the topic still has now was in
        place throughout: nothing is written for it.  So a store that never deletes pins, and
        a topic whose pins no expiry deleted since they were seen, cost one read here, or
        none.
        """
        if not self._pins_deletable:
            return
        by_topic: dict[tuple[str, str], list[tuple[SourceRoute, str]]] = {}
        for route, source_id in routes:
            by_topic.setdefault((route.topic, route.topic_id), []).append((route, source_id))
        for (topic, topic_id), items in by_topic.items():
            try:
                now = self._pin_deletions(topic, topic_id)
                moved = [(r, s) for r, s in items if r.pin_deletions != now]
                if moved:
                    self._put_pins_back(topic, moved)
            except UnknownTopic:
                continue  # deleted meanwhile: so is the state the pin would guard
            except PartitionUnavailable as exc:
                raise self._pins_unavailable(exc, [(topic, s) for _r, s in items]) from None
            if moved:
                with self._lock:
                    self._saw_deletions(topic_id, now)

    def _put_pins_back(self, topic: str, routes: list[tuple[SourceRoute, str]]) -> None:
        wanted = {pin_key(r.topic_id, s): encode_pin(r.partition) for r, s in routes}
        won = self._store.put_topic_state_many_if_absent(topic, wanted)
        for key, value in wanted.items():
            if won.get(key) != value:
                _log.warning(
                    "%s: %s was pinned elsewhere while it was given state here", topic, key
                )

    def forget(self, topic: str) -> None:
        """Drop what is cached about ``topic`` (it was deleted, maybe created again)."""
        with self._lock:
            cached = self._topics.pop(topic, None)
            if cached is not None:
                self._drop_pins(cached[0].topic_id)
                self._deletions.pop(cached[0].topic_id, None)


class _SourceCount:
    """The partition's source count as one transaction moves it: read once, written once."""

    __slots__ = ("count", "maximum", "read")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.count = 0
        self.read = False

    def admit(self, state: PartitionState) -> bool:
        """Count one more source (see :func:`admit_new_source`); False if it is over the limit."""
        if not self.read:
            self.count = decode_seqno(state.get(SOURCE_COUNT_KEY))
            self.read = True
        if self.count >= self.maximum:
            return False
        self.count += 1
        return True

    def store(self, state: PartitionState) -> None:
        if self.read:
            state.put(SOURCE_COUNT_KEY, encode_seqno(self.count))


class _SourceChunks:
    """One source's chunks inside a partition's transaction, and what became of them."""

    __slots__ = ("batch", "first_index", "index", "outcome", "seq_key", "source_id", "writer")

    def __init__(
        self,
        index: int,
        writer: EnvelopeWriter,
        source_id: str,
        batch: ChunkBatch,
        outcome: WriteOutcome,
    ) -> None:
        self.index = index  # of the section in its request
        self.writer = writer
        self.source_id = source_id
        self.seq_key = seqno_key(source_id)
        self.batch = batch
        self.outcome = outcome
        self.first_index = 0

    def _refuse(self, code: int, last: int) -> None:
        self.outcome.written = bytearray([code]) * len(self.batch)
        self.outcome.last_seqno = last

    def admit(
        self, state: PartitionState, values: list[bytes], write_time: int, sources: _SourceCount
    ) -> None:
        """Append the envelopes of the chunks above the source's last seqno to ``values``
        (see :data:`CHUNK_STATUSES` for how each chunk is decided).

        A store may run a transaction more than once (on Kafka, a partition owned by another
        gateway: again whenever a value it read turns out stale), so nothing a run decided is
        kept from an earlier run."""
        first_index = self.first_index = len(values)
        outcome = self.outcome
        outcome.new_source = False
        outcome.refused = None
        stored = state.get(self.seq_key) or None
        last = decode_seqno(stored)
        batch = self.batch
        epoch: bytes | None = None
        if batch.epoch is not None or stored is None:
            epoch = state.get(epoch_key(self.source_id)) or None
        if batch.epoch is not None:
            current = decode_seqno(epoch)
            outcome.epoch = current
            if batch.epoch != current:
                return self._refuse(FENCED, last)
        if batch.prev_seqno is not None and last < batch.prev_seqno:
            return self._refuse(OUT_OF_ORDER, last)
        seqnos = batch.seqnos
        if len(seqnos) == 1:  # the usual section of a new source: one chunk
            seqno = seqnos[0]
            if seqno > last:
                values.append(
                    self.writer.encode(seqno, batch.create_times[0], write_time, batch.datas[0])
                )
                written = bytearray(_ONE_WRITTEN)
                last = seqno
            else:
                written = bytearray(_ONE_DUPLICATE)
        else:
            written = self._admit_chunks(values, write_time, last)
            if len(values) > first_index:
                last = seqnos[written.rindex(WRITTEN)]
        if len(values) > first_index:
            if stored is None and epoch is None:
                if not sources.admit(state):
                    del values[first_index:]
                    outcome.refused = _source_limit(sources.maximum)
                    return self._refuse(REFUSED, last=0)
                outcome.new_source = True
            state.put(self.seq_key, encode_source_value(last, write_time))
        outcome.written = written
        outcome.last_seqno = last
        return None

    def _admit_chunks(self, values: list[bytes], write_time: int, last: int) -> bytearray:
        batch = self.batch
        seqnos = batch.seqnos
        create_times = batch.create_times
        datas = batch.datas
        encode = self.writer.encoder(write_time)
        written = bytearray(len(seqnos))
        append = values.append
        highest = 0
        for i, seqno in enumerate(seqnos):
            if seqno <= highest:
                written[i] = OUT_OF_ORDER
                continue
            highest = seqno
            if seqno > last:
                append(encode(seqno, create_times[i], datas[i]))
                written[i] = WRITTEN
                last = seqno
        return written


_STALE_ROUTE = (UnknownTopic, UnknownPartition)
"""What a write or session answered from a cached route meets when the topic was deleted (and
maybe made again, with fewer partitions: the route's partition is not there) since then: the
topic is looked up afresh and the sources routed again, once."""

_ONE_WRITTEN = bytes([1])
_ONE_DUPLICATE = bytes([0])


def _check_topic_identity(state: PartitionState, topic_id: str, topic: str) -> None:
    """``UnknownTopic`` if the partition is no longer the topic ``topic_id``'s: the topic was
    deleted and made again (same name, new id) since its sources were routed, maybe from a
    cache, and the source may be pinned to another partition of the new topic."""
    now = state.get(TOPIC_ID_KEY)
    if now is not None and now != topic_id.encode():
        raise UnknownTopic(f"topic {topic!r} was deleted and made again since it was routed")


class _ChunkTransaction:
    """The dedup-and-append function of the chunks of one or more sources of one partition.

    A request with many sources of one partition is one transaction, not one per source:
    thousands of new sources in one request cost one queue entry and one future, and the
    partition's source count is read and written once.
    """

    __slots__ = ("committed_late", "max_sources", "route", "sources")

    def __init__(
        self,
        route: SourceRoute,
        sources: list[_SourceChunks],
        max_sources: int,
        committed_late: LateCommitHook | None = None,
    ) -> None:
        self.route = route
        """A route of the sources (all of one topic id and partition)."""
        self.sources = sources
        self.max_sources = max_sources
        self.committed_late = committed_late
        """Told the records if a commit reported failed went through (see late_commit_hook)."""

    def committed_elsewhere(self) -> None:
        """The partition's owner in another process committed it (and counted it)."""
        for source in self.sources:
            source.outcome.counted_elsewhere = True

    def record_lines(self) -> list[int] | None:
        """Each record of the last run's result: its line count where the write path
        counted it (a checked compressed chunk, see :attr:`ChunkBatch.lines`), else -1;
        None if no record's count is known (raw chunks are counted in place, cheaply)."""
        known = False
        lines: list[int] = []
        for source in self.sources:
            counted = source.batch.lines
            if counted is not None:
                known = True
            for i, code in enumerate(source.outcome.written):
                if code == WRITTEN:
                    lines.append(-1 if counted is None else counted[i])
        return lines if known else None

    def __call__(self, state: PartitionState) -> Sequence[bytes]:
        _check_topic_identity(state, self.route.topic_id, self.route.topic)
        values: list[bytes] = []
        write_time = now_ms()
        sources = self.sources
        if isinstance(state, PrefetchingState):
            _prefetch_chunk_sources(state, sources)
        count = _SourceCount(self.max_sources)
        for source in sources:
            source.admit(state, values, write_time, count)
        count.store(state)
        return values


def _prefetch_chunk_sources(state: PrefetchingState, sources: list[_SourceChunks]) -> None:
    """Read the state a chunk transaction's sources need in a few statements, not two per
    source: the last seqnos first; then the epochs of the sources new here or writing under
    an epoch condition, and the partition's source count, if there are any."""
    state.prefetch([source.seq_key for source in sources])
    get = state.get
    wanted = [
        epoch_key(source.source_id)
        for source in sources
        if source.batch.epoch is not None or not get(source.seq_key)
    ]
    if wanted:
        wanted.append(SOURCE_COUNT_KEY)
        state.prefetch(wanted)


def _prefetch_session_sources(state: PrefetchingState, source_ids: list[str]) -> None:
    """Read the last seqno and the epoch of every source of a session transaction, and the
    partition's source count, in a few statements."""
    keys = [seqno_key(source_id) for source_id in source_ids]
    keys += [epoch_key(source_id) for source_id in source_ids]
    keys.append(SOURCE_COUNT_KEY)
    state.prefetch(keys)


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """What a session open asks of one source.

    ``fence`` starts a new writer epoch.  ``acked_elsewhere`` = P says that the source's data up
    to seqno P was acknowledged by another installation (a client that failed over): if the
    source's last seqno here is below P, a ``handover`` record with seqno P is written and P
    becomes the last seqno, so the client's next chunk (``prev_seqno`` P) is accepted.
    """

    fence: bool = False
    acked_elsewhere: int | None = None


class _SessionTransaction:
    """Reads (and, to fence or hand over, moves) the state of sources of one partition."""

    __slots__ = (
        "created",
        "epochs",
        "handover_writers",
        "last_seqnos",
        "max_sources",
        "refused",
        "requests",
        "source_ids",
        "topic",
        "topic_id",
    )

    def __init__(
        self,
        topic: str,
        topic_id: str,
        source_ids: list[str],
        requests: list[SessionRequest],
        handover_writers: list[EnvelopeWriter | None],
        max_sources: int,
    ) -> None:
        self.topic = topic
        self.topic_id = topic_id
        self.source_ids = source_ids
        self.requests = requests
        self.handover_writers = handover_writers
        self.max_sources = max_sources
        self.last_seqnos: list[int] = []
        self.epochs: list[int] = []
        self.refused: list[LimitReached | None] = []
        self.created: list[str] = []
        """Sources this transaction gave their first state in the partition."""

    def __call__(self, state: PartitionState) -> Sequence[bytes]:
        _check_topic_identity(state, self.topic_id, self.topic)
        lasts = []
        epochs = []
        refused: list[LimitReached | None] = []
        created: list[str] = []
        values: list[bytes] = []
        now = now_ms()
        if isinstance(state, PrefetchingState):
            _prefetch_session_sources(state, self.source_ids)
        for source_id, request, writer in zip(
            self.source_ids, self.requests, self.handover_writers, strict=True
        ):
            stored_seqno = present(state.get(seqno_key(source_id)))
            stored_epoch = present(state.get(epoch_key(source_id)))
            last = decode_seqno(stored_seqno)
            epoch = decode_seqno(stored_epoch)
            moved_to = request.acked_elsewhere
            hands_over = moved_to is not None and moved_to > last and writer is not None
            # A fence or a handover gives a source state here: a new one counts against the limit.
            new = stored_seqno is None and stored_epoch is None
            refusal = None
            if (
                (request.fence or hands_over)
                and new
                and not admit_new_source(state, self.max_sources)
            ):
                refusal = _source_limit(self.max_sources)
            if refusal is None:
                if new and (request.fence or hands_over):
                    created.append(source_id)
                if request.fence:
                    epoch += 1
                    state.put(epoch_key(source_id), encode_source_value(epoch, now))
                if hands_over and moved_to is not None and writer is not None:
                    values.append(writer.encode(moved_to, now, now, handover_data(last)))
                    state.put(seqno_key(source_id), encode_source_value(moved_to, now))
                    last = moved_to
            lasts.append(last)
            epochs.append(epoch)
            refused.append(refusal)
        self.last_seqnos = lasts
        self.epochs = epochs
        self.refused = refused
        self.created = created
        return values


def handover_data(previous_seqno: int) -> bytes:
    """The data of a ``handover`` record: the seqno the source had here before it."""
    return b'{"previous_seqno":%d}' % previous_seqno


_SubmittedSessions = tuple[list[int], _SessionTransaction, concurrent.futures.Future[AppendResult]]


class ExactlyOnceWriter:
    """Sessions and exactly-once writes of sources into ``<dc>.<log_type>`` topics.

    The ``*_async`` methods suit an event loop (store I/O other than the commit itself runs in
    a thread only when a cache misses); the plain methods block.
    """

    def __init__(
        self,
        store: LogStore,
        *,
        dc: str,
        partitions: int,
        quota: TopicQuota | None = None,
        max_sources_per_partition: int = DEFAULT_MAX_SOURCES_PER_PARTITION,
        committed_late: LateCommitHook | None = None,
    ) -> None:
        """``committed_late(topic, records)`` hears of chunk writes whose caller was told they
        failed, found committed later (see :func:`~log_store.interface.late_commit_hook`):
        their retries are answered ``duplicate``, so only there are they known written."""
        self.store = store
        self.committed_late = committed_late
        self.dc = dc
        self.router = SourceRouter(store, partitions=partitions, quota=quota)
        self.max_sources_per_partition = max_sources_per_partition
        self._writers: dict[SourceMeta, EnvelopeWriter] = {}
        self._topic_names: dict[str, str] = {}

    def topic_for(self, log_type: str) -> str:
        topic = self._topic_names.get(log_type)
        if topic is None:
            topic = f"{self.dc}.{log_type}"
            if len(self._topic_names) < _MAX_TOPIC_NAMES:
                self._topic_names[log_type] = topic
        return topic

    def envelope_writer(self, meta: SourceMeta) -> EnvelopeWriter:
        """The cached envelope writer of a source (its constant fields encoded once)."""
        writer = self._writers.get(meta)
        if writer is None:
            if len(self._writers) >= _MAX_CACHED:
                self._writers.clear()
            writer = EnvelopeWriter(
                source_id=meta.source_id,
                server=meta.server,
                file=meta.file,
                log_type=meta.log_type,
                codec=meta.codec,
                schema_id=meta.schema_id,
            )
            self._writers[meta] = writer
        return writer

    # -- the pieces both the blocking and the async forms use -----------------------------
    def _submit_chunks(
        self,
        routes: Sequence[SourceRoute],
        sections: Sequence[tuple[SourceMeta, ChunkBatch]],
        indexes: Sequence[int],
        writers: Sequence[EnvelopeWriter],
    ) -> list[tuple[concurrent.futures.Future[AppendResult], list[_SourceChunks]]]:
        """One transaction per partition that ``routes`` touch, submitted at once."""
        # grouped by route object first (one per partition, mostly), then by partition
        by_route: dict[int, tuple[SourceRoute, list[_SourceChunks]]] = {}
        for i, route, (meta, batch), writer in zip(indexes, routes, sections, writers, strict=True):
            outcome = WriteOutcome(route, bytearray(), 0, 0)
            chunks = _SourceChunks(i, writer, meta.source_id, batch, outcome)
            group = by_route.get(id(route))
            if group is None:
                group = by_route[id(route)] = (route, [])
            group[1].append(chunks)
        # by partition and topic id: routes cached under a topic since deleted and made again
        # are a transaction of their own (refused), not mixed with the new topic's
        by_partition: dict[tuple[str, str, int], tuple[SourceRoute, list[_SourceChunks]]] = {}
        for route, chunks_of_route in by_route.values():
            key = (route.topic, route.topic_id, route.partition)
            if key in by_partition:  # several route objects of one partition: request order
                first, so_far = by_partition[key]
                by_partition[key] = (
                    first,
                    sorted(so_far + chunks_of_route, key=lambda c: c.index),
                )
            else:
                by_partition[key] = (route, chunks_of_route)
        groups = list(by_partition.values())
        maximum = self.max_sources_per_partition
        futures = _submit_all(
            self.store,
            [
                (r.topic, r.partition, _ChunkTransaction(r, sources, maximum, self.committed_late))
                for r, sources in groups
            ],
        )
        return [(future, sources) for future, (_, sources) in zip(futures, groups, strict=True)]

    def _route(self, meta: SourceMeta) -> SourceRoute:
        topic = self.topic_for(meta.log_type)
        return self.router.cached_route(topic, meta.source_id) or self.router.route(
            topic, meta.source_id
        )

    async def _routes_async(
        self, metas: Sequence[SourceMeta], creator: str | None = None
    ) -> list[SourceRoute | LimitReached]:
        """Routes of many sources; the cache misses are resolved together in one thread (a
        topic created on first use counted as ``creator``'s; a source of a topic that could
        not be created gets the :class:`LimitReached` that refused it)."""
        cached_route = self.router.cached_route
        topic_for = self.topic_for
        routes: list[SourceRoute | LimitReached | None] = [
            cached_route(topic_for(m.log_type), m.source_id) for m in metas
        ]
        missing = [i for i, r in enumerate(routes) if r is None]
        if missing:
            wanted = [(topic_for(metas[i].log_type), metas[i].source_id) for i in missing]
            found = await asyncio.to_thread(self.router.route_each, wanted, creator)
            for i, route in zip(missing, found, strict=True):
                routes[i] = route
        return [r for r in routes if r is not None]

    # -- writes ---------------------------------------------------------------------------
    def write(self, meta: SourceMeta, batch: ChunkBatch) -> WriteOutcome:
        """Write one source's chunks exactly once; returns after the fsync."""
        for attempt in range(2):
            route = self._route(meta)
            try:
                ((future, (chunks,)),) = self._submit_chunks(
                    [route], [(meta, batch)], [0], [self.envelope_writer(meta)]
                )
                result = future.result()
            except _STALE_ROUTE:
                self.router.forget(route.topic)
                if attempt:
                    raise _topic_vanished(route.topic) from None
                continue
            chunks.outcome.first_offset = result.first_offset + chunks.first_index
            if chunks.outcome.new_source:
                self.router.confirm_pins([(route, meta.source_id)])
            return chunks.outcome
        raise AssertionError("unreachable")

    async def write_many_async(
        self, sections: Sequence[tuple[SourceMeta, ChunkBatch]]
    ) -> list[WriteOutcome]:
        """Write the chunks of several sources; all are submitted before any is awaited.

        Returns one outcome per section in order, each only after its fsync.  If any section
        fails, the error is raised after every section has finished (written or not).
        """
        results = await self.write_each_async(sections)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]  # no exception among them

    async def write_each_async(
        self, sections: Sequence[tuple[SourceMeta, ChunkBatch]], creator: str | None = None
    ) -> list[WriteOutcome | BaseException]:
        """Like :meth:`write_many_async`, but a failed section's error takes its place in the
        list, so a caller knows what the others wrote.  A topic created on first use is
        counted as ``creator``'s (``None``: against ``max_topics`` only); a section of a new
        topic refused by those limits gets the :class:`LimitReached`, and nothing of it is
        written, while the sections of topics that exist are."""
        done: dict[int, WriteOutcome | BaseException] = {}
        todo = list(range(len(sections)))
        for attempt in range(2):
            metas = [sections[i][0] for i in todo]
            routing = asyncio.ensure_future(self._routes_async(metas, creator))
            try:
                # the cache misses are looked up in a thread (in SQLite, mostly without the
                # GIL): meanwhile the envelope writers are made here
                await asyncio.sleep(0)
                writers = [self.envelope_writer(meta) for meta in metas]
            except BaseException:
                routing.cancel()
                raise
            routed = await routing
            kept = [k for k, r in enumerate(routed) if not isinstance(r, LimitReached)]
            for k, route in enumerate(routed):
                if isinstance(route, LimitReached):
                    done[todo[k]] = route
            submitted = self._submit_chunks(
                [cast(SourceRoute, routed[k]) for k in kept],
                [sections[todo[k]] for k in kept],
                [todo[k] for k in kept],
                [writers[k] for k in kept],
            )
            results = await asyncio.gather(
                *(asyncio.wrap_future(f) for f, _ in submitted), return_exceptions=True
            )
            retry: list[int] = []
            for (_, sources), result in zip(submitted, results, strict=True):
                if isinstance(result, _STALE_ROUTE):
                    # the topic was deleted (and maybe created again) since we cached it
                    topic = sources[0].outcome.route.topic
                    self.router.forget(topic)
                    if attempt:
                        done.update((source.index, _topic_vanished(topic)) for source in sources)
                    else:
                        retry.extend(source.index for source in sources)
                    continue
                if isinstance(result, BaseException):
                    done.update((source.index, result) for source in sources)
                    continue
                for source in sources:
                    source.outcome.first_offset = result.first_offset + source.first_index
                    done[source.index] = source.outcome
            todo = sorted(retry)
            if not todo:
                break
        created = [
            (outcome.route, sections[i][0].source_id)
            for i, outcome in done.items()
            if isinstance(outcome, WriteOutcome) and outcome.new_source
        ]
        if created:
            await asyncio.to_thread(self.router.confirm_pins, created)
        return [done[i] for i in range(len(sections))]

    # -- sessions -------------------------------------------------------------------------
    def _handover_writer(self, meta: SourceMeta) -> EnvelopeWriter:
        return EnvelopeWriter(
            source_id=meta.source_id,
            server=meta.server,
            file=meta.file,
            log_type=meta.log_type,
            codec="raw",
            kind="handover",
        )

    def _submit_sessions(
        self,
        metas: Sequence[SourceMeta],
        routes: Sequence[SourceRoute],
        requests: Sequence[SessionRequest],
    ) -> list[_SubmittedSessions]:
        groups: dict[tuple[str, str, int], list[int]] = {}
        for i, route in enumerate(routes):
            groups.setdefault((route.topic, route.topic_id, route.partition), []).append(i)
        submitted = []
        for (topic, topic_id, partition), indexes in groups.items():
            txn = _SessionTransaction(
                topic,
                topic_id,
                [metas[i].source_id for i in indexes],
                [requests[i] for i in indexes],
                [
                    None if requests[i].acked_elsewhere is None else self._handover_writer(metas[i])
                    for i in indexes
                ],
                self.max_sources_per_partition,
            )
            submitted.append((indexes, txn, _submit(self.store, topic, partition, txn)))
        return submitted

    @staticmethod
    def _sessions(
        routes: Sequence[SourceRoute],
        submitted: list[_SubmittedSessions],
    ) -> list[Session]:
        sessions: list[Session | None] = [None] * len(routes)
        for indexes, txn, _ in submitted:
            for i, last, epoch, refused in zip(
                indexes, txn.last_seqnos, txn.epochs, txn.refused, strict=True
            ):
                sessions[i] = Session(routes[i].topic, routes[i].partition, last, epoch, refused)
        return [s for s in sessions if s is not None]

    @staticmethod
    def _created(
        routes: Sequence[SourceRoute], submitted: list[_SubmittedSessions]
    ) -> list[tuple[SourceRoute, str]]:
        return [
            (routes[indexes[0]], source_id)
            for indexes, txn, _ in submitted
            for source_id in txn.created
        ]

    def _forget_routes(self, routes: Sequence[SourceRoute]) -> None:
        for topic in {r.topic for r in routes}:
            self.router.forget(topic)

    def open_sessions(
        self, metas: Sequence[SourceMeta], requests: Sequence[SessionRequest] | None = None
    ) -> list[Session]:
        """Sessions of several sources: topic, pinned partition, last written seqno, epoch.

        A source whose request fences gets a new epoch: writes naming an older one are refused
        from then on (:data:`FENCED`).  One whose request says ``acked_elsewhere`` is moved to
        that seqno by a ``handover`` record (see :class:`SessionRequest`).

        One state transaction per partition touched.  The last seqnos are read under the
        partition's write lock, so a session never answers from a topic deleted meanwhile.
        """
        for attempt in range(2):
            routes = [self._route(meta) for meta in metas]
            submitted = self._submit_sessions(
                metas, routes, requests or [SessionRequest()] * len(metas)
            )
            try:
                for _, _, future in submitted:
                    future.result()
            except _STALE_ROUTE:
                self._forget_routes(routes)
                if attempt:
                    raise _topic_vanished(routes[0].topic) from None
                continue
            created = self._created(routes, submitted)
            if created:
                self.router.confirm_pins(created)
            return self._sessions(routes, submitted)
        raise AssertionError("unreachable")

    async def open_sessions_async(
        self,
        metas: Sequence[SourceMeta],
        requests: Sequence[SessionRequest] | None = None,
        creator: str | None = None,
    ) -> list[Session]:
        """Like :meth:`open_sessions`, for an event loop; a topic created on first use is
        counted as ``creator``'s.  The session of a source of a new topic that ``max_topics``
        or the creator's share refused is refused (``Session.refused``), the others opened."""
        asked = requests or [SessionRequest()] * len(metas)
        for attempt in range(2):
            routed = await self._routes_async(metas, creator)
            kept = [i for i, r in enumerate(routed) if not isinstance(r, LimitReached)]
            routes = [cast(SourceRoute, routed[i]) for i in kept]
            submitted = self._submit_sessions(
                [metas[i] for i in kept], routes, [asked[i] for i in kept]
            )
            results = await asyncio.gather(
                *(asyncio.wrap_future(f) for _, _, f in submitted), return_exceptions=True
            )
            if any(isinstance(r, _STALE_ROUTE) for r in results):
                self._forget_routes(routes)
                if attempt:
                    raise _topic_vanished(routes[0].topic)
                continue
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            created = self._created(routes, submitted)
            if created:
                await asyncio.to_thread(self.router.confirm_pins, created)
            opened = iter(self._sessions(routes, submitted))
            return [
                Session(self.topic_for(metas[i].log_type), -1, 0, 0, route)
                if isinstance(route, LimitReached)
                else next(opened)
                for i, route in enumerate(routed)
            ]
        raise AssertionError("unreachable")


def _submit(
    store: LogStore, topic: str, partition: int, fn: Callable[[PartitionState], Sequence[bytes]]
) -> concurrent.futures.Future[AppendResult]:
    """``store.submit``, with an error raised at submission delivered through the future."""
    try:
        return store.submit(topic, partition, fn)
    except Exception as exc:
        failed: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
        failed.set_exception(exc)
        return failed


@runtime_checkable
class _SubmitsMany(Protocol):
    """A store that takes several transactions at once (on Kafka: one request per owner for
    the partitions other gateways own)."""

    def submit_many(
        self, items: Sequence[tuple[str, int, Callable[[PartitionState], Sequence[bytes]]]]
    ) -> list[concurrent.futures.Future[AppendResult]]: ...


def _submit_all(
    store: LogStore,
    items: Sequence[tuple[str, int, Callable[[PartitionState], Sequence[bytes]]]],
) -> list[concurrent.futures.Future[AppendResult]]:
    """``_submit`` of each item, through ``submit_many`` where the store has it."""
    if isinstance(store, _SubmitsMany):
        try:
            return store.submit_many(items)
        except Exception as exc:
            failed: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
            failed.set_exception(exc)
            return [failed] * len(items)
    return [_submit(store, topic, partition, fn) for topic, partition, fn in items]


def _topic_vanished(topic: str) -> StoreUnavailable:
    return TopicDeletedInFlight(
        f"topic {topic!r} was deleted while this write was in flight; nothing was written; "
        "a retry makes the topic again"
    )
