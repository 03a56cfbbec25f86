"""Loaders read the live store read-only: its files, directories and notify files stay the
gateway's alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store import NoStore, ReadOnlyStore, open_store
from log_store.interface import TopicConfig
from tests.yt_loader.conftest import append_lines, assert_exactly_once, table_lines
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import SourceSpec

pytestmark = [pytest.mark.spark, pytest.mark.slow]

_SQLITE_READER_FILES = ("-wal", "-shm")
"""SQLite's write-ahead log and shared-memory index, which a ``mode=ro`` reader of a WAL
database may create next to it when no writer has them open; they hold no data of their own."""


def _state(data_dir: Path) -> dict[str, tuple[int, int] | None]:
    """Every file under ``data_dir`` with its modification time and size, and every directory
    (whose own time changes when SQLite adds its reader files)."""
    return {
        str(path.relative_to(data_dir)): (
            None if path.is_dir() else (path.stat().st_mtime_ns, path.stat().st_size)
        )
        for path in data_dir.rglob("*")
        if not path.name.endswith(_SQLITE_READER_FILES)
    }


def test_loading_and_reading_a_live_store_create_or_change_nothing_in_it(
    spark: object, tmp_path: Path, start_gateway: object
) -> None:
    data_dir, table = tmp_path / "data", tmp_path / "table"
    start_gateway(data_dir)  # type: ignore[operator]
    expected = append_lines(data_dir, "dc1.app", "a", partitions=2)
    with open_store(data_dir) as store:
        # Partitions no process has opened yet have no directory: readers must not make one.
        store.create_topic("dc1.fresh", TopicConfig(partitions=2))
    before = _state(data_dir)

    config = LoadConfig(SourceSpec(data_dir=str(data_dir)), table, max_range_bytes=2000)
    run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]
    rows = spark.read.format("logbroker").option("data_dir", str(data_dir)).load().count()  # type: ignore[attr-defined]

    assert _state(data_dir) == before
    assert not (data_dir / "topics" / "dc1.fresh").exists()
    assert rows == len(expected)
    assert_exactly_once(table_lines(spark, table), expected)


def test_a_read_only_store_handle_refuses_writes_and_never_creates_a_store(
    tmp_path: Path,
) -> None:
    append_lines(tmp_path / "data", "dc1.app", "a", partitions=1, chunks=1)
    with open_store(tmp_path / "data", read_only=True) as store:
        assert store.end_offset("dc1.app", 0) == 1
        with pytest.raises(ReadOnlyStore, match="open read-only"):
            store.append("dc1.app", 0, [b"x"])
        with pytest.raises(ReadOnlyStore, match="open read-only"):
            store.create_topic("dc1.other")
    with pytest.raises(NoStore, match="no data directory"):
        open_store(tmp_path / "elsewhere", read_only=True)
    assert not (tmp_path / "elsewhere").exists()
