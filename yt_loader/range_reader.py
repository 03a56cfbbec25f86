"""Reading one offset range into Arrow batches of log lines: what every Spark task runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from log_store.errors import OffsetOutOfRange
from session_dedup.chunk_codecs import CorruptChunk
from yt_loader.errors import DataLost, SourceUnavailable, WarehouseCorrupt
from yt_loader.line_rows import LineBatchBuilder
from yt_loader.log_source import DEFAULT_READ_BYTES, ForeignRecord, LogSource
from yt_loader.offset_ranges import OffsetRange

DEFAULT_BATCH_LINES = 64 * 1024
_REFUSED_TRIES = 4
"""How often a read the source refused as out of range, for an offset it says it holds,
is asked again (after 0.5 s, 1 s, 1.5 s, 2 s)."""
_REFUSED_PAUSE_S = 0.5


@dataclass
class RangeReadStats:
    """What one range read: messages, lines and bytes of (decompressed) log data."""

    messages: int = 0
    lines: int = 0
    data_bytes: int = 0
    skipped_by_retention: int = 0
    corrupt: list[tuple[int, str]] = field(default_factory=list)
    """(offset, why) of each message left out because its data does not decompress or it is
    not an envelope at all (only with ``skip_corrupt``); ``why`` reads after "the message"."""
    clamped: int = 0
    """Messages whose create or write time was outside 1970 .. 9999-12-31, loaded with it
    clamped into that range (see :meth:`~yt_loader.line_rows.LineBatchBuilder.add`)."""
    clamped_examples: list[tuple[int, str, int]] = field(default_factory=list)
    """(offset, field, stored value) of the first few of them."""


def read_range(
    source: LogSource,
    rng: OffsetRange,
    *,
    stats: RangeReadStats | None = None,
    batch_lines: int = DEFAULT_BATCH_LINES,
    read_bytes: int = DEFAULT_READ_BYTES,
    fail_on_data_loss: bool = True,
    with_schema_ids: bool = False,
    skip_corrupt: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The lines of ``rng`` as batches of :data:`~yt_loader.line_rows.LINE_SCHEMA` rows.

    Lines come in offset order; a legacy transaction's lines come at its commit marker's
    offset (see ``delivery/legacy_txn.py``), so the range holding the marker loads them.
    If retention dropped part of the range, raises :class:`DataLost`, or with
    ``fail_on_data_loss=False`` skips what is gone; if the partition now ends below the
    range's end, raises :class:`WarehouseCorrupt`.  A read refused as out of range for an
    offset the source says it holds is asked again, then fails with
    :class:`SourceUnavailable`.  ``with_schema_ids``: each batch also has a ``_schema_id``
    column (the stamp of each line's chunk, see ``yt_loader.typed_columns``).
    A message whose data does not decompress, or a record that is not an envelope at all
    (another producer's, on Kafka), raises :class:`CorruptChunk`, or with ``skip_corrupt`` is
    left out and named in ``stats.corrupt``.
    """
    stats = stats if stats is not None else RangeReadStats()
    builder = LineBatchBuilder(rng.topic, rng.partition, with_schema_ids=with_schema_ids)
    offset = rng.start
    refused = 0
    while offset < rng.end:
        try:
            batch = source.read(rng.topic, rng.partition, offset, read_bytes)
        except OffsetOutOfRange as exc:
            if exc.start_offset <= offset and exc.end_offset < rng.end:
                raise _truncated(rng, exc.end_offset) from exc
            if exc.start_offset <= offset:
                # The log holds the offset, yet its source refused it (a Kafka-backed gateway
                # of a version before it checked did so with a stale consumer, right after
                # the topic was made again): ask again, as for any answer to be retried.
                refused += 1
                if refused > _REFUSED_TRIES:
                    raise SourceUnavailable(
                        f"{rng.topic} partition {rng.partition}: the log's source answered "
                        f"{refused} times that offset {offset} is out of range, yet it says "
                        f"the partition holds {exc.start_offset}..{exc.end_offset} (this "
                        f"range ends at {rng.end}): {exc}"
                    ) from exc
                time.sleep(_REFUSED_PAUSE_S * refused)
                continue
            if fail_on_data_loss:
                raise DataLost(
                    f"{rng.topic} partition {rng.partition}: offsets {offset}.."
                    f"{min(exc.start_offset, rng.end) - 1} were dropped by retention before "
                    "they were read"
                ) from exc
            stats.skipped_by_retention += min(exc.start_offset, rng.end) - offset
            offset = exc.start_offset
            continue
        refused = 0
        if batch.next_offset <= offset:
            raise _truncated(rng, batch.end_offset)
        for message in batch.messages:
            if message.offset >= rng.end:
                break
            stats.messages += 1
            if isinstance(message, ForeignRecord):
                if not skip_corrupt:
                    raise CorruptChunk(
                        f"{rng.topic}/{rng.partition} offset {message.offset} is "
                        f"{message.reason}; the load stops here rather than leave the record "
                        "out (--skip-corrupt loads past it, recording it as lost)"
                    )
                stats.corrupt.append((message.offset, f"is {message.reason}"))
                continue
            before = builder.data_bytes
            try:
                stats.lines += builder.add(message.offset, message.envelope)
            except CorruptChunk as exc:
                if not skip_corrupt:
                    raise
                why = str(exc.__cause__ or exc)
                stats.corrupt.append((message.offset, f"does not decompress ({why})"))
                continue
            stats.data_bytes += builder.data_bytes - before
            if builder.line_count >= batch_lines:
                yield builder.build()
        offset = batch.next_offset
    stats.clamped = builder.clamped
    stats.clamped_examples = builder.clamped_examples
    if builder.line_count:
        yield builder.build()


def _truncated(rng: OffsetRange, end_offset: int) -> WarehouseCorrupt:
    return WarehouseCorrupt(
        f"{rng.topic} partition {rng.partition} ends at offset {end_offset}, below the planned "
        f"end {rng.end}: the log was replaced or truncated"
    )
