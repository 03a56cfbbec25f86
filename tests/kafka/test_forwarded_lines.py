"""A forwarded compressed write is decompressed once: by the gateway that received it.

That gateway decompresses every compressed chunk to check it (``check_codecs``) and keeps each
chunk's line count.  When the write goes to the partition's owner, the counts travel with the
records (``record_lines``), and the owner's audit counts them rather than decompressing each
chunk again.  No broker here: the write function runs over the embedded store, and the wire
is the prepared transaction's own encoding.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gzip
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import zstandard

from audit.windows import WindowCounts
from delivery.envelope_view import view
from ingest_api.audit_api import CommittedCounter
from log_store import LogStore, open_store
from log_store.interface import AppendResult, PartitionState, known_record_lines
from log_store.kafka.remote_transaction import PreparedTransaction
from session_dedup.chunk_codecs import count_lines
from session_dedup.envelope import EnvelopeWriter
from session_dedup.exactly_once import ChunkBatch, ExactlyOnceWriter, SessionRequest
from session_dedup.source import SourceMeta, source_meta


def _zstd(lines: int) -> bytes:
    return zstandard.ZstdCompressor().compress(b"".join(b"z %d\n" % i for i in range(lines)))


def _gzip(lines: int) -> bytes:
    return gzip.compress(b"".join(b"g %d\n" % i for i in range(lines)))


def _checked(codec: str, datas: list[bytes], seqnos: list[int], **conditions: Any) -> ChunkBatch:
    """A batch as the write path hands it on: compressed chunks with the lines it counted."""
    lines = None if codec == "raw" else [count_lines(codec, d) for d in datas]
    return ChunkBatch(seqnos, [0] * len(seqnos), list(datas), lines=lines, **conditions)


class _Recording:
    """The embedded store, keeping each transaction function with its commit's future."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.runs: list[tuple[str, int, Callable[..., Any], concurrent.futures.Future[Any]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def submit(
        self, topic: str, partition: int, fn: Callable[[PartitionState], Sequence[bytes]]
    ) -> concurrent.futures.Future[AppendResult]:
        future = self.store.submit(topic, partition, fn)
        self.runs.append((topic, partition, fn, future))
        return future


def test_each_record_of_a_chunk_transaction_gets_the_lines_its_chunk_was_counted_with(
    tmp_path: Path,
) -> None:
    """Duplicates, chunks out of order, a fenced writer, a source over the partition's limit
    and raw chunks among compressed ones: the counts line up with the records written."""
    store = open_store(tmp_path / "data")
    recording = _Recording(store)
    writer = ExactlyOnceWriter(recording, dc="dc1", partitions=1, max_sources_per_partition=5)  # type: ignore[arg-type]

    def meta(i: int, codec: str) -> SourceMeta:
        return source_meta(log_type="app", source_id=f"s{i}", codec=codec)

    writer.write(meta(0, "zstd"), _checked("zstd", [_zstd(2)], [10]))
    writer.write(meta(2, "gzip"), _checked("gzip", [_gzip(1)], [1]))
    (fenced,) = writer.open_sessions([meta(2, "gzip")], [SessionRequest(fence=True)])
    writer.write(meta(4, "raw"), _checked("raw", [b"r\n"], [1]))
    recording.runs.clear()
    sections = [
        # a duplicate, then two written, one of them after a chunk out of order
        (
            meta(0, "zstd"),
            _checked("zstd", [_zstd(3), _zstd(4), _zstd(9), _zstd(5)], [9, 11, 11, 12]),
        ),
        (meta(1, "raw"), _checked("raw", [b"a\nb\n", b"c\n"], [1, 2])),  # raw: counted in place
        (meta(2, "gzip"), _checked("gzip", [_gzip(6)], [5], epoch=fenced.epoch - 1)),  # fenced
        (meta(3, "gzip"), _checked("gzip", [_gzip(7), _gzip(8)], [1, 2])),  # new, at the limit
        (meta(5, "zstd"), _checked("zstd", [_zstd(2)], [1])),  # new, over the limit
        (meta(4, "raw"), _checked("raw", [b"x\n"], [2])),
    ]
    asyncio.run(writer.write_many_async(sections))
    ((topic, partition, fn, future),) = recording.runs
    result = future.result()
    written = store.read(topic, partition, result.first_offset, max_bytes=1 << 30).records
    records = [r.value for r in written if r.offset <= result.last_offset]
    lines = known_record_lines(fn, records)
    expected = []
    for value in records:
        envelope = view(value)
        expected.append(
            -1 if envelope.codec == "raw" else count_lines(envelope.codec, envelope.data)
        )
    assert lines == expected == [4, 5, -1, -1, 7, 8, -1]
    store.close()


def test_a_transaction_of_raw_chunks_only_sends_no_counts(tmp_path: Path) -> None:
    store = open_store(tmp_path / "data")
    recording = _Recording(store)
    writer = ExactlyOnceWriter(recording, dc="dc1", partitions=1)  # type: ignore[arg-type]
    writer.write(source_meta(log_type="app", source_id="s"), _checked("raw", [b"a\n"], [1]))
    ((_topic, _partition, fn, future),) = recording.runs
    future.result()
    assert known_record_lines(fn, [b"record"]) is None
    store.close()


def test_counts_that_do_not_match_the_records_are_not_sent() -> None:
    class Fn:
        def record_lines(self) -> list[int]:
            return [3]

    assert known_record_lines(Fn(), [b"one", b"two"]) is None  # type: ignore[arg-type]
    assert known_record_lines(Fn(), [b"one"]) == [3]  # type: ignore[arg-type]
    assert known_record_lines(lambda state: [], [b"one"]) is None


def test_the_counts_travel_with_the_prepared_transaction() -> None:
    prepared = PreparedTransaction(
        records=[b"one", b"two", b"three"], counted_at_owner=True, record_lines=[4, -1, 0]
    )
    received = PreparedTransaction.decode(prepared.encode())
    assert received.record_lines == [4, -1, 0]
    assert received.records == prepared.records
    # a sender of an earlier version sends none: the owner decompresses, as before
    without = PreparedTransaction(records=[b"one"], counted_at_owner=True)
    assert PreparedTransaction.decode(without.encode()).record_lines is None


@pytest.mark.parametrize("lines", [[1], [1, 2, 3], [1, -2], [1, True], [1, "2"], [1, 2.0], {}])
def test_counts_a_peer_sends_wrong_refuse_the_transaction(lines: object) -> None:
    header = PreparedTransaction(records=[b"one", b"two"], counted_at_owner=True).header()
    header["record_lines"] = lines
    with pytest.raises(ValueError, match="record_lines"):
        PreparedTransaction.from_header(header, [b"one", b"two"])


def test_the_owner_counts_the_lines_it_is_given_without_decompressing() -> None:
    """The chunks' data is not zstd at all: decompressing it would count 0 lines."""
    writer = EnvelopeWriter(source_id="s", server="h", file="/f", log_type="app", codec="zstd")
    records = [writer.encode(seqno, 5_000, 6_000, b"not zstd") for seqno in (1, 2, 3)]
    raw = EnvelopeWriter(source_id="r", server="h", file="/f", log_type="app", codec="raw")
    records.append(raw.encode(1, 5_000, 6_000, b"a\nb\n"))
    counts = WindowCounts()
    CommittedCounter(counts)("dc1.app", records, [7, 9, -1, -1])
    assert sum(lines for _messages, lines in counts.snapshot().values()) == 7 + 9 + 0 + 2
    valid = [writer.encode(1, 5_000, 6_000, _zstd(3))]
    counted = WindowCounts()
    CommittedCounter(counted)("dc1.app", valid)  # no counts sent: decompressed here
    assert sum(lines for _messages, lines in counted.snapshot().values()) == 3
