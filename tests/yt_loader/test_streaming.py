"""``spark.readStream.format("logbroker")`` with a checkpoint: SIGKILL, restart, no duplicates."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from log_store import open_store
from log_store.interface import TopicConfig
from tests.yt_loader.conftest import ChildProcess, append_lines, assert_exactly_once, table_lines
from yt_loader.delta_table import with_table_columns

# Real JVMs started and killed: generous on a loaded 2-core machine.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.fault, pytest.mark.timeout(600)]

STREAM_JOB = """
import sys
from yt_loader.delta_table import with_table_columns
from yt_loader.spark_session import build_session

data_dir, checkpoint, table = sys.argv[1:4]
spark = build_session("local[2]", app_name="logbroker stream test")
stream = (
    spark.readStream.format("logbroker")
    .option("data_dir", data_dir)
    .option("topics", "dc1.*")
    .option("max_range_bytes", "3000")
    .load()
)
query = (
    with_table_columns(stream)
    .writeStream.format("delta")
    .partitionBy("topic", "date", "hour")
    .option("checkpointLocation", checkpoint)
    .trigger(processingTime="200 milliseconds")
    .start(table)
)
print("stream started", flush=True)
query.awaitTermination()
"""


def _stream(
    spark: object,
    data_dir: Path,
    checkpoint: Path,
    out: Path,
    sink: str = "parquet",
    **options: str,
) -> object:
    reader = spark.readStream.format("logbroker").option("data_dir", str(data_dir))  # type: ignore[attr-defined]
    for name, value in options.items():
        reader = reader.option(name, value)
    frame = reader.load()
    if sink == "delta":
        frame = with_table_columns(frame).writeStream.partitionBy("topic", "date", "hour")
    else:
        frame = frame.writeStream
    return (
        frame.format(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )


def _delta_versions(table: Path) -> int:
    return len(list((table / "_delta_log").glob("*.json")))


def _wait_for_versions(table: Path, count: int, child: ChildProcess) -> None:
    deadline = time.monotonic() + 180
    while _delta_versions(table) < count:
        assert time.monotonic() < deadline, child.output()[-3000:]
        assert child.proc.poll() is None, child.output()[-3000:]
        time.sleep(0.05)


def test_stream_into_delta_killed_and_restarted_from_its_checkpoint_is_exactly_once(
    spark: object, tmp_path: Path
) -> None:
    data_dir, checkpoint, table = tmp_path / "data", tmp_path / "checkpoint", tmp_path / "table"
    expected = append_lines(data_dir, "dc1.app", "before")
    child = ChildProcess(
        ["-c", STREAM_JOB, str(data_dir), str(checkpoint), str(table)], tmp_path / "stream.log"
    )
    try:
        _wait_for_versions(table, 1, child)
        for round_no in range(2):  # each round's data lands in a micro-batch of its own
            expected += append_lines(data_dir, "dc1.app", f"during{round_no}", chunks=5)
            _wait_for_versions(table, 2 + round_no, child)
        # New data, and the kill, while the query plans or writes its next micro-batch.
        expected += append_lines(data_dir, "dc1.app", "at-kill", chunks=5)
    finally:
        child.kill()
    assert _delta_versions(table) >= 3
    expected += append_lines(data_dir, "dc1.app", "after", chunks=5)
    expected += append_lines(data_dir, "dc1.new", "after", partitions=1, chunks=5)

    query = _stream(spark, data_dir, checkpoint, table, sink="delta", topics="dc1.*")
    query.awaitTermination(180)  # type: ignore[attr-defined]

    assert_exactly_once(table_lines(spark, table), expected)


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


def test_a_topic_deleted_and_created_again_is_not_read_from_the_old_topics_offsets(
    spark: object, tmp_path: Path
) -> None:
    data_dir, checkpoint, out = tmp_path / "data", tmp_path / "ck", tmp_path / "out"
    expected = append_lines(data_dir, "dc1.app", "old", partitions=1, chunks=4)
    _stream(spark, data_dir, checkpoint, out).awaitTermination(120)  # type: ignore[attr-defined]
    store = open_store(data_dir)
    try:
        store.delete_topic("dc1.app")
    finally:
        store.close()
    # The new topic grows past the old one's offsets: they must not hide its first messages.
    expected += append_lines(data_dir, "dc1.app", "new", partitions=1, chunks=8)

    failing = _stream(spark, data_dir, checkpoint, out)
    with pytest.raises(Exception, match="was deleted and created again"):
        failing.awaitTermination(120)  # type: ignore[attr-defined]

    tolerant = _stream(spark, data_dir, checkpoint, out, fail_on_data_loss="false")
    tolerant.awaitTermination(120)  # type: ignore[attr-defined]
    lines = [r["line"] for r in spark.read.parquet(str(out)).collect()]  # type: ignore[attr-defined]
    assert_exactly_once(lines, expected)
