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
    NoStore,
    OffsetOutOfRange,
    ReadOnlyStore,
    SourceFenced,
    StoreFull,
    StoreUnavailable,
    TopicExists,
    UnknownPartition,
    UnknownTopic,
)
from log_store.interface import (
    UNLIMITED,
    AppendResult,
    LogStore,
    PartitionInfo,
    PartitionState,
    ReadResult,
    Record,
    StoreCapabilities,
    TopicConfig,
    TopicInfo,
    TransactionFn,
)
from log_store.partition_handles import DEFAULT_MAX_OPEN_PARTITIONS
from log_store.sqlite_store import SqliteLogStore
from log_store.topic_names import validate_topic_name


def open_store(
    data_dir: str | Path,
    *,
    create: bool = True,
    read_only: bool = False,
    max_open_partitions: int = DEFAULT_MAX_OPEN_PARTITIONS,
    dc: str | None = None,
) -> SqliteLogStore:
    """Open the embedded log store under ``data_dir``, creating it if needed.

    With ``create=False`` (tools that inspect or administer a store) a directory that holds
    no store is an error (:class:`NoStore`), so a typo never creates an empty store there.
    ``read_only=True`` (readers such as Spark executors) implies ``create=False`` and opens
    the store for reading only: nothing under ``data_dir`` is created or changed, and writes
    raise :class:`ReadOnlyStore`.  At most ``max_open_partitions`` idle partitions are kept
    open (:mod:`log_store.partition_handles`).  ``dc``: the DC of the gateway opening it,
    recorded by the first and checked by every later one (:mod:`log_store.data_dir_kind`).
    """
    if not create or read_only:
        path = Path(data_dir)
        if not path.exists():
            raise NoStore(f"no data directory {str(path)!r}")
        if not path.is_dir():
            raise NoStore(f"{str(path)!r} is not a directory")
        if not SqliteLogStore.exists_at(path):
            raise NoStore(f"{str(path)!r} holds no logbroker store; give the gateway's --data-dir")
    return SqliteLogStore(
        data_dir, read_only=read_only, max_open_partitions=max_open_partitions, dc=dc
    )


__all__ = [
    "UNLIMITED",
    "AppendResult",
    "BadRequest",
    "InvalidTopicName",
    "LogStore",
    "LogbrokerError",
    "NoStore",
    "OffsetOutOfRange",
    "PartitionInfo",
    "PartitionState",
    "ReadOnlyStore",
    "ReadResult",
    "Record",
    "SourceFenced",
    "SqliteLogStore",
    "StoreCapabilities",
    "StoreFull",
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
