"""``spark.read.format("logbroker")``: rows, codecs, globs, splitting, legacy transactions."""

from __future__ import annotations

from pathlib import Path

import pytest

from delivery.legacy_txn import StagedData, write_commit, write_data
from log_store import open_store
from log_store.interface import TopicConfig
from session_dedup.envelope import Envelope, encode
from tests.yt_loader.conftest import append_lines, assert_exactly_once

pytestmark = [pytest.mark.spark, pytest.mark.slow]

COLUMNS = [
    "topic",
    "partition",
    "offset",
    "source_id",
    "seqno",
    "server",
    "file",
    "log_type",
    "create_time",
    "write_time",
    "line",
]


def _read(spark: object, **options: str) -> object:
    reader = spark.read.format("logbroker")  # type: ignore[attr-defined]
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_batch_read_gives_one_row_per_line_with_the_envelope_fields(
    spark: object, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    expected = append_lines(data_dir, "dc1.raw", "x", codec="raw", partitions=2, chunks=4)
    expected += append_lines(data_dir, "dc1.gz", "x", codec="gzip", partitions=1, chunks=4)
    expected += append_lines(data_dir, "dc1.zs", "x", codec="zstd", partitions=1, chunks=4)

    df = _read(spark, data_dir=str(data_dir))
    rows = df.collect()  # type: ignore[attr-defined]

    assert df.columns == COLUMNS  # type: ignore[attr-defined]
    assert_exactly_once([r["line"] for r in rows], expected)
    first = next(r for r in rows if r["line"] == "x dc1.raw p1 c2 l0")
    assert (first["topic"], first["partition"], first["offset"], first["seqno"]) == (
        "dc1.raw",
        1,
        2,
        3,
    )
    assert first["server"] == "host1" and first["file"] == "/var/log/dc1.raw.log"
    assert first["source_id"] == "host1:/var/log/dc1.raw.log" and first["log_type"] == "raw"
    assert first["write_time"] < first["create_time"]  # c2 was written two hours "earlier"


def test_topics_option_takes_comma_separated_globs(spark: object, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    wanted = append_lines(data_dir, "dc1.nginx", "g", partitions=1, chunks=2)
    wanted += append_lines(data_dir, "dc2.nginx", "g", partitions=1, chunks=2)
    append_lines(data_dir, "dc1.api", "g", partitions=1, chunks=2)

    df = _read(spark, data_dir=str(data_dir), topics="*.nginx, dc9.*")

    assert_exactly_once([r["line"] for r in df.collect()], wanted)  # type: ignore[attr-defined]


def test_large_partitions_are_read_as_several_spark_partitions(
    spark: object, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    expected = append_lines(data_dir, "dc1.big", "s", partitions=2, chunks=60)

    whole = _read(spark, data_dir=str(data_dir))
    split = _read(spark, data_dir=str(data_dir), max_range_bytes="1500")

    assert whole.rdd.getNumPartitions() == 2  # type: ignore[attr-defined]
    assert split.rdd.getNumPartitions() > 6  # type: ignore[attr-defined]
    assert_exactly_once([r["line"] for r in split.collect()], expected)  # type: ignore[attr-defined]


def test_legacy_transactions_give_their_lines_only_once_committed(
    spark: object, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    store = open_store(data_dir)
    try:
        store.create_topic("dc1.legacy", TopicConfig(partitions=1))
        for txn_id, committed in (("t-committed", True), ("t-never-committed", False)):
            staged = StagedData(
                store_id="0" * 32,
                log_type="legacy",
                server="old-host",
                file="/var/log/old.log",
                data=f"{txn_id} line 1\n{txn_id} line 2\n".encode(),
            )
            written = write_data(store, "dc1.legacy", 1, txn_id, staged)
            if committed:
                write_commit(store, "dc1.legacy", written.partition, txn_id, "old-host")
    finally:
        store.close()

    rows = _read(spark, data_dir=str(data_dir)).collect()  # type: ignore[attr-defined]

    assert sorted(r["line"] for r in rows) == ["t-committed line 1", "t-committed line 2"]
    # Offsets: 0 the committed data, 1 its marker, 2 the other data.  Lines come at the marker.
    assert {r["offset"] for r in rows} == {1}


def test_reading_through_a_gateway_gives_the_same_rows_as_the_store(
    spark: object, tmp_path: Path, start_gateway: object
) -> None:
    data_dir = tmp_path / "data"
    gateway = start_gateway(data_dir)  # type: ignore[operator]
    append_lines(data_dir, "dc1.app", "h", codec="zstd", partitions=2, chunks=10)

    via_http = _read(spark, server=gateway.url, max_range_bytes="2000")
    via_store = _read(spark, data_dir=str(data_dir))

    http_rows = sorted(tuple(r) for r in via_http.collect())  # type: ignore[attr-defined]
    store_rows = sorted(tuple(r) for r in via_store.collect())  # type: ignore[attr-defined]
    assert http_rows == store_rows
    assert len(http_rows) == 2 * 10 * 3


def test_no_matching_topic_reads_as_an_empty_frame(spark: object, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    append_lines(data_dir, "dc1.app", "e", partitions=1, chunks=1)

    df = _read(spark, data_dir=str(data_dir), topics="dc7.*")

    assert df.count() == 0  # type: ignore[attr-defined]
    assert df.columns == COLUMNS  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({}, "give exactly one of data_dir"),
        ({"data_dir": "/tmp", "server": "http://x"}, "give exactly one of data_dir"),
        ({"server": "ftp://gw"}, "server must be an http"),
        ({"data_dir": "/nonexistent/dir"}, "is not a logbroker data directory"),
        ({"data_dir": "/tmp", "max_range_bytes": "lots"}, "max_range_bytes must be an integer"),
        ({"data_dir": "/tmp", "startingOffsets": "latest"}, "has no option 'startingoffsets'"),
        ({"data_dir": "/tmp", "failOnDataLoss": "false"}, "has no option 'failondataloss'"),
    ],
)
def test_bad_options_fail_with_a_clear_reason(
    spark: object, options: dict[str, str], reason: str
) -> None:
    with pytest.raises(Exception, match=reason):
        _read(spark, **options).collect()  # type: ignore[attr-defined]


def test_a_message_that_does_not_decompress_fails_the_read_unless_skip_corrupt(
    spark: object, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    expected = append_lines(data_dir, "dc1.app", "x", partitions=1, chunks=3)
    with open_store(data_dir) as store:
        bad = Envelope("s", "h", "/f", "app", "zstd", 9, 0, 0, b"notzstd")
        store.append("dc1.app", 0, [encode(bad)])
    with pytest.raises(Exception, match=r"dc1\.app/0 offset 3: zstd chunk does not decompress"):
        _read(spark, data_dir=str(data_dir)).collect()  # type: ignore[attr-defined]
    rows = _read(spark, data_dir=str(data_dir), skip_corrupt="true").collect()  # type: ignore[attr-defined]
    assert_exactly_once([r["line"] for r in rows], expected)
