"""A batch damaged on disk after it was written: never applied, never a reason to cut others.

A batch that carries only state updates (a fencing session open) holds no record, so no read
checks it; recovery replays it only when the index lags it (after a power cut).  Its state
must then be applied whole or not at all, and acknowledged batches after it must not be cut
off as if the damage were a crash's unfinished write.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from log_store import PartitionState, StoreUnavailable, TopicConfig, TransactionFn, open_store
from log_store.record_batch import HEADER_SIZE
from tests.audit.test_batch_checksums import flip
from tests.contract.test_log_store_contract import (
    _restore_index,
    _snapshot_index,
    read_all,
    store_dir_of,
)


def put_only(**state_updates: bytes) -> TransactionFn:
    """A transaction that writes a batch of state updates only (as a fencing open does)."""

    def fn(state: PartitionState) -> Sequence[bytes]:
        for key, value in state_updates.items():
            state.put(key.replace("_", "/"), value)
        return []

    return fn


def test_a_damaged_state_batch_the_index_holds_changes_nothing_the_store_serves(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        store.transact("dc1.t", 0, put_only(epoch_a=b"good"))
        store.append("dc1.t", 0, [b"r0", b"r1"])
    (segment,) = store_dir_of(data_dir).glob("*.log")
    flip(segment, HEADER_SIZE + 20)
    with open_store(data_dir) as store:
        assert store.get_state("dc1.t", 0, "epoch/a") == b"good"
        assert read_all(store, "dc1.t", 0) == [b"r0", b"r1"]
        assert store.check_batches("dc1.t", 0) == [
            "segment 0 byte 0: batch of offset 0 (state only) fails its checksum"
        ]


def test_recovery_never_applies_a_damaged_state_batch_nor_cuts_the_batches_after_it(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        store.transact("dc1.t", 0, put_only(epoch_a=b"one"))
        partition_dir = store_dir_of(data_dir)
        store.close()
        _snapshot_index(partition_dir, tmp_path / "index-then")
    with open_store(data_dir) as store:
        store.transact("dc1.t", 0, put_only(epoch_a=b"two"))
        store.append("dc1.t", 0, [b"acked"])
    (segment,) = partition_dir.glob("*.log")
    size = segment.stat().st_size
    # the index comes back older than the log (a power cut), and the batch after its end
    # is damaged: its state value "two" becomes something else
    _restore_index(partition_dir, tmp_path / "index-then")
    second = segment.read_bytes().index(b"two")
    flip(segment, second)
    with (
        pytest.raises(StoreUnavailable, match="fails its checksum, and a whole batch follows"),
        open_store(data_dir) as store,
    ):
        store.get_state("dc1.t", 0, "epoch/a")
    assert segment.stat().st_size == size, "acknowledged batches were cut off"
    flip(segment, second)  # repaired (from a copy): the partition opens and replays all
    with open_store(data_dir) as store:
        assert store.get_state("dc1.t", 0, "epoch/a") == b"two"
        assert read_all(store, "dc1.t", 0) == [b"acked"]


def test_a_damaged_last_state_batch_past_the_index_is_cut_and_not_applied(
    tmp_path: Path,
) -> None:
    """The last batch failing its CRC is what a crash mid-write leaves: it is cut off, and
    its state is not applied (not even the part of it that reads well)."""
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        store.append("dc1.t", 0, [b"r0"])
        store.transact("dc1.t", 0, put_only(epoch_a=b"one"))
        partition_dir = store_dir_of(data_dir)
        store.close()
        _snapshot_index(partition_dir, tmp_path / "index-then")
    with open_store(data_dir) as store:
        store.transact("dc1.t", 0, put_only(epoch_a=b"two", k=b"v"))
    (segment,) = partition_dir.glob("*.log")
    before = segment.stat().st_size
    _restore_index(partition_dir, tmp_path / "index-then")
    flip(segment, segment.read_bytes().index(b"two"))
    with open_store(data_dir) as store:
        assert store.get_state("dc1.t", 0, "epoch/a") == b"one"
        assert store.get_state("dc1.t", 0, "k") is None
        assert read_all(store, "dc1.t", 0) == [b"r0"]
        assert store.check_batches("dc1.t", 0) == []
    assert segment.stat().st_size < before
    assert os.path.getsize(segment) > 0
