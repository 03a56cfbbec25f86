"""A topic deleted while an append or a read of it is in flight, in this process or another.

The deletion removes the topic's files under whoever uses them: SQLite then says "disk I/O
error" or "unable to open database file", the OS ENOENT.  None of those is the disk's fault,
so none may reach a caller as one (a 503 naming SQLite, a 500): the store says the topic was
deleted (:class:`TopicDeleted`, an ``UnknownTopic``), forgets what it held of it, and the next
operation finds the topic gone or created again.  Each race is made to happen at one point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from log_store import SqliteLogStore, open_store
from log_store.errors import TopicDeleted, UnknownTopic
from log_store.interface import TopicConfig
from log_store.sqlite_partition import PartitionLog


def _values(store: Any, topic: str) -> list[bytes]:
    return [r.value for r in store.read(topic, 0, 0).records]


def test_an_append_into_a_partition_whose_files_were_removed_says_the_topic_was_deleted(
    tmp_path: Path,
) -> None:
    """The writer holds the partition open (a read opened it) but has not committed to it
    yet: its first commit opens the partition's lock file, which the deletion removed."""
    writer, deleter = open_store(tmp_path), open_store(tmp_path)
    try:
        writer.create_topic("dc1.t", TopicConfig(partitions=1))
        deleter.append("dc1.t", 0, [b"before"])  # made by a write: a read makes no file
        assert _values(writer, "dc1.t") == [b"before"]
        deleter.delete_topic("dc1.t")
        with pytest.raises(UnknownTopic, match="deleted"):
            writer.append("dc1.t", 0, [b"after the delete"])
        # not stuck on the partition it held: the topic made again is written
        deleter.create_topic("dc1.t", TopicConfig(partitions=1))
        assert writer.append("dc1.t", 0, [b"into the new topic"]).first_offset == 0
        assert _values(deleter, "dc1.t") == [b"into the new topic"]
    finally:
        writer.close()
        deleter.close()


def test_an_append_between_a_deletions_file_and_directory_removal_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """The deletion has removed the partition's files but not yet its directory when a
    writer's first commit opens the lock file: making that file again would leave the
    deleted topic's directory behind for ever (the deletion's own removal of it fails)."""
    writer, deleter = open_store(tmp_path), open_store(tmp_path)
    try:
        writer.create_topic("dc1.t", TopicConfig(partitions=1))
        deleter.append("dc1.t", 0, [b"before"])  # made by a write: a read makes no file
        assert _values(writer, "dc1.t") == [b"before"]
        partition_dir = next((tmp_path / "topics" / "dc1.t").iterdir()) / "0"
        deleter.delete_topic("dc1.t")
        partition_dir.mkdir(parents=True)  # as mid-way through the deletion's removal
        with pytest.raises(UnknownTopic, match="deleted"):
            writer.append("dc1.t", 0, [b"after the delete"])
        assert list(partition_dir.iterdir()) == []
    finally:
        writer.close()
        deleter.close()


def test_an_append_racing_a_deletion_and_a_re_creation_is_made_again_into_the_new_topic(
    tmp_path: Path,
) -> None:
    writer, deleter = open_store(tmp_path), open_store(tmp_path)
    try:
        writer.create_topic("dc1.t", TopicConfig(partitions=1))
        assert _values(writer, "dc1.t") == []
        deleter.delete_topic("dc1.t")
        deleter.create_topic("dc1.t", TopicConfig(partitions=1))
        assert writer.append("dc1.t", 0, [b"made again"]).first_offset == 0
        assert _values(deleter, "dc1.t") == [b"made again"]
        assert len(list((tmp_path / "topics" / "dc1.t").iterdir())) == 1  # the new topic only
    finally:
        writer.close()
        deleter.close()


def test_a_read_that_opens_a_partition_while_its_topic_is_deleted_says_so_and_makes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader found the topic in the catalog; its files go before it opens them.  It
    must not read an empty partition of its own making (nor leave that behind)."""
    reader, deleter = open_store(tmp_path), open_store(tmp_path)
    try:
        deleter.create_topic("dc1.t", TopicConfig(partitions=1))
        deleter.append("dc1.t", 0, [b"before"])
        old_id = deleter.describe_topic("dc1.t").topic_id
        open_partition = SqliteLogStore._open_partition
        raced: list[str] = []

        def deleted_first(store: SqliteLogStore, info: Any, partition: int) -> PartitionLog:
            if store is reader and not raced:
                raced.append(info.topic_id)
                deleter.delete_topic("dc1.t")
            return open_partition(store, info, partition)

        monkeypatch.setattr(SqliteLogStore, "_open_partition", deleted_first)
        with pytest.raises(TopicDeleted, match="deleted while"):
            reader.read("dc1.t", 0, 0)
        assert raced == [old_id]
        assert not (tmp_path / "topics" / "dc1.t" / old_id).exists()
    finally:
        reader.close()
        deleter.close()


def test_a_read_that_needs_a_new_connection_after_the_deletion_says_the_topic_was_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pooled connection of the reader is busy (here: none is left), so the read opens
    one to a database file the deletion removed: "unable to open database file" before."""
    reader, deleter = open_store(tmp_path), open_store(tmp_path)
    try:
        deleter.create_topic("dc1.t", TopicConfig(partitions=1))
        deleter.append("dc1.t", 0, [b"before"])
        assert _values(reader, "dc1.t") == [b"before"]
        read = PartitionLog.read

        def deleted_meanwhile(log: PartitionLog, offset: int, max_bytes: int) -> Any:
            deleter.delete_topic("dc1.t")
            for conn in log._pool:
                conn.close()
            log._pool.clear()
            return read(log, offset, max_bytes)

        monkeypatch.setattr(PartitionLog, "read", deleted_meanwhile)
        with pytest.raises(TopicDeleted, match="deleted while"):
            reader.read("dc1.t", 0, 0)
        monkeypatch.undo()
        with pytest.raises(UnknownTopic):
            reader.read("dc1.t", 0, 0)
        deleter.create_topic("dc1.t", TopicConfig(partitions=1))
        deleter.append("dc1.t", 0, [b"new"])
        assert _values(reader, "dc1.t") == [b"new"]
    finally:
        reader.close()
        deleter.close()


def test_a_read_only_reader_racing_a_deletion_is_told_the_topic_was_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only store (a Spark executor's) whose partition's files go before it opens
    them reads no empty partition: it says the topic was deleted."""
    deleter = open_store(tmp_path)
    reader = SqliteLogStore(tmp_path, read_only=True)
    try:
        deleter.create_topic("dc1.t", TopicConfig(partitions=1))
        deleter.append("dc1.t", 0, [b"before"])
        reader.list_topics()  # the topic is known, not yet opened
        load_topic = SqliteLogStore._load_topic
        raced: list[bool] = []

        def deleted_after_the_look(store: SqliteLogStore, name: str) -> Any:
            info = load_topic(store, name)
            if store is reader and not raced:
                # the look that opens the partition: its files go right after it
                raced.append(True)
                deleter.delete_topic(name)
            return info

        monkeypatch.setattr(SqliteLogStore, "_load_topic", deleted_after_the_look)
        with pytest.raises(TopicDeleted, match="deleted while"):
            reader.read("dc1.t", 0, 0)
        assert raced
    finally:
        reader.close()
        deleter.close()
