"""One damaged partition of the embedded store (it lost acknowledged data) is kept as it is and
left out, while the store goes on with the topic's other partitions; an opening refused for its
damage keeps none of its files open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from log_store import TopicConfig, open_store, sqlite_partition
from log_store.errors import PartitionDamaged
from log_store.sqlite_partition import PartitionLog


def test_retention_goes_on_with_the_other_partitions_of_a_damaged_ones_topic(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    config = TopicConfig(partitions=2, segment_bytes=4096, retention_bytes=4096)
    with open_store(data_dir) as store:
        store.create_topic("dc1.t", config)
        for _ in range(12):
            for p in range(2):
                store.append("dc1.t", p, [b"x" * 1000])
    (topic_dir,) = (data_dir / "topics" / "dc1.t").iterdir()
    damaged = sorted((topic_dir / "0").glob("*.log"))
    os.truncate(damaged[-1], damaged[-1].stat().st_size - 5)
    with open_store(data_dir) as store:
        moved = store.apply_retention()
        assert list(moved) == [("dc1.t", 1)] and moved[("dc1.t", 1)] > 0
        assert sorted((topic_dir / "0").glob("*.log")) == damaged  # left for the operator
        (named,) = store.damaged_partitions()
        assert named == ("dc1.t", 0)


def test_an_opening_refused_as_damaged_leaves_no_file_open(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        store.append("dc1.t", 0, [b"x" * 100])
    (topic_dir,) = (data_dir / "topics" / "dc1.t").iterdir()
    (segment,) = (topic_dir / "0").glob("*.log")
    os.truncate(segment, segment.stat().st_size - 5)
    before = len(os.listdir("/proc/self/fd"))
    for read_only in (False, True):  # a gateway's recovery; a loader's or the audit's check
        for _ in range(20):
            with pytest.raises(PartitionDamaged, match="acknowledged data is missing"):
                PartitionLog(
                    topic_dir / "0",
                    4096,
                    lambda: True,
                    read_only=read_only,
                    place=("dc1.t", 0),
                    check_tail=True,
                )
    # each refusal used to keep partition.db (and its -wal when writable) open
    assert len(os.listdir("/proc/self/fd")) - before <= 2


def test_a_reader_opening_a_partition_as_its_first_write_makes_it_does_not_call_it_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen under load: a test reading a gateway's store read-only met a partition whose
    # first write made it between the reader's two looks, and was refused "its index
    # (partition.db) is gone while its segment files hold data".
    directory = tmp_path / "dc1.t" / "0"
    directory.mkdir(parents=True)
    real = sqlite_partition.has_segment_files
    made: list[PartitionLog] = []
    making = [False]

    def the_writer_makes_it_meanwhile(where: Path) -> bool:
        if not making[0]:
            making[0] = True
            writer = PartitionLog(directory, 4096, lambda: True, place=("dc1.t", 0))
            writer.commit_here(lambda _state: [b"first"])
            made.append(writer)
        return real(where)

    monkeypatch.setattr(sqlite_partition, "has_segment_files", the_writer_makes_it_meanwhile)
    reader = PartitionLog(
        directory, 4096, lambda: True, read_only=True, place=("dc1.t", 0), check_tail=True
    )
    try:
        assert [r.value for r in reader.read(0, 65536).records] == [b"first"]
    finally:
        reader.close()
        made[0].close()
