"""``--table-format parquet``: the Parquet-directory warehouse, and its migration to Delta."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store.errors import BadRequest
from tests.yt_loader.conftest import (
    append_lines,
    assert_exactly_once,
    published_lines,
    table_lines,
)
from yt_loader.errors import WarehouseBusy
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import SourceSpec
from yt_loader.warehouse import Warehouse

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _load(spark: object, data_dir: Path, warehouse: Path, table_format: str) -> object:
    config = LoadConfig(
        SourceSpec(data_dir=str(data_dir)),
        warehouse,
        max_range_bytes=4000,
        table_format=table_format,  # type: ignore[arg-type]
    )
    return run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]


def test_parquet_warehouse_gives_globbing_readers_each_line_once(
    spark: object, tmp_path: Path
) -> None:
    data_dir, warehouse = tmp_path / "data", tmp_path / "wh"
    expected = append_lines(data_dir, "dc1.app", "a", codec="gzip")
    expected += append_lines(data_dir, "dc2.api", "a", codec="zstd", partitions=1)

    report = _load(spark, data_dir, warehouse, "parquet")

    assert report.lines == len(expected)  # type: ignore[attr-defined]
    assert_exactly_once(published_lines(warehouse), expected)
    df = spark.read.parquet(str(warehouse))  # type: ignore[attr-defined]
    assert {"topic", "date", "hour", "partition", "offset", "line"} <= set(df.columns)
    assert {p.name for p in warehouse.glob("topic=*")} == {"topic=dc1.app", "topic=dc2.api"}
    assert not list((warehouse / "_loader" / "staging").iterdir())


def test_a_second_loader_on_the_same_parquet_warehouse_is_refused(
    spark: object, tmp_path: Path
) -> None:
    data_dir, warehouse = tmp_path / "data", tmp_path / "wh"
    append_lines(data_dir, "dc1.app", "a", partitions=1)
    with Warehouse(warehouse).locked(), pytest.raises(WarehouseBusy, match="another loader"):
        _load(spark, data_dir, warehouse, "parquet")
    assert published_lines(warehouse) == []


def test_a_parquet_warehouse_converted_to_delta_goes_on_exactly_once(
    spark: object, tmp_path: Path
) -> None:
    data_dir, warehouse = tmp_path / "data", tmp_path / "wh"
    expected = append_lines(data_dir, "dc1.app", "parquet-era", partitions=2)
    _load(spark, data_dir, warehouse, "parquet")
    expected += append_lines(data_dir, "dc1.app", "delta-era", partitions=2, chunks=5)

    with pytest.raises(BadRequest, match="is a Parquet warehouse"):
        _load(spark, data_dir, warehouse, "delta")
    spark.sql(  # type: ignore[attr-defined]
        f"CONVERT TO DELTA parquet.`{warehouse}` PARTITIONED BY (topic STRING, date DATE, hour INT)"
    )
    report = _load(spark, data_dir, warehouse, "delta")
    again = _load(spark, data_dir, warehouse, "delta")

    assert report.lines == 2 * 5 * 3  # type: ignore[attr-defined]
    assert again.batches == []  # type: ignore[attr-defined]
    assert_exactly_once(table_lines(spark, warehouse), expected)
