"""A topic deleted while another process writes it: no append into it is acked afterwards.

A writer asks the catalog whether its topic lives once per connection to a partition, then
trusts the deletion mark that ``delete_topic`` sets in every partition before it removes the
topic from the catalog.  These tests cover the marks the deleter could miss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from log_store import open_store
from log_store.errors import UnknownTopic
from log_store.interface import TopicConfig
from log_store.partition_handles import PartitionHandles
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


def test_a_write_submitted_while_its_own_process_deletes_the_topic_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway deleting a topic (``DELETE /v1/topics/{topic}``) takes the topic's partitions
    out of its open set, also those a write of the same process holds: that write is refused
    as for a deleted topic (503 to a client, retried), never an internal error."""
    store = open_store(tmp_path)
    try:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        store.append("dc1.t", 0, [b"before"])
        acquire = PartitionHandles.acquire
        calls: list[Any] = []

        def delete_between_lease_and_submit(
            handles: PartitionHandles, key: Any, opener: Any
        ) -> Any:
            calls.append(key)
            if len(calls) == 2:
                # the write holds the partition's lease (the first call) and now marks it
                # in use until its transaction is resolved: the deletion lands in between
                store.delete_topic("dc1.t")
            return acquire(handles, key, opener)

        monkeypatch.setattr(PartitionHandles, "acquire", delete_between_lease_and_submit)
        with pytest.raises(UnknownTopic):
            store.submit("dc1.t", 0, lambda _state: [b"during the delete"]).result(10)
        assert len(calls) >= 2
        monkeypatch.undo()
        with pytest.raises(UnknownTopic):
            store.append("dc1.t", 0, [b"after the delete"])
    finally:
        store.close()
