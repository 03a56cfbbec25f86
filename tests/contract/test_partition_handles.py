"""The embedded store keeps few partitions open, and closing one never fails an operation."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

from log_store import open_store
from log_store.interface import TopicConfig


def test_threads_using_more_partitions_than_stay_open_all_succeed(tmp_path: Path) -> None:
    store = open_store(tmp_path, max_open_partitions=2)
    try:
        store.create_topic("t", TopicConfig(partitions=8))

        def work(partition: int) -> list[bytes]:
            for i in range(30):
                store.append("t", partition, [b"%d-%d" % (partition, i)])
                store.read("t", (partition + i) % 8, 0)  # reads of others' partitions meanwhile
            return [r.value for r in store.read("t", partition, 0).records]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(work, range(8)))
        assert results == [[b"%d-%d" % (p, i) for i in range(30)] for p in range(8)]
        store.read("t", 0, 0)  # an open closes the idle ones beyond the limit
        assert store.open_partitions <= 2
    finally:
        store.close()
