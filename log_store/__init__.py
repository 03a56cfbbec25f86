"""The partitioned log: topics, partitions, offsets, append, read, retention.

``open_store(data_dir)`` opens the embedded backend; the Kafka backend plugs in behind the same
``LogStore`` interface.
"""

from __future__ import annotations

from pathlib import Path

from log_store.errors import (
    BadRequest,
    InvalidTopicName,
    LogbrokerError,
    OffsetOutOfRange,
    SourceFenced,
    StoreUnavailable,
    TopicExists,
    UnknownPartition,
    UnknownTopic,
)
from log_store.interface import (
    AppendResult,
    LogStore,
    PartitionInfo,
    PartitionState,
    ReadResult,
    Record,
    TopicConfig,
    TopicInfo,
    TransactionFn,
)
from log_store.sqlite_store import SqliteLogStore
from log_store.topic_names import validate_topic_name


def open_store(data_dir: str | Path) -> SqliteLogStore:
    """Open (creating if needed) the embedded log store under ``data_dir``."""
    return SqliteLogStore(data_dir)


__all__ = [
    "AppendResult",
    "BadRequest",
    "InvalidTopicName",
    "LogStore",
    "LogbrokerError",
    "OffsetOutOfRange",
    "PartitionInfo",
    "PartitionState",
    "ReadResult",
    "Record",
    "SourceFenced",
    "SqliteLogStore",
    "StoreUnavailable",
    "TopicConfig",
    "TopicExists",
    "TopicInfo",
    "TransactionFn",
    "UnknownPartition",
    "UnknownTopic",
    "open_store",
    "validate_topic_name",
]
