"""The one exception hierarchy of logbroker.

Every error a caller can act on derives from :class:`LogbrokerError`.  The HTTP layer maps
``BadRequest`` to 4xx and ``StoreUnavailable`` to 503; nothing else needs to be known.
"""

from __future__ import annotations

from collections.abc import Collection


class LogbrokerError(Exception):
    """Root of every error raised by logbroker's packages."""


class BadRequest(LogbrokerError):
    """The caller sent something invalid; nothing was changed."""


class NoStore(BadRequest):
    """A command that only reads a store was pointed where there is none."""


class InvalidTopicName(BadRequest):
    """A topic name outside ``[a-z0-9][a-z0-9._-]{0,200}``."""


class UnknownTopic(BadRequest):
    """The topic does not exist (and auto-creation was not asked for)."""


class TopicDeleted(UnknownTopic):
    """The topic was deleted (by this process or another) while the operation was in flight:
    its files went away under it.  Nothing was written; a write made again finds the topic
    gone (or created again) and goes on from there."""


class UnknownPartition(BadRequest):
    """The partition number is outside ``0 .. partitions-1`` of the topic."""


class TopicExists(BadRequest):
    """``create_topic`` of a name that is taken."""


class OffsetOutOfRange(BadRequest):
    """A read below the log start offset or a negative offset.

    Carries the valid range so that a reader can say what it may ask for.
    """

    def __init__(self, message: str, start_offset: int, end_offset: int) -> None:
        super().__init__(message)
        self.start_offset = start_offset
        self.end_offset = end_offset


class LimitReached(BadRequest):
    """A configured limit on what a client may make the gateway hold (topics, partitions,
    sources, subscriptions, ...) is reached; nothing was changed.

    ``limit`` names the limit as configured (``max_topics``, ...); ``maximum`` is its value.
    ``retry_after_s``: set for a limit on what is held only for a while (long-polls waiting),
    which the same request may pass later; sent as ``Retry-After``.
    """

    def __init__(
        self, message: str, limit: str, maximum: int, *, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.maximum = maximum
        self.retry_after_s = retry_after_s


class StoreUnavailable(LogbrokerError):
    """The log cannot take writes now (disk full, read-only, broker gone).

    Nothing was acknowledged; the caller keeps its data and retries later.
    """


class StoreFull(StoreUnavailable):
    """A write did not fit in the space left on the data directory's file system; nothing of
    it was kept.  ``needed_bytes`` is what the write takes on disk, ``free_bytes`` what was
    free, ``total_bytes`` the file system's size: a write larger than that never fits."""

    def __init__(self, message: str, needed_bytes: int, free_bytes: int, total_bytes: int):
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.total_bytes = total_bytes

    @property
    def never_fits(self) -> bool:
        return self.needed_bytes > self.total_bytes


class RecordTooLarge(BadRequest):
    """A transaction holds a record larger than Kafka's topics take (``max.message.bytes``:
    a seqno table's change for very many new sources, or a chunk near the limit).  It fails
    the same way on every retry, so it is refused, not retried (413 ``record_too_large``).
    Nothing of it was committed; the partition's owner stays its owner."""


class PartitionUnavailable(StoreUnavailable):
    """One partition cannot take writes now: no gateway owns it (its owner died and the group
    has not handed it on yet) or its owner cannot be reached.  The store's other partitions
    may well take writes; ``topic`` and ``partition`` name the one that cannot, so that a
    request of many sources can say which of them wait.

    ``keys``: when a call about topic-level state failed so (``get_topic_state_many`` and
    the like, whose keys live in partitions of their own), the keys of the call that live in
    this partition: only they wait for it.  None for any other call."""

    def __init__(
        self,
        message: str,
        topic: str,
        partition: int,
        *,
        keys: Collection[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.keys = None if keys is None else frozenset(keys)

    def holding(self, keys: Collection[str]) -> PartitionUnavailable:
        """The same error, saying that ``keys`` (topic-level state keys) wait for it."""
        return PartitionUnavailable(str(self), self.topic, self.partition, keys=keys)


class PartitionDamaged(PartitionUnavailable):
    """One partition of the embedded store cannot be served from its files: they lost
    acknowledged data (a segment shorter than its index says, or gone), or hold damage that
    recovery must not cut (docs/store.md, "Recovery"), or its index is gone and cannot be
    rebuilt whole.  Waiting does not mend it; an operator does.  The topic's other partitions
    are served: writes to this one are answered 503 naming it, and its reads say it as
    damaged data (:class:`CorruptData`).  Raised without a place by the partition itself
    (``topic`` empty) where it was not told its place."""

    def __init__(self, message: str, topic: str = "", partition: int = -1) -> None:
        super().__init__(message, topic, partition)


class CatalogLost(BadRequest):
    """The data directory holds topics' data that its catalog (``catalog.db``) does not
    know: the catalog was lost or rolled back.  A store opened on it would take every
    acknowledged chunk again under new topics, so it is not opened for writing."""


class ForeignDataDir(BadRequest):
    """The data directory is not this gateway's to use: a store of another DC, of the other
    store kind, of a newer format, or the files of another tool (see
    :mod:`log_store.data_dir_kind`).  Nothing was changed in it."""


class TopicDeletedInFlight(StoreUnavailable):
    """A write's topic was deleted while the write was in flight, and again while it was made
    again.  Nothing was acknowledged; the caller retries, and the retry makes the topic again.
    """


class ReadOnlyStore(BadRequest):
    """A write to a store opened read-only, or a read-only open of a directory with no store."""


class SourceFenced(LogbrokerError):
    """A newer writer owns the partition; this writer must reopen its session."""


class CorruptData(LogbrokerError):
    """Bytes of the log fail their checksum: a read of them is refused, now and on every retry.

    Not :class:`StoreUnavailable`: waiting does not mend a damaged batch; an operator does
    (docs/operations.md, "A batch fails its checksum").  ``offset`` is the first offset of the
    damaged batch; a read that starts below it gets the records before it first.
    """

    def __init__(
        self,
        message: str,
        offset: int,
        start_offset: int,
        end_offset: int,
        topic: str = "",
        partition: int = -1,
    ) -> None:
        super().__init__(message)
        self.offset = offset
        self.start_offset = start_offset
        self.end_offset = end_offset
        self.topic = topic
        self.partition = partition

    def located(self, topic: str, partition: int) -> CorruptData:
        """The same error naming the topic and partition it was found in."""
        return CorruptData(
            f"{topic}/{partition} offset {self.offset}: {self}",
            self.offset,
            self.start_offset,
            self.end_offset,
            topic,
            partition,
        )
