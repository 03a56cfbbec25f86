"""The partition index's WAL stays bounded: checkpoints run for every kind of writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store import open_store, sqlite_partition
from log_store.interface import TopicConfig

CHECKPOINT_PAGES = 30
APPENDS = 300  # about 900 WAL pages (3.6 MiB) if nothing were checkpointed


def wal_bytes(data_dir: Path) -> int:
    (wal,) = (data_dir / "topics").rglob("partition.db-wal")
    return wal.stat().st_size


@pytest.mark.parametrize("mode", ["transact", "submit"])
def test_wal_is_checkpointed_while_a_writer_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr(sqlite_partition, "_CHECKPOINT_PAGES", CHECKPOINT_PAGES)
    store = open_store(tmp_path)
    try:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        for i in range(APPENDS):
            if mode == "transact":  # a waiting writer commits in its own thread
                store.transact("dc1.t", 0, lambda _state, i=i: [b"%d" % i])
            else:
                store.submit("dc1.t", 0, lambda _state, i=i: [b"%d" % i]).result(10)
        # A few commits may land while a checkpoint runs; never hundreds.
        assert wal_bytes(tmp_path) < 1 << 20
        assert [r.value for r in store.read("dc1.t", 0, 0, 1 << 20).records] == [
            b"%d" % i for i in range(APPENDS)
        ]
    finally:
        store.close()
