"""One loader task: read an offset range and write its lines as Parquet files into staging.

Rows go to the hour of their ``write_time`` (the gateway's clock, UTC), one file per hour the
range touches, each named after the range (see :func:`yt_loader.warehouse.file_name`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from yt_loader.crash_points import reach
from yt_loader.line_rows import LINE_SCHEMA
from yt_loader.log_source import SourceSpec
from yt_loader.offset_ranges import OffsetRange
from yt_loader.range_reader import RangeReadStats, read_range
from yt_loader.warehouse import LoadedRange, file_name, fsync_dir, fsync_file, table_dir

PARTITION_COLUMNS = ("topic", "date", "hour")
FILE_COLUMNS = [name for name in LINE_SCHEMA.names if name not in PARTITION_COLUMNS]
"""Columns stored in the files; topic, date and hour are in the directory names."""

FILE_SCHEMA = pa.schema([LINE_SCHEMA.field(name) for name in FILE_COLUMNS])
_US_PER_HOUR = 3_600_000_000


def _hour_dir(topic: str, hour_number: int) -> str:
    hour = datetime.fromtimestamp(hour_number * 3600, tz=UTC)
    return table_dir(topic, hour.strftime("%Y-%m-%d"), hour.strftime("%H"))


def write_range(
    spec: SourceSpec,
    staging_root: str,
    crash_at: str | None,
    topic_ids: dict[str, str],
    rng: OffsetRange,
) -> LoadedRange:
    """Write ``rng``'s lines under ``staging_root``, fsynced; return what was written.

    Writing the same range again gives files of the same names and contents.
    """
    staging = Path(staging_root)
    stats = RangeReadStats()
    writers: dict[str, pq.ParquetWriter] = {}
    source = spec.open()
    try:
        for batch in read_range(source, rng, stats=stats):
            hours = pc.divide(batch.column("write_time").cast(pa.int64()), _US_PER_HOUR)
            rows = pa.Table.from_batches([batch]).select(FILE_COLUMNS)
            for hour_number in pc.unique(hours).to_pylist():
                name = file_name(rng, topic_ids[rng.topic])
                rel = f"{_hour_dir(rng.topic, hour_number)}/{name}"
                writer = writers.get(rel)
                if writer is None:
                    path = staging / rel
                    path.parent.mkdir(parents=True, exist_ok=True)
                    writer = pq.ParquetWriter(path, FILE_SCHEMA)
                    writers[rel] = writer
                writer.write_table(rows.filter(pc.equal(hours, hour_number)))
                reach("while-writing", crash_at)
    finally:
        for writer in writers.values():
            writer.close()
        source.close()
    for rel in writers:
        fsync_file(staging / rel)
    for directory in {(staging / rel).parent for rel in writers}:
        fsync_dir(directory)
    return LoadedRange(
        topic=rng.topic,
        partition=rng.partition,
        start=rng.start,
        end=rng.end,
        files=sorted(writers),
        lines=stats.lines,
        data_bytes=stats.data_bytes,
    )
