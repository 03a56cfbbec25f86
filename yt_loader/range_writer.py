"""One loader task: an offset range's lines into Parquet files, one per hour they fall in.

Every attempt of a task writes to paths of its own (see :class:`OutputLayout`), so a task
retried after a failure, or a speculative copy racing the original, never writes into another
attempt's file; the driver commits only the files of the attempt whose result Spark accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from yt_loader.crash_points import reach
from yt_loader.line_rows import LINE_SCHEMA
from yt_loader.log_source import SourceSpec, check_same_topic
from yt_loader.offset_ranges import OffsetRange
from yt_loader.range_reader import RangeReadStats, read_range
from yt_loader.task_faults import after_partial_write
from yt_loader.typed_columns import SCHEMA_ID_COLUMN, RecordTyper, TopicSchemas
from yt_loader.warehouse import file_name, fsync_dir, fsync_file, table_dir

PARTITION_COLUMNS = ("topic", "date", "hour")
FILE_COLUMNS = [name for name in LINE_SCHEMA.names if name not in PARTITION_COLUMNS]
"""Columns stored in the files; topic, date and hour are in the directory names."""

FILE_SCHEMA = pa.schema([LINE_SCHEMA.field(name) for name in FILE_COLUMNS])
_US_PER_HOUR = 3_600_000_000


@dataclass(frozen=True)
class OutputLayout:
    """Where the tasks of one batch write, and how an attempt's paths are made its own.

    ``attempt_in="directory"``: ``root/<attempt>/<hour dir>/<range's file name>`` (the Parquet
    warehouse's staging; the driver moves the accepted attempt's files to their final names).
    ``attempt_in="file_name"``: ``root/<hour dir>/<range's file name>-<attempt>.parquet``,
    final where they are (a Delta table, whose log alone says which files are in it).
    An attempt is ``<run>-<Spark task attempt id>``: unique across runs and attempts.
    """

    root: str
    run: str
    attempt_in: Literal["directory", "file_name"]


@dataclass(frozen=True)
class WrittenFile:
    """One Parquet file an attempt wrote: where, which table partition, what it holds."""

    path: str
    """relative to the layout's root (directory layout: to the attempt's directory)"""
    topic: str
    date: str
    hour: int
    size_bytes: int
    modified_ms: int
    rows: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class WrittenRange:
    """What one successful attempt wrote for one offset range."""

    rng: OffsetRange
    attempt: str
    files: list[WrittenFile]
    lines: int
    data_bytes: int
    corrupt: list[tuple[int, str]] = field(default_factory=list)
    """(offset, why) of the messages left out because they do not decompress."""
    clamped: int = 0
    """Messages loaded with a create or write time clamped into 1970 .. 9999-12-31."""
    clamped_examples: list[tuple[int, str, int]] = field(default_factory=list)
    """(offset, field, stored value) of the first few of them."""


def _attempt_id(run: str) -> str:
    from pyspark import TaskContext

    context = TaskContext.get()
    return f"{run}-{context.taskAttemptId() if context is not None else 0}"


class _HourFile:
    def __init__(
        self, path: Path, rel: str, topic: str, hour_number: int, schema: pa.Schema
    ) -> None:
        self.path = path
        self.rel = rel
        self.topic = topic
        self.hour_number = hour_number
        path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = pq.ParquetWriter(path, schema)
        self.rows = 0
        self.min_offset: int | None = None
        self.max_offset = -1

    def write(self, rows: pa.Table) -> None:
        self.writer.write_table(rows)
        offsets = pc.min_max(rows.column("offset"))
        low, high = int(offsets["min"].as_py()), int(offsets["max"].as_py())
        self.min_offset = low if self.min_offset is None else min(self.min_offset, low)
        self.max_offset = max(self.max_offset, high)
        self.rows += rows.num_rows

    def done(self) -> WrittenFile:
        stat = self.path.stat()
        hour = datetime.fromtimestamp(self.hour_number * 3600, tz=UTC)
        return WrittenFile(
            path=self.rel,
            topic=self.topic,
            date=hour.strftime("%Y-%m-%d"),
            hour=hour.hour,
            size_bytes=stat.st_size,
            modified_ms=stat.st_mtime_ns // 1_000_000,
            rows=self.rows,
            min_offset=self.min_offset if self.min_offset is not None else 0,
            max_offset=self.max_offset,
        )


def _hour_dir(topic: str, hour_number: int) -> str:
    hour = datetime.fromtimestamp(hour_number * 3600, tz=UTC)
    return table_dir(topic, hour.strftime("%Y-%m-%d"), hour.strftime("%H"))


def write_range(
    spec: SourceSpec,
    layout: OutputLayout,
    crash_at: str | None,
    topic_ids: dict[str, str],
    rng: OffsetRange,
    typed: TopicSchemas | None = None,
    *,
    skip_corrupt: bool = False,
) -> WrittenRange:
    """Write ``rng``'s lines into this attempt's own files, fsynced; return what was written.

    ``typed``: the topic is structured; its files get the records' struct column too.
    ``skip_corrupt``: a message that does not decompress, or a record that is not an
    envelope, is left out (and named in the result) rather than failing the range.
    """
    attempt = _attempt_id(layout.run)
    root = Path(layout.root)
    if layout.attempt_in == "directory":
        root = root / attempt
    stats = RangeReadStats()
    files: dict[int, _HourFile] = {}
    typer = None if typed is None else RecordTyper(typed)
    file_schema = FILE_SCHEMA
    if typer is not None and typed is not None:
        file_schema = file_schema.append(pa.field(typed.column, typer.arrow))
    source = spec.open()
    try:
        for batch in read_range(
            source, rng, stats=stats, with_schema_ids=typer is not None, skip_corrupt=skip_corrupt
        ):
            hours = pc.divide(batch.column("write_time").cast(pa.int64()), _US_PER_HOUR)
            rows = pa.Table.from_batches([batch]).select(FILE_COLUMNS)
            if typer is not None and typed is not None:
                records = typer.column(batch.column("line"), batch.column(SCHEMA_ID_COLUMN))
                rows = rows.append_column(pa.field(typed.column, typer.arrow), records)
            for hour_number in pc.unique(hours).to_pylist():
                out = files.get(hour_number)
                if out is None:
                    name = file_name(rng, topic_ids[rng.topic])
                    if layout.attempt_in == "file_name":
                        name = f"{name.removesuffix('.parquet')}-{attempt}.parquet"
                    rel = f"{_hour_dir(rng.topic, hour_number)}/{name}"
                    out = files[hour_number] = _HourFile(
                        root / rel, rel, rng.topic, hour_number, file_schema
                    )
                out.write(rows.filter(pc.equal(hours, hour_number)))
                reach("while-writing", crash_at)
            after_partial_write()
        check_same_topic(source, rng.topic, topic_ids[rng.topic])
    finally:
        for out in files.values():
            out.writer.close()
        source.close()
    for out in files.values():
        fsync_file(out.path)
    for directory in {out.path.parent for out in files.values()}:
        fsync_dir(directory)
    return WrittenRange(
        rng=rng,
        attempt=attempt,
        files=[out.done() for out in sorted(files.values(), key=lambda f: f.rel)],
        lines=stats.lines,
        data_bytes=stats.data_bytes,
        corrupt=stats.corrupt,
        clamped=stats.clamped,
        clamped_examples=stats.clamped_examples,
    )
