"""The ``logbroker`` Spark source reads each planned range from the topic it was planned in.

Reads go by topic name; a topic deleted and created again between the plan and a task's read
would give the new topic's records at the old one's offsets.  Each range carries the planned
topic's identity and the task checks it after reading, so such a task fails (Spark keeps none
of its rows) instead of returning another topic's lines under the old offsets.

The source's planning and its tasks are plain Python (Spark calls them on the driver and the
executors), so these tests call them directly, without a Spark session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store import open_store
from log_store.errors import TopicDeleted
from tests.yt_loader.conftest import append_lines
from yt_loader.data_source import (
    TOPIC_ID_KEY,
    LogbrokerBatchReader,
    LogbrokerStreamReader,
    RangePartition,
    ReaderOptions,
)
from yt_loader.log_source import SourceSpec


def _lines(partition: RangePartition, options: ReaderOptions) -> list[str]:
    reader = LogbrokerBatchReader(options)
    return [line for batch in reader.read(partition) for line in batch.column("line").to_pylist()]


def _remake(data_dir: Path, topic: str) -> None:
    """Delete ``topic`` and write to a topic of the same name again (a new identity)."""
    with open_store(data_dir) as store:
        store.delete_topic(topic)
    append_lines(data_dir, topic, "new", partitions=1, chunks=8)


def test_a_batch_reads_range_fails_when_its_topic_was_made_again_since_the_plan(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    old = append_lines(data_dir, "dc1.app", "old", partitions=1, chunks=8)
    options = ReaderOptions(SourceSpec(data_dir=str(data_dir)), topics="dc1.*")
    planned = LogbrokerBatchReader(options).partitions()
    assert all(isinstance(p, RangePartition) and p.topic_id for p in planned)
    ranges = [p for p in planned if isinstance(p, RangePartition)]
    assert sorted(line for p in ranges for line in _lines(p, options)) == sorted(old)

    _remake(data_dir, "dc1.app")
    for partition in ranges:
        with pytest.raises(TopicDeleted, match="deleted and created again"):
            _lines(partition, options)


def test_a_stream_range_planned_in_the_old_topic_is_not_read_from_the_new_one(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    append_lines(data_dir, "dc1.app", "old", partitions=1, chunks=4)
    options = ReaderOptions(SourceSpec(data_dir=str(data_dir)), topics="dc1.*")
    stream = LogbrokerStreamReader(options)
    start = stream.initialOffset()
    end = stream.latestOffset(start, None)  # type: ignore[arg-type]
    planned = [p for p in stream.partitions(start, end) if isinstance(p, RangePartition)]
    assert planned and {p.topic_id for p in planned} == {end["dc1.app"][TOPIC_ID_KEY]}

    _remake(data_dir, "dc1.app")  # the new topic has offsets 0..7: the old range exists in it
    for partition in planned:
        with pytest.raises(TopicDeleted):
            _lines(partition, options)


def test_a_range_of_a_position_without_identity_is_read_as_before(tmp_path: Path) -> None:
    """A checkpoint written before positions carried the topic's identity plans ranges
    without it: they are read by name, as they always were."""
    data_dir = tmp_path / "data"
    old = append_lines(data_dir, "dc1.app", "old", partitions=1, chunks=4)
    options = ReaderOptions(SourceSpec(data_dir=str(data_dir)), topics="dc1.*")
    stream = LogbrokerStreamReader(options)
    end = {"dc1.app": {"0": 4}}
    planned = [p for p in stream.partitions({}, end) if isinstance(p, RangePartition)]
    assert [p.topic_id for p in planned] == [None] * len(planned)
    assert sorted(line for p in planned for line in _lines(p, options)) == sorted(old)
