"""One row per log line: the columns every reader of the log sees, built as Arrow batches.

A message carries many lines; its fields are gathered once per message and spread over its
lines with one ``take``, so the per-line work stays inside Arrow's C++ code.
"""

from __future__ import annotations

import pyarrow as pa

from session_dedup.chunk_codecs import CorruptChunk, decompress
from session_dedup.envelope import Envelope
from session_dedup.source import MAX_CREATE_TIME_MS

_TIMESTAMP = pa.timestamp("us", tz="UTC")

LINE_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("source_id", pa.string()),
        ("seqno", pa.int64()),
        ("server", pa.string()),
        ("file", pa.string()),
        ("log_type", pa.string()),
        ("create_time", _TIMESTAMP),
        ("write_time", _TIMESTAMP),
        ("line", pa.string()),
    ]
)
"""Arrow schema of the rows; equal to what Spark derives from :data:`SPARK_SCHEMA_DDL`."""

SPARK_SCHEMA_DDL = (
    "topic STRING, partition INT, offset BIGINT, source_id STRING, seqno BIGINT, "
    "server STRING, file STRING, log_type STRING, create_time TIMESTAMP, "
    "write_time TIMESTAMP, line STRING"
)

CLAMPED_EXAMPLES = 3
"""Messages with a clamped time named in a load's report, per range."""

_PER_MESSAGE = ("offset", "source_id", "seqno", "server", "file", "log_type")


def split_lines(data: bytes) -> list[bytes]:
    """The lines of a chunk without their ``\\n``; a last line without one is kept too."""
    if not data:
        return []
    lines = data.split(b"\n")
    if not lines[-1]:
        lines.pop()
    return lines


class LineBatchBuilder:
    """Collects the lines of one partition's messages and builds a ``RecordBatch`` of them."""

    def __init__(self, topic: str, partition: int, *, with_schema_ids: bool = False) -> None:
        self.topic = topic
        self.partition = partition
        self.with_schema_ids = with_schema_ids
        """Add a ``_schema_id`` column (uint64): each line's chunk's schema id, or null."""
        self.clamped = 0
        """Messages added whose ``create_time`` or ``write_time`` was outside
        ``0 .. MAX_CREATE_TIME_MS``, loaded clamped into that range (see :meth:`_clamped`)."""
        self.clamped_examples: list[tuple[int, str, int]] = []
        """(offset, field, value as stored) of the first :data:`CLAMPED_EXAMPLES` of them."""
        self._reset()

    def _reset(self) -> None:
        self._columns: dict[str, list[object]] = {name: [] for name in _PER_MESSAGE}
        self._create_us: list[int] = []
        self._write_us: list[int] = []
        self._schema_ids: list[int | None] = []
        self._repeat: list[int] = []
        self._lines: list[bytes] = []
        self.data_bytes = 0

    @property
    def line_count(self) -> int:
        return len(self._lines)

    def add(self, offset: int, envelope: Envelope) -> int:
        """Add the lines of one message; returns how many lines it had.

        A message whose data does not decompress raises :class:`CorruptChunk` naming its
        offset, and adds nothing: a load that left it out silently would count as complete
        and never be done again, so an operator decides (``logbroker load --skip-corrupt``
        leaves such messages out and records them as lost; see docs/loader.md).
        """
        try:
            raw = decompress(envelope.codec, envelope.data)
        except CorruptChunk as exc:
            raise type(exc)(
                f"{self.topic}/{self.partition} offset {offset}: {exc}; the load stops here "
                "rather than leave the message out (--skip-corrupt loads past it, recording it "
                "as lost)"
            ) from exc
        lines = split_lines(raw)
        if not lines:
            return 0
        index = len(self._create_us)
        cols = self._columns
        cols["offset"].append(offset)
        cols["source_id"].append(envelope.source_id)
        cols["seqno"].append(envelope.seqno)
        cols["server"].append(envelope.server)
        cols["file"].append(envelope.file)
        cols["log_type"].append(envelope.log_type)
        create_time = envelope.create_time
        write_time = envelope.write_time
        if not (0 <= create_time <= MAX_CREATE_TIME_MS and 0 <= write_time <= MAX_CREATE_TIME_MS):
            self.clamped += 1
            create_time = self._clamped(offset, "create_time", create_time)
            write_time = self._clamped(offset, "write_time", write_time)
        self._create_us.append(create_time * 1000)
        self._write_us.append(write_time * 1000)
        self._schema_ids.append(envelope.schema_id)
        self._repeat.extend([index] * len(lines))
        self._lines.extend(lines)
        self.data_bytes += len(raw)
        return len(lines)

    def _clamped(self, offset: int, field: str, value: int) -> int:
        """``value`` within ``0 .. MAX_CREATE_TIME_MS`` (noted if it was not).

        A gateway refuses such times now; one stored before it did (or written into Kafka
        by another producer) overflowed the timestamp column and failed the whole load of
        its topic.  Left out, its lines would be lost; with a null time they would drop out
        of the audit's windows and the table's hour partitions.  Clamped, they load, at
        1970-01-01 or 9999-12-31, and the load reports them."""
        if 0 <= value <= MAX_CREATE_TIME_MS:
            return value
        if len(self.clamped_examples) < CLAMPED_EXAMPLES:
            self.clamped_examples.append((offset, field, value))
        return min(max(value, 0), MAX_CREATE_TIME_MS)

    def build(self) -> pa.RecordBatch:
        """The rows gathered so far, and a fresh start for the next batch."""
        take = pa.array(self._repeat, pa.int32())
        n = len(self._lines)
        arrays: list[pa.Array] = [
            pa.array([self.topic]).take(pa.array([0] * n, pa.int32())),
            pa.array([self.partition] * n, pa.int32()),
        ]
        for name in _PER_MESSAGE:
            field_type = LINE_SCHEMA.field(name).type
            arrays.append(pa.array(self._columns[name], field_type).take(take))
        arrays.append(pa.array(self._create_us, _TIMESTAMP).take(take))
        arrays.append(pa.array(self._write_us, _TIMESTAMP).take(take))
        arrays.append(_text(self._lines))
        schema = LINE_SCHEMA
        if self.with_schema_ids:
            arrays.append(pa.array(self._schema_ids, pa.uint64()).take(take))
            schema = schema.append(pa.field("_schema_id", pa.uint64()))
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        self._reset()
        return batch


def _text(lines: list[bytes]) -> pa.Array:
    binary = pa.array(lines, pa.binary())
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        # A log line that is not UTF-8 is kept, with U+FFFD marking the bytes it could not be.
        return pa.array([line.decode("utf-8", errors="replace") for line in lines], pa.string())
