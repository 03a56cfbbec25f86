"""Reading legacy transactions: markers are resolved without a store read each.

On Kafka every store read is a seek and a fetch (~0.1 s), so a read that resolved each commit
marker with a read of its own took 22 s for a fetch of 200 transactions.  These tests count
the store reads a pull read and the loader's store read make, on a real embedded store, and
check that the transactions delivered stay exactly those the transaction filter releases,
wherever a read starts and stops.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, cast

import pytest

import delivery.legacy_txn
from delivery.legacy_txn import StagedData, write_commit, write_data
from delivery.partition_reader import MAX_MAX_BYTES, PartitionReader
from log_store import LogStore, ReadResult, TopicConfig, open_store
from session_dedup.envelope import EnvelopeWriter
from yt_loader.log_source import LogMessage, StoreLogSource

TOPIC = "dc1.app"


class CountingStore:
    """The store, counting its reads (and slowing each down by ``delay_s``, as Kafka's
    seek and fetch does)."""

    def __init__(self, store: LogStore, delay_s: float = 0.0) -> None:
        self._store = store
        self.delay_s = delay_s
        self.reads = 0

    def read(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20) -> ReadResult:
        self.reads += 1
        time.sleep(self.delay_s)
        return self._store.read(topic, partition, offset, max_bytes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    opened = open_store(tmp_path / "store")
    opened.create_topic(TOPIC, TopicConfig(partitions=1, segment_bytes=16 * 1024))
    yield opened
    opened.close()


def _staged(txn_id: str, data: bytes) -> StagedData:
    return StagedData(
        store_id=hashlib.md5(txn_id.encode()).hexdigest(),
        log_type="app",
        server="old1",
        file="/a",
        data=data,
        txn_id=txn_id,
    )


def _request(store: LogStore, txn_id: str) -> int:
    return write_data(store, TOPIC, 1, txn_id, _staged(txn_id, f"{txn_id}\n".encode())).data_offset


def _commit(store: LogStore, txn_id: str) -> None:
    write_commit(store, TOPIC, 0, txn_id, "gw1")


def _chunk(store: LogStore, seqno: int, size: int = 100) -> int:
    writer = EnvelopeWriter(
        source_id="host1:/var/log/app", server="host1", file="/a", log_type="app"
    )
    now = int(time.time() * 1000)
    data = b"x" * (size - 1) + b"\n"
    return store.append(TOPIC, 0, [writer.encode(seqno, now, now, data)]).first_offset


def _read_all(
    reader: PartitionReader, offset: int = 0, max_bytes: int = MAX_MAX_BYTES
) -> list[str]:
    """Every legacy line delivered from ``offset`` to the end, answer after answer."""
    lines: list[str] = []
    while True:
        batch = reader.read(TOPIC, 0, offset, max_bytes)
        lines.extend(m.view.data.decode() for m in batch.messages if m.view is not None)
        if batch.next_offset >= batch.end_offset:
            break
        assert batch.next_offset > offset
        offset = batch.next_offset
    return [line for line in lines if not line.startswith("x")]


def test_a_read_of_200_transactions_reads_the_store_once_not_once_per_marker(store: Any) -> None:
    for i in range(200):
        _request(store, f"t{i}")
        _chunk(store, i + 1)
        _commit(store, f"t{i}")
    counting = CountingStore(store)
    reader = PartitionReader(cast(LogStore, counting))
    batch = reader.read(TOPIC, 0, 0, MAX_MAX_BYTES)
    legacy = [m for m in batch.messages if m.data_offset is not None]
    assert [m.view.data for m in legacy if m.view] == [f"t{i}\n".encode() for i in range(200)]
    assert batch.next_offset == batch.end_offset == 600
    # the reads of the range, as a raw read makes them; the resolution read nothing more
    # (it read once more per marker)
    assert counting.reads == _raw_reads(store, 0) < 10


def test_markers_whose_data_lies_before_the_read_are_resolved_by_one_read(store: Any) -> None:
    data_offsets = [_request(store, f"t{i}") for i in range(100)]
    for i in range(100):
        _commit(store, f"t{i}")
    counting = CountingStore(store)
    reader = PartitionReader(cast(LogStore, counting))
    batch = reader.read(TOPIC, 0, 100, MAX_MAX_BYTES)  # the first marker: no data scanned
    assert [m.data_offset for m in batch.messages] == data_offsets
    assert [m.offset for m in batch.messages] == list(range(100, 200))
    # the range, and once the data records before it (it read once more per marker)
    assert counting.reads == _raw_reads(store, 100) + 1

    # the loader reads the store raw and resolves the same way
    source = StoreLogSource(cast(LogStore, CountingStore(store)))
    read = source.read(TOPIC, 0, 100, MAX_MAX_BYTES)
    assert [cast(LogMessage, m).envelope.data for m in read.messages] == [
        f"t{i}\n".encode() for i in range(100)
    ]
    assert cast(CountingStore, source._store).reads == _raw_reads(store, 100) + 1


def _raw_reads(store: LogStore, offset: int) -> int:
    """How many store reads a raw read (no resolving) of the partition from ``offset`` makes."""
    counting = CountingStore(store)
    PartitionReader(cast(LogStore, counting)).read(TOPIC, 0, offset, MAX_MAX_BYTES, raw=True)
    return counting.reads


def test_only_transactions_committed_in_time_are_delivered_wherever_reads_start_and_stop(
    store: Any,
) -> None:
    """Data without a marker, a late marker, a damaged one, one naming a record that is not
    its data, and data dropped by retention give nothing, read in one answer or in many,
    from any offset: the others each once, at their marker."""
    gone = _request(store, "gone")  # below the log start once the first segments are dropped
    chunk_offset = max(_chunk(store, seqno) for seqno in range(1, 800))
    _commit(store, "gone")  # its marker stays
    released = []
    for i in range(40):
        _request(store, f"t{i}")
        if i % 5 == 1:
            continue  # requested, never committed
        if i % 5 == 2:
            _chunk(store, 1000 + i)
        _commit(store, f"t{i}")
        released.append(f"t{i}\n")
    late = _request(store, "late")
    writer = EnvelopeWriter(
        source_id="legacy:late",
        server="gw1",
        file="",
        log_type="app",
        kind="legacy_commit",
        txn_id="late",
    )
    now = int(time.time() * 1000)
    marker = {"data_offset": late, "data_write_time": now - 61_000}
    store.append(TOPIC, 0, [writer.encode(1, now, now, json.dumps(marker).encode())])
    wrong = EnvelopeWriter(
        source_id="legacy:t0",
        server="gw1",
        file="",
        log_type="app",
        kind="legacy_commit",
        txn_id="t0",
    )
    store.append(
        TOPIC,
        0,
        [
            wrong.encode(2, now, now, b"not json"),
            wrong.encode(
                3, now, now, json.dumps({"data_offset": late, "data_write_time": now}).encode()
            ),
            wrong.encode(
                4,
                now,
                now,
                json.dumps({"data_offset": chunk_offset, "data_write_time": now}).encode(),
            ),
        ],
    )
    start = store.delete_segments_before(TOPIC, 0, gone + 400)
    assert start > gone
    stored = PartitionReader(store).read(TOPIC, 0, start, MAX_MAX_BYTES, raw=True)
    markers: dict[str | None, int] = {}  # each transaction's first marker ("t0" has more)
    for m in reversed(stored.messages):
        if m.view is not None and m.view.kind == "legacy_commit":
            markers[m.view.txn_id] = m.offset
    assert "gone" in markers  # its data is not: retention dropped it
    for max_bytes in (1, 4096, MAX_MAX_BYTES):
        assert _read_all(PartitionReader(store), start, max_bytes) == released, max_bytes
    for offset in range(start, stored.end_offset, 53):
        expected = [line for line in released if offset <= markers[line.strip()]]
        assert _read_all(PartitionReader(store), offset, 4096) == expected, offset


def test_a_read_whose_markers_need_slow_reads_answers_within_its_budget_and_resumes(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each marker's data needs a read of its own here (one record per read), each 0.05 s:
    an answer stops at the first marker left after the budget, and the next answer resumes
    there, so every transaction comes once, in order."""
    monkeypatch.setattr(delivery.legacy_txn, "_LOOKUP_BYTES", 1)
    for i in range(30):
        _request(store, f"t{i}")
    for i in range(30):
        _commit(store, f"t{i}")
    reader = PartitionReader(
        cast(LogStore, CountingStore(store, delay_s=0.05)), resolve_budget_s=0.2
    )
    offset, answers = 30, 0
    lines: list[str] = []
    while offset < 60:
        started = time.monotonic()
        batch = reader.read(TOPIC, 0, offset, MAX_MAX_BYTES)
        assert time.monotonic() - started < 0.2 + 0.3  # the budget, the range and one lookup
        assert batch.next_offset > offset
        lines.extend(m.view.data.decode() for m in batch.messages if m.view is not None)
        offset = batch.next_offset
        answers += 1
    assert lines == [f"t{i}\n" for i in range(30)]
    assert answers > 3


def test_a_read_past_the_deadline_it_is_given_resolves_one_marker_and_moves_on(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch of several partitions may give its reads one deadline: a read that starts
    past it still resolves its first marker, so its reader moves on."""
    monkeypatch.setattr(delivery.legacy_txn, "_LOOKUP_BYTES", 1)
    for i in range(5):
        _request(store, f"t{i}")
    for i in range(5):
        _commit(store, f"t{i}")
    batch = PartitionReader(store).read(
        TOPIC, 0, 5, MAX_MAX_BYTES, resolve_until=time.monotonic() - 1
    )
    assert [m.view.data for m in batch.messages if m.view] == [b"t0\n"]
    assert batch.next_offset == 6
