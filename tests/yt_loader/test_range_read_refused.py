"""A range read that the log's source refuses as out of range, for an offset the source says
it holds, is asked again; the load is never told that the log was truncated for it.

Seen on Kafka right after a topic was deleted and made again: a gateway answered 416 "offset 0
is outside 0..200" (a stale consumer), and the loader failed with "partition 0 ends at offset
200, below the planned end 200: the log was replaced or truncated".  The source here is a real
embedded store whose reads are refused at first as that gateway refused them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store.errors import OffsetOutOfRange
from tests.yt_loader.conftest import append_lines
from yt_loader import range_reader
from yt_loader.errors import SourceUnavailable, WarehouseCorrupt
from yt_loader.log_source import MessageBatch, SourceSpec
from yt_loader.offset_ranges import OffsetRange
from yt_loader.range_reader import read_range


class _Refusing:
    """A log source whose first ``times`` reads are refused as out of range, as a gateway
    answered them: with the log's bounds ``start..end`` in the answer."""

    def __init__(self, data_dir: Path, times: int, start: int, end: int) -> None:
        self._source = SourceSpec(data_dir=str(data_dir)).open()
        self.left, self.start, self.end = times, start, end
        self.reads = 0

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> MessageBatch:
        self.reads += 1
        if self.left > 0:
            self.left -= 1
            raise OffsetOutOfRange(
                f"{topic}/{partition}: offset {offset} is outside the log", self.start, self.end
            )
        return self._source.read(topic, partition, offset, max_bytes)

    def close(self) -> None:
        self._source.close()


def _lines(source: _Refusing, rng: OffsetRange) -> list[str]:
    return [
        line
        for batch in read_range(source, rng)  # type: ignore[arg-type]
        for line in batch.column("line").to_pylist()
    ]


@pytest.fixture(autouse=True)
def _no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(range_reader, "_REFUSED_PAUSE_S", 0.0, raising=False)


def test_an_offset_refused_inside_the_log_is_read_again(tmp_path: Path) -> None:
    written = append_lines(tmp_path, "dc1.app", "a", partitions=1, chunks=4)
    source = _Refusing(tmp_path, times=2, start=0, end=4)
    try:
        assert _lines(source, OffsetRange("dc1.app", 0, 0, 4)) == written
    finally:
        source.close()
    assert source.reads == 3


def test_refused_on_every_try_the_failure_says_what_happened(tmp_path: Path) -> None:
    append_lines(tmp_path, "dc1.app", "a", partitions=1, chunks=4)
    source = _Refusing(tmp_path, times=100, start=0, end=4)
    try:
        with pytest.raises(SourceUnavailable) as caught:
            _lines(source, OffsetRange("dc1.app", 0, 0, 4))
    finally:
        source.close()
    message = str(caught.value)
    assert "offset 0 is out of range, yet it says the partition holds 0..4" in message
    assert "truncated" not in message and "below the planned end" not in message
    assert source.reads == range_reader._REFUSED_TRIES + 1


def test_a_partition_that_now_ends_below_the_range_is_still_called_truncated(
    tmp_path: Path,
) -> None:
    append_lines(tmp_path, "dc1.app", "a", partitions=1, chunks=4)
    source = _Refusing(tmp_path, times=1, start=0, end=2)
    try:
        with pytest.raises(WarehouseCorrupt, match="ends at offset 2, below the planned end 4"):
            _lines(source, OffsetRange("dc1.app", 0, 0, 4))
    finally:
        source.close()
    assert source.reads == 1
