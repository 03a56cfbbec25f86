"""A traced child: appends with state updates from several threads and marks every ack.

Usage: python -m tests.durability.store_workload DATA_DIR JOURNAL TRANSACTIONS

Thread ``t`` owns the sources ``s<t>``, ``s<t+THREADS>``, ...; transaction ``j`` of source ``s``
appends 1-6 records ``<j>:<i>:<n>:<s>:`` (padded) and sets ``seq/<s>`` to ``j``, as the
exactly-once writer does.  Every eleventh transaction of a thread only bumps ``epoch/<s>``
(a state update without records).  Once, half-way, the segments below the middle are deleted.
After each call returns, the journal gets a mark: ``ACK j first last s``, ``EPOCH s n``,
``START offset``.  Concurrent threads make group commits of several transactions.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence

from log_store import PartitionState, TopicConfig, open_store
from tests.durability.powercut import mark

TOPIC = "dc1.power"
THREADS = 4
SOURCES_PER_THREAD = 3
SEGMENT_BYTES = 16 * 1024
VALUE_BYTES = 300


def record_values(txn: int, source: str) -> list[bytes]:
    count = 1 + txn % 6
    return [f"{txn}:{i}:{count}:{source}:".encode().ljust(VALUE_BYTES, b".") for i in range(count)]


def main() -> None:
    data_dir, journal_path, transactions = sys.argv[1], sys.argv[2], int(sys.argv[3])
    journal = os.open(journal_path, os.O_WRONLY | os.O_APPEND)
    store = open_store(data_dir)
    store.create_topic(TOPIC, TopicConfig(partitions=1, segment_bytes=SEGMENT_BYTES))
    journal_lock = threading.Lock()

    def worker(thread: int) -> None:
        sources = [f"s{thread + THREADS * k}" for k in range(SOURCES_PER_THREAD)]
        epochs = dict.fromkeys(sources, 0)
        for step in range(transactions // THREADS):
            txn = step * THREADS + thread
            source = sources[step % len(sources)]
            if step % 11 == 10:
                epochs[source] += 1
                epoch = epochs[source]

                def bump(state: PartitionState, s: str = source, e: int = epoch) -> Sequence[bytes]:
                    state.put(f"epoch/{s}", str(e).encode())
                    return ()

                store.transact(TOPIC, 0, bump)
                with journal_lock:
                    mark(journal, f"EPOCH {source} {epoch}")
                continue
            values = record_values(txn, source)

            def append(
                state: PartitionState, s: str = source, j: int = txn, v: list[bytes] = values
            ) -> Sequence[bytes]:
                state.put(f"seq/{s}", str(j).encode())
                return v

            result = store.transact(TOPIC, 0, append)
            with journal_lock:
                mark(journal, f"ACK {txn} {result.first_offset} {result.last_offset} {source}")
            if thread == 0 and step == transactions // THREADS // 2:
                middle = store.end_offset(TOPIC, 0) // 2
                start = store.delete_segments_before(TOPIC, 0, middle)
                with journal_lock:
                    mark(journal, f"START {start}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()


if __name__ == "__main__":
    main()
