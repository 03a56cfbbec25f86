"""The loader job in this process's Spark session: incremental, exactly once, nothing silent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from log_store import open_store
from log_store.interface import TopicConfig
from tests.conftest import free_port
from tests.yt_loader.conftest import (
    PUBLISHED_GLOB,
    ChildProcess,
    append_lines,
    assert_exactly_once,
    published_lines,
)
from yt_loader.errors import WarehouseBusy
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import SourceSpec
from yt_loader.warehouse import Warehouse

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _load(
    spark: object,
    data_dir: Path,
    warehouse: Path,
    topics: str = "*",
    progress: list[str] | None = None,
) -> object:
    config = LoadConfig(
        SourceSpec(data_dir=str(data_dir)), warehouse, topics=topics, max_range_bytes=4000
    )
    lines = progress if progress is not None else []
    return run_load(spark, config, lines.append)  # type: ignore[arg-type]


def test_load_writes_each_line_once_into_tables_partitioned_by_topic_date_hour(
    spark: object, tmp_path: Path
) -> None:
    data_dir, warehouse = tmp_path / "data", tmp_path / "wh"
    expected = append_lines(data_dir, "dc1.nginx-access", "a", codec="raw")
    expected += append_lines(data_dir, "dc1.api", "a", codec="gzip", partitions=2)
    expected += append_lines(data_dir, "dc2.api", "a", codec="zstd", partitions=1)

    report = _load(spark, data_dir, warehouse)

    assert report.lines == len(expected)  # type: ignore[attr-defined]
    assert_exactly_once(published_lines(warehouse), expected)
    df = spark.read.parquet(str(warehouse))  # type: ignore[attr-defined]
    assert {"topic", "date", "hour", "partition", "offset", "seqno", "line"} <= set(df.columns)
    by_topic = {r["topic"]: r["count"] for r in df.groupBy("topic").count().collect()}
    assert by_topic == {"dc1.nginx-access": 180, "dc1.api": 120, "dc2.api": 60}
    hours = {r["hour"] for r in df.select("hour").distinct().collect()}
    assert len(hours) == 3  # the test data spreads write times over three hours
    mismatched = df.filter("hour(write_time) != hour OR to_date(write_time) != date").count()
    assert mismatched == 0
    assert {p.name for p in warehouse.glob("topic=*")} == {
        "topic=dc1.nginx-access",
        "topic=dc1.api",
        "topic=dc2.api",
    }


def test_rerun_with_no_new_data_adds_nothing(spark: object, tmp_path: Path) -> None:
    data_dir, warehouse = tmp_path / "data", tmp_path / "wh"
    expected = append_lines(data_dir, "dc1.app", "a")
    _load(spark, data_dir, warehouse)
    files_before = sorted(warehouse.glob(PUBLISHED_GLOB))
    commits_before = len(Warehouse(warehouse).commits())

    report = _load(spark, data_dir, warehouse)

    assert report.batches == [] and report.lines == 0  # type: ignore[attr-defined]
    assert sorted(warehouse.glob(PUBLISHED_GLOB)) == files_before
    assert len(Warehouse(warehouse).commits()) == commits_before
    assert_exactly_once(published_lines(warehouse), expected)


def test_new_data_and_new_topics_after_a_load_are_appended(spark: object, tmp_path: Path) -> None:
    data_dir, warehouse = tmp_path / "data", tmp_path / "wh"
    expected = append_lines(data_dir, "dc1.app", "first")
    _load(spark, data_dir, warehouse, topics="dc1.*")
    expected += append_lines(data_dir, "dc1.app", "second", chunks=7)
    expected += append_lines(data_dir, "dc1.new-topic", "second", partitions=2)
    append_lines(data_dir, "dc2.other", "not-matched", partitions=1)

    progress: list[str] = []
    report = _load(spark, data_dir, warehouse, topics="dc1.*", progress=progress)

    assert any("dc1.app: 21/21 offsets (100%), 63 lines" in line for line in progress), progress
    assert any("dc1.new-topic: 40/40 offsets (100%)" in line for line in progress), progress
    assert set(report.topics) == {"dc1.app", "dc1.new-topic"}  # type: ignore[attr-defined]
    assert report.topics["dc1.app"].done_offsets == 3 * 7  # type: ignore[attr-defined]
    assert_exactly_once(published_lines(warehouse), expected)
    latest = Warehouse(warehouse).latest_commit()
    assert latest is not None
    assert latest.offsets["dc1.app"].partitions == {0: 27, 1: 27, 2: 27}
    assert latest.offsets["dc1.new-topic"].partitions == {0: 20, 1: 20}


def test_a_topic_deleted_and_created_again_is_reported_and_keeps_its_old_files(
    spark: object, tmp_path: Path
) -> None:
    data_dir, warehouse = tmp_path / "data", tmp_path / "wh"
    old = append_lines(data_dir, "dc1.app", "old", partitions=1)
    _load(spark, data_dir, warehouse)
    store = open_store(data_dir)
    try:
        store.delete_topic("dc1.app")
    finally:
        store.close()
    new = append_lines(data_dir, "dc1.app", "new", partitions=1)  # the same offsets again

    report = _load(spark, data_dir, warehouse)

    assert [g.reason for g in report.gaps] == [  # type: ignore[attr-defined]
        "the topic was deleted and created again; whatever the old topic held from offset 20 "
        "on was not loaded"
    ]
    assert_exactly_once(published_lines(warehouse), old + new)


def test_a_second_loader_on_the_same_warehouse_is_refused(spark: object, tmp_path: Path) -> None:
    data_dir, warehouse = tmp_path / "data", tmp_path / "wh"
    append_lines(data_dir, "dc1.app", "a", partitions=1)
    with Warehouse(warehouse).locked(), pytest.raises(WarehouseBusy, match="another loader"):
        _load(spark, data_dir, warehouse)
    assert published_lines(warehouse) == []


def test_load_through_a_gateway_matches_the_store(
    spark: object, tmp_path: Path, start_gateway: object
) -> None:
    gateway = start_gateway(tmp_path / "data")  # type: ignore[operator]
    expected = append_lines(tmp_path / "data", "dc1.app", "a", codec="gzip")
    config = LoadConfig(SourceSpec(server=gateway.url), tmp_path / "wh", max_range_bytes=4000)

    report = run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]

    assert report.lines == len(expected)
    assert_exactly_once(published_lines(tmp_path / "wh"), expected)


def test_offsets_dropped_by_retention_before_loading_are_reported_with_exit_code_3(
    tmp_path: Path,
) -> None:
    data_dir, warehouse = tmp_path / "data", tmp_path / "wh"
    small_segments = TopicConfig(partitions=1, segment_bytes=4096)
    for round_no in range(6):  # segments roll between appends
        append_lines(
            data_dir, "dc1.app", f"r{round_no}", partitions=1, config=small_segments, chunks=20
        )
    store = open_store(data_dir)
    try:
        new_start = store.delete_segments_before("dc1.app", 0, 80)
    finally:
        store.close()
    assert 0 < new_start <= 80

    child = ChildProcess(
        [
            "-m",
            "ops",
            "load",
            "--data-dir",
            str(data_dir),
            "--warehouse",
            str(warehouse),
            "--master",
            "local[1]",
            "--format",
            "json",
        ],
        tmp_path / "load.log",
    )
    code = child.wait(180)
    output = child.output()

    assert code == 3, output[-3000:]
    assert f"DATA LOST: dc1.app partition 0: offsets 0..{new_start - 1}" in output
    assert "retention dropped them before they were loaded" in output
    report, _ = json.JSONDecoder().raw_decode(output, output.index('{\n "batches"'))
    assert report["gaps"][0]["end"] == new_start
    assert len(published_lines(warehouse)) == (120 - new_start) * 3
    latest = Warehouse(warehouse).latest_commit()
    assert latest is not None and latest.gaps[0].start == 0


def test_bad_usage_exits_2_before_starting_spark(tmp_path: Path) -> None:
    child = ChildProcess(
        ["-m", "ops", "load", "--data-dir", str(tmp_path / "nope"), "--warehouse", "w"],
        tmp_path / "bad.log",
    )
    assert child.wait(30) == 2
    assert "is not a logbroker data directory" in child.output()
    assert not (tmp_path / "nope").exists()


def test_unreachable_gateway_exits_1_with_the_reason(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    child = ChildProcess(
        ["-m", "ops", "load", "--server", url, "--warehouse", str(tmp_path / "wh")],
        tmp_path / "down.log",
    )
    assert child.wait(30) == 1
    assert f"gateway {url} unreachable" in child.output()
