"""A batch that fails its checksum, read through the embedded store: refused on every read,
with the records before it served first, and named by topic, partition and offset."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store import TopicConfig, open_store
from log_store.errors import CorruptData, StoreUnavailable


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
