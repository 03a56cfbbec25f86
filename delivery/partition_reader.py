"""One pull of one partition: records from an offset, filtered where the data is.

A reader's position is a plain offset.  Every batch says where the next read starts
(``next_offset``), also when the filter dropped everything that was scanned, so a filtered
reader moves on instead of rescanning (Databus answers such pulls with the scanned window's
end marker for the same reason).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from delivery.envelope_view import EnvelopeView, NotAnEnvelope, kind_of, view
from delivery.filters import MessageFilter
from delivery.legacy_txn import DEFAULT_WINDOW_MS, CommitResolver, marker_target
from log_store.errors import (
    BadRequest,
    CorruptData,
    OffsetOutOfRange,
    UnknownPartition,
    UnknownTopic,
)
from log_store.interface import LogStore

MAX_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_BYTES = 1024 * 1024
MAX_NOT_ENVELOPES = 256
"""How many records that are not envelopes one batch names: a read stops after the last one
it names (its ``next_offset`` just past it), so a partition full of another producer's small
records gives answers of bounded size (and a binary section's header, at most 64 KiB, room)."""
# How much a filtered read may scan before it answers with nothing but a new position.
_SCAN_FACTOR = 8
_MIN_SCAN_BYTES = 8 * 1024 * 1024
RESOLVE_BUDGET_S = 2.0
"""How long one read may spend reading legacy transactions' data records that it did not
scan itself (each a seek and a fetch on Kafka): past it, the read answers with what it
resolved, its ``next_offset`` at the first marker left, rather than outlast its reader's
timeout (a pull client's is 30 s, for a fetch of several partitions)."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DeliveredMessage:
    """One message as a reader gets it.

    ``value`` is the stored envelope (for a released legacy transaction: its data record's).
    ``view`` is the parsed envelope when the reader already parsed it (None on the fast path
    of an unfiltered read, and for raw reads of records that are not envelopes).
    ``data_offset`` is set for a legacy transaction: where its data lies, while ``offset`` is
    its commit marker's, the position at which it is delivered.
    """

    offset: int
    value: bytes
    view: EnvelopeView | None
    data_offset: int | None = None


@dataclass(frozen=True, slots=True)
class NotEnvelope:
    """A record a read left out because it is not an envelope at all (e.g. another producer
    wrote it into a Kafka topic): its offset and why it does not parse."""

    offset: int
    reason: str


@dataclass
class PartitionBatch:
    """One partition's answer.  ``not_envelopes`` names the records between the read's offset
    and ``next_offset`` that were left out because they are not envelopes: a reader that
    moves to ``next_offset`` moves past them, and should say so."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    next_offset: int
    messages: list[DeliveredMessage] = field(default_factory=list)
    value_bytes: int = 0
    not_envelopes: list[NotEnvelope] = field(default_factory=list)
    corrupt: CorruptData | None = None
    """Set (with no messages, ``next_offset`` where the read was) when the read starts at a
    batch that fails its checksum: every read from there fails the same way."""
    gone: UnknownTopic | UnknownPartition | None = None
    """Set (with no messages, every offset where the read was) when the partition is not there
    (its topic was deleted, or made again with fewer partitions) in a fetch that reads others:
    they are answered, this one names why it is not."""
    topic_id: str | None = None
    """The identity of the topic read (None: the store did not say, or the partition is not
    there)."""
    recreated: str | None = None
    """Set (with no messages, ``topic_id`` the topic's identity now, ``next_offset`` its
    start) when the read named another identity of the topic than it has: the topic was
    deleted and made again since the reader's offset was read, and offsets of the old topic
    are no positions in the new one."""


def recreated_batch(
    topic: str, partition: int, asked: str, now: str, start_offset: int, end_offset: int
) -> PartitionBatch:
    """The answer to a read at an offset of the topic ``asked`` when the topic is ``now``."""
    reason = (
        f"topic {topic!r} was deleted and created again: its id is {now}, not {asked}; "
        f"offsets of the old topic are no positions in the new one, which starts at "
        f"offset {start_offset}"
    )
    return PartitionBatch(
        topic,
        partition,
        start_offset,
        end_offset,
        start_offset,
        topic_id=now,
        recreated=reason,
    )


def scan_budget_of(max_bytes: int) -> int:
    """How much one read for ``max_bytes`` may scan past filtered-out records."""
    return max(max_bytes * _SCAN_FACTOR, _MIN_SCAN_BYTES)


def check_max_bytes(max_bytes: int) -> int:
    if not 1 <= max_bytes <= MAX_MAX_BYTES:
        raise BadRequest(f"max_bytes must be in 1..{MAX_MAX_BYTES}, got {max_bytes}")
    return max_bytes


class PartitionReader:
    """Reads partitions of one store, applying filters and the legacy transaction filter."""

    def __init__(
        self,
        store: LogStore,
        txn_window_ms: int = DEFAULT_WINDOW_MS,
        resolve_budget_s: float = RESOLVE_BUDGET_S,
    ) -> None:
        self._store = store
        self.txn_window_ms = txn_window_ms
        self.resolve_budget_s = resolve_budget_s

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int = DEFAULT_MAX_BYTES,
        message_filter: MessageFilter | None = None,
        *,
        raw: bool = False,
        txn_window_ms: int | None = None,
        scan_bytes: int | None = None,
        resolve_until: float | None = None,
        topic_id: str | None = None,
    ) -> PartitionBatch:
        """Messages from ``offset`` on, about ``max_bytes`` of values (at least one message).

        ``topic_id``: the identity of the topic ``offset`` belongs to (as an earlier answer
        named it); a read that finds another answers :func:`recreated_batch` (no message).
        On a store whose reads name the identity only as its last look at the topic saw it
        (Kafka), the caller confirms it after the read (see ``ingest_api/read_api.py``).

        ``raw`` returns every record as stored (legacy records included, no filter): what a
        mirror copies.  Otherwise a record that is not an envelope is left out and named in
        ``not_envelopes`` (at most :data:`MAX_NOT_ENVELOPES`, then the read stops).  An
        offset outside ``start_offset .. end_offset`` raises :class:`OffsetOutOfRange` with
        the valid range.  A filtered read scans about ``scan_bytes`` (default
        :func:`scan_budget_of` ``max_bytes``) before it answers with nothing but a new
        position.  A committed legacy transaction is delivered at its marker's offset; the
        data records the read did not scan itself are read together, for about
        ``resolve_budget_s`` (or until ``resolve_until``, a ``time.monotonic()`` a fetch of
        several partitions shares), after which the answer stops at the first marker left
        (its ``next_offset``).
        """
        check_max_bytes(max_bytes)
        window = self.txn_window_ms if txn_window_ms is None else txn_window_ms
        filt = message_filter or MessageFilter()
        result = self._store.read(topic, partition, offset, max_bytes)
        if topic_id is not None and result.topic_id is not None and result.topic_id != topic_id:
            return recreated_batch(
                topic, partition, topic_id, result.topic_id, result.start_offset, result.end_offset
            )
        if offset > result.end_offset:
            if topic_id is not None and not self._store.capabilities.exact_read_identity:
                now = self._store.current_topic_id(topic)
                if now != topic_id:
                    return recreated_batch(topic, partition, topic_id, now, 0, result.end_offset)
            raise OffsetOutOfRange(
                f"offset {offset} is past the end of {topic}/{partition}: valid offsets are "
                f"{result.start_offset}..{result.end_offset} (the end is the next to be written)",
                result.start_offset,
                result.end_offset,
            )
        batch = PartitionBatch(
            topic,
            partition,
            result.start_offset,
            result.end_offset,
            result.next_offset,
            topic_id=result.topic_id,
        )
        scan_budget = scan_bytes if scan_bytes is not None else scan_budget_of(max_bytes)
        scanned = 0
        resolver = CommitResolver(self._store, topic, partition, window, offset)
        if resolve_until is None:
            resolve_until = time.monotonic() + self.resolve_budget_s
        while True:
            # Records up to the first commit marker are delivered as they come; from there on
            # they wait until the markers are resolved together (most of their data records
            # among the records just read), then are delivered in order.
            waiting: list[tuple[int, DeliveredMessage | EnvelopeView | NotEnvelope]] = []
            named = len(batch.not_envelopes)
            stop_at: int | None = None
            for record in result.records:
                scanned += len(record.value)
                item: DeliveredMessage | EnvelopeView | NotEnvelope | None
                try:
                    item = self._deliverable(record.offset, record.value, filt, raw, resolver)
                except NotAnEnvelope as exc:
                    _log.warning(
                        "skipping %s/%d@%d: not an envelope (%s)",
                        topic,
                        partition,
                        record.offset,
                        exc,
                    )
                    item = NotEnvelope(record.offset, str(exc))
                    named += 1
                    if named >= MAX_NOT_ENVELOPES:
                        stop_at = record.offset + 1
                if item is not None and (waiting or isinstance(item, EnvelopeView)):
                    waiting.append((record.offset, item))
                elif item is not None:
                    _add(batch, item)
                if stop_at is not None:
                    break
            resolver.scanned_to(result.next_offset if stop_at is None else stop_at)
            if waiting:
                markers = [item for _, item in waiting if isinstance(item, EnvelopeView)]
                released = resolver.resolve(markers, resolve_until)
                resolved = 0
                for at, item in waiting:
                    if isinstance(item, EnvelopeView):
                        if resolved == len(released):
                            # out of time: this marker and what follows are for the next read
                            batch.next_offset = at
                            batch.end_offset = max(batch.end_offset, result.end_offset)
                            return batch
                        data = released[resolved]
                        resolved += 1
                        if data is not None and filt.matches(data):
                            _add(
                                batch,
                                DeliveredMessage(
                                    at, data.value, data, data_offset=_data_offset(item)
                                ),
                            )
                    else:
                        _add(batch, item)
            batch.end_offset = max(batch.end_offset, result.end_offset)
            if stop_at is not None:
                batch.next_offset = stop_at
                return batch
            batch.next_offset = result.next_offset
            if (
                batch.value_bytes >= max_bytes
                or scanned >= scan_budget
                or not result.records
                or result.next_offset >= result.end_offset
                or (resolver.lookups and time.monotonic() >= resolve_until)
            ):
                return batch
            left = max_bytes - batch.value_bytes if batch.messages else max_bytes
            try:
                result = self._store.read(topic, partition, result.next_offset, left)
            except CorruptData:
                return batch  # what came before the damage; the next read names it
            if result.topic_id != batch.topic_id:
                return batch  # the topic was made again meanwhile: the next read says so

    def _deliverable(
        self,
        offset: int,
        value: bytes,
        filt: MessageFilter,
        raw: bool,
        resolver: CommitResolver,
    ) -> DeliveredMessage | EnvelopeView | None:
        """The message ``value`` gives, None for none, or a commit marker (its view) that
        gives the data it releases; legacy data records go to ``resolver``."""
        if raw:
            try:
                return DeliveredMessage(offset, value, view(value))
            except NotAnEnvelope:
                return DeliveredMessage(offset, value, None)
        # Raises NotAnEnvelope for the caller to name.  The fast path checks the head only: a
        # value whose head reads as a chunk's is delivered, and a client that cannot decode
        # it treats it as a record that is not an envelope (docs/protocol.md).
        if filt.matches_all and kind_of(value) == "chunk":
            return DeliveredMessage(offset, value, None)
        env = view(value)
        if env.kind == "legacy_data":
            resolver.saw(offset, env)
            return None
        if env.kind == "handover":
            # a handover record holds no data: the source's data up to its seqno is elsewhere
            return None
        if env.kind == "legacy_commit":
            return env
        if not filt.matches(env):
            return None
        return DeliveredMessage(offset, value, env)


def _add(batch: PartitionBatch, item: DeliveredMessage | NotEnvelope) -> None:
    if isinstance(item, NotEnvelope):
        batch.not_envelopes.append(item)
    else:
        batch.messages.append(item)
        batch.value_bytes += len(item.value)


def _data_offset(marker: EnvelopeView) -> int | None:
    target = marker_target(marker)
    return None if target is None else target[0]
