"""A record whose create or write time no timestamp column holds (stored before the gateway
refused such times, or written into Kafka by another producer) loads with the time clamped
into 1970-01-01 .. 9999-12-31 and is reported; it once stopped the load of its whole topic
(``OverflowError`` building the batch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store import open_store
from session_dedup.envelope import Envelope, encode
from tests.yt_loader.conftest import append_lines, assert_exactly_once, table_lines
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.load_report import report_document
from yt_loader.log_source import SourceSpec, StoreLogSource
from yt_loader.offset_ranges import OffsetRange
from yt_loader.range_reader import RangeReadStats, read_range
from yt_loader.table_counts import delta_table_counts

MAX_CREATE_TIME_MS = 253_402_214_400_000
"""9999-12-31T00:00:00Z in ms: the latest create time docs/protocol.md promises to take."""
NOW_MS = 1_795_812_881_535
BAD = [
    # (create_time, write_time) as stored
    (-99_999_999_999_999_999, NOW_MS),
    (NOW_MS, 2**62),
    (MAX_CREATE_TIME_MS + 1, -5),
]


def _append_bad(data_dir: Path, topic: str = "dc1.app") -> list[str]:
    lines = []
    with open_store(data_dir) as store:
        store.create_topic(topic, exist_ok=True)
        values = []
        for i, (create_time, write_time) in enumerate(BAD):
            line = f"odd time {i}"
            lines.append(line)
            values.append(
                encode(
                    Envelope(
                        "s",
                        "h",
                        "/f",
                        "app",
                        "raw",
                        i + 1,
                        create_time,
                        write_time,
                        b"%s\n" % line.encode(),
                    )
                )
            )
        store.append(topic, 0, values)
    return lines


def test_a_range_read_clamps_times_no_timestamp_holds_and_names_them(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        store.create_topic("dc1.app", exist_ok=True)
        store.append(
            "dc1.app", 0, [encode(Envelope("s0", "h", "/f", "app", "raw", 1, 5, 6, b"fine\n"))]
        )
    _append_bad(data_dir)
    with open_store(data_dir) as store:
        stats = RangeReadStats()
        (batch,) = list(
            read_range(StoreLogSource(store), OffsetRange("dc1.app", 0, 0, 4), stats=stats)
        )
    assert batch.column("line").to_pylist() == ["fine", "odd time 0", "odd time 1", "odd time 2"]
    create_us = batch.column("create_time").cast("int64").to_pylist()
    write_us = batch.column("write_time").cast("int64").to_pylist()
    top = MAX_CREATE_TIME_MS * 1000
    assert create_us == [5_000, 0, NOW_MS * 1000, top]
    assert write_us == [6_000, NOW_MS * 1000, top, 0]
    assert stats.clamped == 3
    assert stats.clamped_examples == [
        (1, "create_time", -99_999_999_999_999_999),
        (2, "write_time", 2**62),
        (3, "create_time", MAX_CREATE_TIME_MS + 1),
    ]


@pytest.mark.spark
@pytest.mark.slow
def test_a_load_of_a_topic_holding_such_times_loads_every_line_and_reports_them(
    spark: object, tmp_path: Path
) -> None:
    data_dir, table = tmp_path / "data", tmp_path / "table"
    before = append_lines(data_dir, "dc1.app", "before", partitions=1, chunks=4)
    odd = _append_bad(data_dir)
    after = append_lines(data_dir, "dc1.app", "after", partitions=1, chunks=4)
    progress: list[str] = []
    config = LoadConfig(SourceSpec(data_dir=str(data_dir)), table)
    report = run_load(spark, config, progress.append)  # type: ignore[arg-type]

    assert report.gaps == []
    assert_exactly_once(table_lines(spark, table), before + odd + after)
    assert report.clamped_times == 3
    assert report.topics["dc1.app"].clamped_times == 3
    doc = report_document(report)
    assert doc["clamped_times"] == 3 and doc["topics"]["dc1.app"]["clamped_times"] == 3
    said = [p for p in progress if "clamped" in p]
    assert len(said) == 1, progress
    assert "dc1.app partition 0: 3 messages with a create_time or write_time outside" in said[0]
    assert "create_time -99999999999999999" in said[0]

    rows = spark.sql(  # type: ignore[attr-defined]
        f"SELECT line, unix_micros(create_time) AS c, unix_micros(write_time) AS w "
        f"FROM delta.`{table}` WHERE line LIKE 'odd time %' ORDER BY line"
    ).collect()
    top = MAX_CREATE_TIME_MS * 1000
    assert [(r["c"], r["w"]) for r in rows] == [(0, NOW_MS * 1000), (NOW_MS * 1000, top), (top, 0)]
    # Spark hands every one to Python as a datetime (a year past 9999 would not convert)
    collected = spark.sql(f"SELECT create_time, write_time FROM delta.`{table}`").collect()  # type: ignore[attr-defined]
    assert len(collected) == len(before + odd + after)
    counts = delta_table_counts(spark, table)
    assert sum(lines for _, lines in counts.values()) == len(before + odd + after)
