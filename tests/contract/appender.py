"""A child process that appends numbered batches and prints each ack as soon as it has it.

Usage: appender.py STORE_SPEC TOPIC PARTITION WRITER_ID BATCHES BATCH_SIZE VALUE_BYTES [LINGER_S]

Each record is ``writer:batch:index:count:`` padded to VALUE_BYTES, so a reader can tell which
batch a record belongs to and whether the batch is whole.  Each append is a transaction that
also sets the state key ``last/<writer>`` to the batch number, so a reader can check that the
state area agrees with the records.  After each append returns (durable), the child prints
``ack writer batch first_offset last_offset unix_time`` and flushes.  With LINGER_S it stays
alive that long after its last append, store still open.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from log_store import PartitionState
from tests.contract.backends import open_spec


def state_key(writer: str) -> str:
    return f"last/{writer}"


def main() -> None:
    spec, topic, partition, writer, batches, size, value_bytes = sys.argv[1:8]
    linger_s = float(sys.argv[8]) if len(sys.argv) > 8 else 0.0
    store = open_spec(spec)
    for batch in range(int(batches)):
        count = int(size)
        values = [
            f"{writer}:{batch}:{i}:{count}:".encode().ljust(int(value_bytes), b".")
            for i in range(count)
        ]

        def append(
            state: PartitionState, values: list[bytes] = values, batch: int = batch
        ) -> Sequence[bytes]:
            state.put(state_key(writer), str(batch).encode())
            return values

        result = store.transact(topic, int(partition), append)
        print(
            f"ack {writer} {batch} {result.first_offset} {result.last_offset} {time.time()}",
            flush=True,
        )
    time.sleep(linger_s)
    store.close()


if __name__ == "__main__":
    main()
