"""A topic deleted while another process writes it: no append into it is acked afterwards.

A writer asks the catalog whether its topic lives once per connection to a partition, then
trusts the deletion mark that ``delete_topic`` sets in every partition before it removes the
topic from the catalog.  These tests cover the marks the deleter could miss.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store import open_store
from log_store.errors import UnknownTopic
from log_store.interface import TopicConfig
from log_store.sqlite_partition import PartitionLog


def test_partition_added_while_the_topic_is_deleted_is_fenced_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, deleter, operator = (open_store(tmp_path) for _ in range(3))
    try:
        writer.create_topic("dc1.t", TopicConfig(partitions=1))
        mark_deleted = PartitionLog.mark_deleted
        grown: list[int] = []

        def mark_then_grow(log: PartitionLog) -> None:
            mark_deleted(log)
            if not grown:
                # The deleter has read the partition count; now the topic gains one, and a
                # writer commits into it (and so finds the topic in the catalog) before the
                # deleter removes the topic.
                grown.append(operator.set_partitions("dc1.t", 2).config.partitions)
                assert writer.append("dc1.t", 1, [b"in time"]).first_offset == 0

        monkeypatch.setattr(PartitionLog, "mark_deleted", mark_then_grow)
        deleter.delete_topic("dc1.t")
        assert grown == [2]
        with pytest.raises(UnknownTopic):
            writer.append("dc1.t", 1, [b"after the delete"])
        with pytest.raises(UnknownTopic):
            writer.append("dc1.t", 0, [b"after the delete"])
        assert not list((tmp_path / "topics").rglob("partition.db"))
    finally:
        for store in (writer, deleter, operator):
            store.close()


def test_writer_that_checked_the_topic_long_ago_sees_a_later_delete(tmp_path: Path) -> None:
    writer, deleter = open_store(tmp_path), open_store(tmp_path)
    try:
        writer.create_topic("dc1.t", TopicConfig(partitions=1))
        for i in range(5):
            writer.append("dc1.t", 0, [b"%d" % i])
        deleter.delete_topic("dc1.t")
        with pytest.raises(UnknownTopic):
            writer.append("dc1.t", 0, [b"after the delete"])
        with pytest.raises(UnknownTopic):
            writer.submit("dc1.t", 0, lambda _state: [b"queued after the delete"]).result(10)
    finally:
        writer.close()
        deleter.close()
