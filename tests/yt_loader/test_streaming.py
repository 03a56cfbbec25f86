"""``spark.readStream.format("logbroker")`` with a checkpoint: SIGKILL, restart, no duplicates."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from log_store import open_store
from log_store.interface import TopicConfig
from tests.yt_loader.conftest import ChildProcess, append_lines, assert_exactly_once

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.fault]

STREAM_JOB = """
import sys
from yt_loader.spark_session import build_session

data_dir, checkpoint, out = sys.argv[1:4]
spark = build_session("local[2]", app_name="logbroker stream test")
query = (
    spark.readStream.format("logbroker")
    .option("data_dir", data_dir)
    .option("topics", "dc1.*")
    .option("max_range_bytes", "3000")
    .load()
    .writeStream.format("parquet")
    .option("checkpointLocation", checkpoint)
    .option("path", out)
    .trigger(processingTime="200 milliseconds")
    .start()
)
print("stream started", flush=True)
query.awaitTermination()
"""


def _stream(spark: object, data_dir: Path, checkpoint: Path, out: Path, **options: str) -> object:
    reader = spark.readStream.format("logbroker").option("data_dir", str(data_dir))  # type: ignore[attr-defined]
    for name, value in options.items():
        reader = reader.option(name, value)
    return (
        reader.load()
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .option("path", str(out))
        .trigger(availableNow=True)
        .start()
    )


def test_streaming_query_killed_and_restarted_from_its_checkpoint_adds_no_duplicates(
    spark: object, tmp_path: Path
) -> None:
    data_dir, checkpoint, out = tmp_path / "data", tmp_path / "checkpoint", tmp_path / "out"
    expected = append_lines(data_dir, "dc1.app", "before")
    child = ChildProcess(
        ["-c", STREAM_JOB, str(data_dir), str(checkpoint), str(out)], tmp_path / "stream.log"
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "_spark_metadata" / "0").exists():
            assert time.monotonic() < deadline, child.output()[-3000:]
            assert child.proc.poll() is None, child.output()[-3000:]
            time.sleep(0.1)
        for round_no in range(4):  # new data while batches run, so the kill lands mid-stream
            expected += append_lines(data_dir, "dc1.app", f"during{round_no}", chunks=5)
            time.sleep(0.4)
    finally:
        child.kill()
    committed_batches = len(list((out / "_spark_metadata").iterdir()))
    assert committed_batches >= 1
    expected += append_lines(data_dir, "dc1.app", "after", chunks=5)
    expected += append_lines(data_dir, "dc1.new", "after", partitions=1, chunks=5)

    query = _stream(spark, data_dir, checkpoint, out, topics="dc1.*")
    query.awaitTermination(120)  # type: ignore[attr-defined]

    lines = [r["line"] for r in spark.read.parquet(str(out)).select("line").collect()]  # type: ignore[attr-defined]
    assert_exactly_once(lines, expected)


def test_streaming_read_of_offsets_lost_to_retention_fails_unless_allowed(
    spark: object, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    config = TopicConfig(partitions=1, segment_bytes=4096)
    append_lines(data_dir, "dc1.app", "read", partitions=1, chunks=20, config=config)
    query = _stream(spark, data_dir, tmp_path / "ck", tmp_path / "out", starting_offsets="earliest")
    query.awaitTermination(120)  # type: ignore[attr-defined]
    store = open_store(data_dir)
    try:
        # The query has read everything; new data is then written and lost before it is read.
        for round_no in range(6):  # segments roll between appends
            append_lines(data_dir, "dc1.app", f"lost{round_no}", partitions=1, chunks=20)
        kept = append_lines(data_dir, "dc1.app", "kept", partitions=1, chunks=2)
        store.delete_segments_before("dc1.app", 0, store.end_offset("dc1.app", 0) - 2)
    finally:
        store.close()

    failing = _stream(spark, data_dir, tmp_path / "ck", tmp_path / "out")
    with pytest.raises(Exception, match="dropped by retention before they were read"):
        failing.awaitTermination(120)  # type: ignore[attr-defined]

    tolerant = _stream(
        spark, data_dir, tmp_path / "ck", tmp_path / "out", fail_on_data_loss="false"
    )
    tolerant.awaitTermination(120)  # type: ignore[attr-defined]
    lines = [r["line"] for r in spark.read.parquet(str(tmp_path / "out")).collect()]  # type: ignore[attr-defined]
    assert set(kept) <= set(lines)
    lost_and_found = [line for line in lines if line.startswith("lost")]
    assert len(lost_and_found) < 6 * 20 * 3
