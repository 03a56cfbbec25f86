"""SIGKILL of a real ``logbroker load`` process at each point of a batch, then a rerun."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.yt_loader.conftest import (
    ChildProcess,
    append_lines,
    assert_exactly_once,
    published_lines,
    table_lines,
)
from yt_loader.crash_points import CRASH_AT_ENV, REACHED_MARKER
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import SourceSpec
from yt_loader.warehouse import Warehouse

# Real JVMs started and killed: generous on a loaded 2-core machine.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.fault, pytest.mark.timeout(600)]


def _crashed_load(
    tmp_path: Path, data_dir: Path, warehouse: Path, point: str, table_format: str
) -> ChildProcess:
    child = ChildProcess(
        [
            "-m",
            "ops",
            "load",
            "--data-dir",
            str(data_dir),
            "--warehouse",
            str(warehouse),
            "--table-format",
            table_format,
            "--master",
            "local[2]",
            "--max-range-mb",
            "0.002",
        ],
        tmp_path / f"load-{point}.log",
        env={CRASH_AT_ENV: point},
    )
    try:
        child.wait_for_output(f"{REACHED_MARKER} {point}", timeout_s=420)
    finally:
        child.kill()
    return child


# A task killed while writing leaves what "after-files" leaves, a part file no commit names;
# the cluster test kills executors mid-task.
@pytest.mark.parametrize("point", ["after-files", "after-commit"])
def test_sigkilled_delta_load_is_invisible_or_whole_and_a_rerun_loads_exactly_once(
    spark: object, tmp_path: Path, point: str
) -> None:
    data_dir, table = tmp_path / "data", tmp_path / "table"
    expected = append_lines(data_dir, "dc1.app", "first")

    _crashed_load(tmp_path, data_dir, table, point, "delta")

    # Files were written, but Delta readers see a batch whole or not at all: only a committed
    # batch is in the table.
    assert list(table.glob("topic=*/date=*/hour=*/*.parquet"))
    seen = table_lines(spark, table)
    if point == "after-commit":
        assert_exactly_once(seen, expected)
    else:
        assert seen == []

    expected += append_lines(data_dir, "dc1.app", "second", chunks=5)
    config = LoadConfig(SourceSpec(data_dir=str(data_dir)), table, max_range_bytes=2000)
    run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]

    assert_exactly_once(table_lines(spark, table), expected)


@pytest.mark.parametrize(
    ("point", "visible_after_kill"), [("after-commit", "none"), ("mid-publish", "some")]
)
def test_sigkilled_parquet_load_rerun_loads_every_line_exactly_once(
    spark: object, tmp_path: Path, point: str, visible_after_kill: str
) -> None:
    data_dir, warehouse = tmp_path / "data", tmp_path / "warehouse"
    expected = append_lines(data_dir, "dc1.app", "first")

    _crashed_load(tmp_path, data_dir, warehouse, point, "parquet")

    # Readers that glob the tables never see a file of an uncommitted batch.
    seen = published_lines(warehouse)
    # The batch's files, or some of them, are still in its attempts' staging directories.
    assert list((warehouse / "_loader" / "staging").rglob("*.parquet"))
    if visible_after_kill == "none":
        assert seen == []
    else:
        assert 0 < len(seen) < len(expected)
        assert set(seen) <= set(expected)
        assert spark.read.parquet(str(warehouse)).count() == len(seen)  # type: ignore[attr-defined]
    assert Warehouse(warehouse).latest_commit() is not None

    expected += append_lines(data_dir, "dc1.app", "second", chunks=5)
    config = LoadConfig(
        SourceSpec(data_dir=str(data_dir)),
        warehouse,
        max_range_bytes=2000,
        table_format="parquet",
    )
    report = run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]

    assert_exactly_once(published_lines(warehouse), expected)
    assert report.recovery.published_files > 0
    assert not list((warehouse / "_loader" / "staging").iterdir())


def test_sigterm_lets_the_batch_in_hand_commit_then_stops(spark: object, tmp_path: Path) -> None:
    # The stop is the job's, the same for both formats; the Parquet warehouse starts faster.
    data_dir, table = tmp_path / "data", tmp_path / "warehouse"
    expected = append_lines(data_dir, "dc1.app", "t", chunks=40)
    child = ChildProcess(
        [
            "-m",
            "ops",
            "load",
            "--data-dir",
            str(data_dir),
            "--warehouse",
            str(table),
            "--table-format",
            "parquet",
            "--master",
            "local[2]",
            "--max-range-mb",
            "0.001",
            "--max-batch-mb",
            "0.0001",
            "--format",
            "json",
        ],
        tmp_path / "load.log",
    )
    try:
        child.wait_for_output("logbroker load: batch 1:", timeout_s=420)
        child.proc.send_signal(signal.SIGTERM)  # the driver only, as systemd's KillMode=mixed
        code = child.wait(120)
    finally:
        child.kill()

    output = child.output()
    assert code == 0, output[-3000:]
    report, _ = json.JSONDecoder().raw_decode(output, output.index('{\n "batches"'))
    assert report["stopped"] is True
    committed = Warehouse(table).commits()
    assert 1 <= len(committed) == len(report["batches"])
    loaded = published_lines(table)
    assert 0 < len(loaded) < len(expected)
    assert_exactly_once(loaded, [line for line in expected if line in set(loaded)])

    config = LoadConfig(
        SourceSpec(data_dir=str(data_dir)), table, max_range_bytes=4000, table_format="parquet"
    )
    run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]
    assert_exactly_once(published_lines(table), expected)
