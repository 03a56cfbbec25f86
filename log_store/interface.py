"""The partitioned log, as every backend offers it.

A topic has N partitions; a partition is a sequence of records with increasing offsets starting
at the partition's *log start offset* (which retention moves forward) and ending just below its
*end offset* (the next offset to be written).  Offsets are dense (0, 1, 2, ...) where the
backend says so in :class:`StoreCapabilities`; on Kafka, transaction markers take offsets too,
so a reader always continues from a read's ``next_offset``, never from a count of records.

Each partition also has a small key/value *state area* that a transaction may read and update
atomically with an append: the exactly-once dedup table lives there, so a chunk and the seqno
that admits it commit together.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

DEFAULT_PARTITIONS = 4
DEFAULT_SEGMENT_BYTES = 256 * 1024 * 1024
UNLIMITED = -1
"""A ``retention_ms`` or ``retention_bytes`` given to :meth:`LogStore.alter_topic` that removes
the limit (Kafka's ``retention.ms = -1``); ``None`` there leaves the setting as it is."""


def retention_after(given: int | None, current: int | None) -> int | None:
    """A retention setting after ``alter_topic(given)``: ``None`` keeps ``current``,
    :data:`UNLIMITED` removes the limit (``None``), anything else replaces it."""
    if given is None:
        return current
    return None if given == UNLIMITED else given


@dataclass(frozen=True)
class StoreCapabilities:
    """Where a backend legitimately differs; callers and the contract suite ask, never guess."""

    dense_offsets: bool = True
    """Every offset between the start and the end holds a record.  False on Kafka: each
    transaction's commit marker takes an offset that no reader ever sees."""
    store_retention: bool = True
    """``apply_retention`` drops data by the topics' retention settings.  False: the broker
    applies retention continuously by itself and ``apply_retention`` has nothing to do."""
    segment_files: bool = True
    """Partitions are segment files under ``data_dir``; ``describe_topic`` reports their sizes
    and segment counts.  False: sizes and segment counts are reported as 0."""
    exact_read_identity: bool = True
    """``ReadResult.topic_id`` is the identity of the topic the records were read from.
    False on Kafka: it is what the store's look at the topic (at most a few seconds old)
    said, and a reader that must know asks :meth:`LogStore.current_topic_id` after the read."""


@dataclass(frozen=True)
class Record:
    """One record of a partition, as read back."""

    offset: int
    value: bytes
    timestamp_ms: int


@dataclass(frozen=True)
class AppendResult:
    """Offsets given to one append: ``first_offset .. last_offset`` inclusive.

    An append of nothing (every chunk a duplicate) has ``count == 0`` and
    ``first_offset == last_offset + 1 == end offset``.
    """

    first_offset: int
    last_offset: int

    @property
    def count(self) -> int:
        return self.last_offset - self.first_offset + 1


@dataclass(frozen=True)
class ReadResult:
    """Records from one read plus the partition's bounds at the time of the read."""

    records: list[Record]
    start_offset: int
    end_offset: int
    resume_at: int | None = None
    """Where the next read starts when it is past the last record: the read saw every offset
    below it.  Kafka sets it when a read reached ``end_offset``: the offsets after the last
    record there are transaction markers, which no read ever returns."""
    topic_id: str | None = None
    """The identity of the topic read (see :attr:`StoreCapabilities.exact_read_identity`);
    a topic deleted and made again under its name has another, and its offsets start over."""

    @property
    def next_offset(self) -> int:
        """Where the next read should start."""
        if self.resume_at is not None:
            return self.resume_at
        return self.records[-1].offset + 1 if self.records else self.end_offset


@dataclass(frozen=True)
class TopicConfig:
    """Per-topic settings.  Retention applies per partition and drops whole segments."""

    partitions: int = DEFAULT_PARTITIONS
    retention_ms: int | None = None
    retention_bytes: int | None = None
    segment_bytes: int = DEFAULT_SEGMENT_BYTES


@dataclass(frozen=True)
class PartitionInfo:
    partition: int
    start_offset: int
    end_offset: int
    size_bytes: int | None
    """None where the store does not know it (on Kafka it is the brokers')."""
    segments: int | None
    """Segment files (None on a store that has none of its own, as Kafka)."""
    damaged: str | None = None
    """Why the partition cannot be served, if it cannot: its files are damaged (embedded
    store, :class:`~log_store.errors.PartitionDamaged`).  Its offsets and sizes are then what
    its index says, or 0 and None where the index cannot say; the topic's other partitions
    are described and served as usual."""


@dataclass(frozen=True)
class TopicInfo:
    """A topic's identity and settings; ``partitions`` is filled by ``describe_topic``.

    ``topic_id`` changes when a topic is deleted and created again, so state keyed by it
    (pins, seqnos) is never inherited by a new topic of the same name.
    """

    name: str
    topic_id: str
    config: TopicConfig
    created_ms: int
    partitions: list[PartitionInfo] = field(default_factory=list)

    def settings_json(self) -> dict[str, object]:
        """Its identity and settings as the HTTP API and ``topics --json`` state them
        (``None`` retention: no limit)."""
        return {
            "name": self.name,
            "topic_id": self.topic_id,
            "partitions": self.config.partitions,
            "retention_ms": self.config.retention_ms,
            "retention_bytes": self.config.retention_bytes,
            "segment_bytes": self.config.segment_bytes,
        }


TOPIC_ID_KEY = "topic-id"
"""A state key that reads, in every backend, as the id of the topic the transaction runs in
(UTF-8), the one the partition has now: a writer that routed a source under a topic that was
deleted and made again (same name, new id) sees it changed and writes nothing.  Nothing puts it;
it is not stored."""


class PartitionState(Protocol):
    """The state area of one partition inside a transaction (see ``LogStore.submit``).

    :data:`TOPIC_ID_KEY` reads as the topic's id."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None:
        """Set ``key``; an empty value deletes it.  A deleted key reads as None, or as
        ``b""`` inside the transaction that deleted it on a backend that keeps its own puts
        as given (both backends drop the key when the transaction commits)."""
        ...

    def next_offset(self) -> int:
        """The offset the transaction's first record gets if it returns any."""
        ...


@runtime_checkable
class PrefetchingState(PartitionState, Protocol):
    """A state area that can read many keys in one step before the transaction asks for them.

    Deciding thousands of new sources in one transaction otherwise costs one lookup per key.
    ``prefetch`` is a hint: it changes nothing, and ``get`` answers the same with or without it.
    """

    def prefetch(self, keys: Sequence[str]) -> None: ...


TransactionFn = Callable[[PartitionState], Sequence[bytes]]
"""Reads and updates state, returns the record values to append (possibly none).

It runs inside the partition's write lock, so what it reads cannot change before its records
and state updates commit.  If it raises, neither its records nor its state updates are kept
and the exception is raised to the caller; other transactions committed with it are unaffected.
It must be quick and must not block: it may run in a committer thread shared with others.
"""


LateCommitHook = Callable[[str, Sequence[bytes]], None]
"""``(topic, records)``: see :func:`late_commit_hook`."""


def late_commit_hook(fn: TransactionFn) -> LateCommitHook | None:
    """The hook of an *audited* transaction function, or None: how a store tells it which of
    its commits only the store knows of.

    A transaction function with a ``committed_late`` attribute that is not None is audited:
    its caller counts what the commit wrote when it is answered, and the store promises two
    things, so that every commit is counted once:

    * a commit whose answer was lost (on Kafka: the commit request reached the cluster, its
      answer did not) and that the partition's next takeover finds committed is told to
      ``committed_late(topic, records)``, once, from a store thread: its caller was answered
      failed, and the retry is answered as a duplicate;
    * a commit made by another process (on Kafka: the gateway that owns the partition) is
      counted there, by that process's own hook, and the function is told so by
      ``committed_elsewhere()`` before its caller is answered, so the caller does not count it.

    Stores whose commits are always answered, and made in the caller's process, call neither.
    """
    hook = getattr(fn, "committed_late", None)
    return hook if callable(hook) else None


def known_record_lines(fn: TransactionFn, records: Sequence[bytes]) -> list[int] | None:
    """The line count of each of ``records`` (the result of the last run of ``fn``) as far
    as an audited function knows them (``record_lines()``; -1 for a record it did not
    count), or None.  A store that has another process commit the records gives these to
    that process, whose hook then needs no decompression of its own."""
    counted = getattr(fn, "record_lines", None)
    lines = counted() if callable(counted) else None
    if not isinstance(lines, list) or len(lines) != len(records):
        return None
    return lines


class LogStore(Protocol):
    """The partitioned log.  Thread-safe; several processes may open one store."""

    capabilities: StoreCapabilities

    def readiness(self) -> str | None:
        """None if the store can take writes now, else why not (``GET /readyz``).  Quick: a
        look at the data dir's file system, or one metadata request to Kafka (at most 1 s)."""
        ...

    def installation_id(self) -> str:
        """What tells this installation (one log, however many gateways) from any other, the
        same in every process and after restarts: the embedded store's id, made once in its
        catalog; on Kafka the cluster's id and the namespace (asks Kafka: StoreUnavailable
        when it does not answer).  ``logbroker mirror`` refuses to copy an installation into
        itself by it."""
        ...

    def unavailable_spans(self) -> list[tuple[float, float]]:
        """Recent (start, end) wall-clock spans during which this process could not reach
        the store (Kafka away); empty for a store on local disk.  A consumer group does not
        count them against a member's session (its heartbeats could not be served)."""
        ...

    # -- topics -----------------------------------------------------------------------------
    def create_topic(
        self, name: str, config: TopicConfig | None = None, *, exist_ok: bool = False
    ) -> TopicInfo: ...

    def delete_topic(self, name: str) -> None: ...

    def set_partitions(self, name: str, count: int) -> TopicInfo:
        """Grow a topic to ``count`` partitions (never shrinks)."""
        ...

    def alter_topic(
        self,
        name: str,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        segment_bytes: int | None = None,
    ) -> TopicInfo:
        """Change the settings given (``None``: as they are); :data:`UNLIMITED` as a retention
        removes that limit."""
        ...

    def list_topics(self) -> list[TopicInfo]: ...

    def describe_topic(self, name: str) -> TopicInfo: ...

    def current_topic_id(self, name: str) -> str:
        """The identity of the topic ``name`` now, asked afresh (``UnknownTopic`` if none)."""
        ...

    # -- topic-level state --------------------------------------------------------------------
    def put_topic_state_if_absent(self, topic: str, key: str, value: bytes) -> bytes:
        """Store ``value`` under ``key`` unless a value is there; return the value that won.

        Atomic across threads and processes.  Bound to the topic's identity: deleting the
        topic deletes its state.  Used for sticky source-to-partition pins.
        """
        ...

    def put_topic_state_many_if_absent(
        self, topic: str, items: Mapping[str, bytes]
    ) -> dict[str, bytes]:
        """``put_topic_state_if_absent`` for many keys in one transaction; the winning values."""
        ...

    def get_topic_state(self, topic: str, key: str) -> bytes | None: ...

    def get_topic_state_many(self, topic: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        """``get_topic_state`` of many keys at once (one lookup per place they live)."""
        ...

    # -- writes -------------------------------------------------------------------------------
    def append(self, topic: str, partition: int, values: Sequence[bytes]) -> AppendResult:
        """Append ``values`` atomically and durably (fsync before return)."""
        ...

    def transact(self, topic: str, partition: int, fn: TransactionFn) -> AppendResult:
        """Run ``fn`` under the partition's write lock and append what it returns, durably."""
        ...

    def submit(
        self, topic: str, partition: int, fn: TransactionFn
    ) -> concurrent.futures.Future[AppendResult]:
        """Like ``transact`` but returns at once; the future resolves after the fsync.

        Transactions submitted while a commit is in flight are committed together (group
        commit): one fsync for all of them, each acknowledged only after it.
        """
        ...

    # -- reads --------------------------------------------------------------------------------
    def read(
        self, topic: str, partition: int, offset: int, max_bytes: int = 1024 * 1024
    ) -> ReadResult:
        """Records from ``offset`` on, at most about ``max_bytes`` of values (at least one).

        Reading at or past the end returns no records and the end offset.  Reading below the
        log start offset raises ``OffsetOutOfRange`` with the valid range.
        """
        ...

    def reads_of(self, partitions: Sequence[tuple[str, int]]) -> AbstractContextManager[None]:
        """A context in which this thread reads (``read``), follows (``follow_appends``) or
        asks the end of (``end_offset``) each of ``partitions`` about once, as a fetch of many
        does: the store may look their bounds up together when the context begins, and each
        partition's first such call in it answers from that look (a later one asks afresh).
        What the calls answer is what they would have answered at the context's start.  A
        store whose look at a partition costs no request does nothing."""
        ...

    def get_state(self, topic: str, partition: int, key: str) -> bytes | None: ...

    def end_offset(self, topic: str, partition: int) -> int: ...

    def wait_for_data(self, topic: str, partition: int, offset: int, timeout_s: float) -> bool:
        """Block until the partition's end offset is above ``offset`` or the timeout passes.

        Woken by appends of this process and of other processes; no busy polling.
        """
        ...

    def follow_appends(
        self, topic: str, partition: int, on_append: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_append`` soon after each append to the partition, by this process or
        another, until the function returned is called; raises ``UnknownTopic`` /
        ``UnknownPartition`` as a read would.

        ``on_append`` is called in whatever thread saw the append (the one that committed it,
        or one the store keeps for all its followers): it must be quick and must not raise.
        It may be called after other changes too (retention, the partition made), and once
        for several appends.  Following holds no thread of its own and no open partition:
        long-polls of many partitions wait on it (see ``delivery.append_watch``).
        """
        ...

    # -- retention ----------------------------------------------------------------------------
    def apply_retention(self, now_ms: int | None = None) -> dict[tuple[str, int], int]:
        """Drop whole segments past each topic's retention; return the new start offsets."""
        ...

    def delete_segments_before(self, topic: str, partition: int, offset: int) -> int:
        """Operator's forced deletion: drop every whole segment that lies below ``offset``.

        The active segment is never dropped.  Returns the new log start offset.
        """
        ...

    def close(self) -> None: ...


@runtime_checkable
class StateScan(Protocol):
    """What a backend offers to find and drop state nobody uses any more (idle sources'
    seqnos and pins, see ``session_dedup.source_expiry``).  The embedded store has it."""

    def scan_state(
        self, topic: str, partition: int, prefix: str, after: str = "", limit: int = 1000
    ) -> list[tuple[str, bytes]]:
        """Up to ``limit`` state keys (and values) of a partition that start with ``prefix``
        and sort after ``after``, in key order (a page; the next page starts after the last)."""
        ...

    def scan_topic_state(
        self, topic: str, prefix: str, after: str = "", limit: int = 1000
    ) -> list[tuple[str, bytes]]:
        """``scan_state`` of the topic-level state (pins)."""
        ...

    def delete_topic_state_if(
        self, topic: str, items: Mapping[str, bytes], *, deletions_key: str | None = None
    ) -> int:
        """Delete each topic-state key whose value is the one given; how many were.

        With ``deletions_key``, the count under that key (8 bytes, big-endian, absent = 0) is
        raised by the number deleted in the same transaction: a reader that saw the count
        unchanged since before it read some keys knows that none of them was deleted since.
        """
        ...


@runtime_checkable
class BatchCheck(Protocol):
    """What a backend with segment files of its own offers the audit.  Kafka checks its
    batches' CRCs itself (on every fetch, and ``kafka-dump-log --deep-iteration``)."""

    def check_batches(self, topic: str, partition: int) -> list[str]:
        """Problems found checking every batch of the partition against its checksum, those
        that carry only state (which no read reads) included; [] when all are good."""
        ...


@runtime_checkable
class DamageReport(Protocol):
    """What a backend with files of its own says of partitions it found damaged
    (:class:`~log_store.errors.PartitionDamaged`); ``/readyz`` names them."""

    def damaged_partitions(self) -> dict[tuple[str, int], str]:
        """The partitions this process found damaged, each with why, until it opens whole."""
        ...
