"""A batch that fails its checksum, read through the embedded store: refused on every read,
with the records before it served first, and named by topic, partition and offset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from log_store import TopicConfig, open_store
from log_store.errors import CorruptData, StoreUnavailable
from log_store.sqlite_partition import PartitionLog


def _flip(segment: Path, at: int) -> None:
    data = bytearray(segment.read_bytes())
    data[at] ^= 0xFF
    segment.write_bytes(bytes(data))


def test_records_before_a_damaged_batch_are_served_then_every_read_of_it_fails(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "data")
    store.create_topic("dc1.t", TopicConfig(partitions=2))
    for n in range(3):  # batches of offsets 0-2, 3-5, 6-8
        store.append("dc1.t", 0, [bytes([n]) * 1000] * 3)
    store.append("dc1.t", 1, [b"healthy"])
    assert len(store.read("dc1.t", 0, 0, 10**6).records) == 9  # read (and found whole) once
    segment = min((tmp_path / "data" / "topics").rglob("*.log"))
    _flip(segment, segment.stat().st_size // 2)  # in the batch of offsets 3-5

    got = store.read("dc1.t", 0, 0, 10**6).records
    assert [r.offset for r in got] == [0, 1, 2]
    for offset in (3, 4, 5):
        with pytest.raises(CorruptData) as caught:
            store.read("dc1.t", 0, offset, 10**6)
        error = caught.value
        assert not isinstance(error, StoreUnavailable)  # retrying does not mend it
        assert (error.topic, error.partition, error.offset) == ("dc1.t", 0, 3)
        assert "dc1.t/0 offset 3" in str(error) and "checksum" in str(error)
    assert [r.offset for r in store.read("dc1.t", 0, 6, 10**6).records] == [6, 7, 8]
    assert store.read("dc1.t", 1, 0, 10**6).records[0].value == b"healthy"
    store.close()


def test_a_read_of_part_of_a_batch_read_lately_checks_the_bytes_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Part of a batch read lately is read alone (not the whole batch again), and checked
    against the batch's CRC marks: a byte flipped there since is refused all the same."""
    marked: list[int] = []
    real = PartitionLog._read_marked

    def spy(self: PartitionLog, row: tuple[int, int, int, int], *args: Any) -> Any:
        marked.append(row[0])
        return real(self, row, *args)

    monkeypatch.setattr(PartitionLog, "_read_marked", spy)
    store = open_store(tmp_path / "data")
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    values = [b"%06d" % i * 33 for i in range(10_000)]  # 200 B each, one 2 MB batch
    store.append("dc1.t", 0, values)
    half = 1_000_000
    first = store.read("dc1.t", 0, 0, half).records  # the whole batch checked, marks kept
    assert [r.value for r in first] == values[: len(first)] and len(first) < len(values)
    second = store.read("dc1.t", 0, len(first), half).records
    assert marked == [0]  # read from its marks
    assert [r.value for r in second] == values[len(first) : len(first) + len(second)]

    (segment,) = (tmp_path / "data" / "topics").rglob("*.log")
    _flip(segment, segment.stat().st_size - 1000)  # in the last records
    with pytest.raises(CorruptData, match="checksum"):
        store.read("dc1.t", 0, len(values) - 2, 1)
    assert len(marked) == 2  # refused on the marked path, not by a whole read
    store.close()
