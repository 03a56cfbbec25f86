"""The embedded store's on-disk batch: framing, checksums, state updates, older segments."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from log_store import TopicConfig, open_store, record_batch
from log_store.errors import CorruptData
from log_store.record_batch import (
    CorruptBatch,
    check_crc,
    decode_batches,
    decode_state,
    encode_batch,
    parse_header,
)
from log_store.sqlite_store import SqliteLogStore


def _v1_batch(base: int, values: list[bytes], ts: int = 7) -> bytes:
    """A batch as segments written before the state-carrying format hold it."""
    payload = b"".join(struct.pack(">I", len(v)) + v for v in values)
    header = struct.pack(">4sQIIqI", b"LBB1", base, len(values), len(payload), ts, 0)
    return header[:-4] + struct.pack(">I", zlib.crc32(payload)) + payload


def test_batch_round_trips_records_and_the_state_updates_it_commits() -> None:
    values = [b"a", b"", b"c" * 1000]
    state = {"seq/h1:/f": (42).to_bytes(8, "big"), "epoch/é": b"\x01"}
    buf = b"".join(encode_batch(10, 123, values, state))
    header = parse_header(buf)
    assert (header.base_offset, header.count, header.size) == (10, 3, len(buf))
    check_crc(buf, 0, header)
    assert decode_state(buf, 0, header) == state
    records, total = decode_batches(buf, 11, 10**6, expected_base=10)
    assert [(r.offset, r.value, r.timestamp_ms) for r in records] == [
        (11, b"", 123),
        (12, b"c" * 1000, 123),
    ]
    assert total == 1000


def test_a_state_only_batch_holds_no_records_and_moves_no_offset() -> None:
    state_only = b"".join(encode_batch(5, 1, [], {"k": b"v"}))
    after = b"".join(encode_batch(5, 1, [b"x"]))
    records, _ = decode_batches(state_only + after, 0, 100, expected_base=5)
    assert [(r.offset, r.value) for r in records] == [(5, b"x")]


@pytest.mark.parametrize("where", [9, 20, 40, -1])
def test_any_flipped_byte_after_the_magic_fails_the_checksum(where: int) -> None:
    buf = bytearray(b"".join(encode_batch(0, 1, [b"value"] * 3, {"k": b"v"})))
    buf[where] ^= 0x40
    with pytest.raises(CorruptBatch):
        decode_batches(bytes(buf), 0, 100, expected_base=0)


def test_segments_of_the_older_format_are_still_read_next_to_new_batches() -> None:
    old = _v1_batch(0, [b"old0", b"old1"])
    new = b"".join(encode_batch(2, 9, [b"new2"], {"k": b"v"}))
    records, _ = decode_batches(old + new, 1, 100, expected_base=0)
    assert [(r.offset, r.value) for r in records] == [(1, b"old1"), (2, b"new2")]
    damaged = bytearray(old)
    damaged[-1] ^= 1
    with pytest.raises(CorruptBatch):
        decode_batches(bytes(damaged) + new, 0, 100, expected_base=0)


def test_a_batch_elsewhere_than_the_index_says_is_refused() -> None:
    buf = b"".join(encode_batch(3, 1, [b"x"]))
    with pytest.raises(CorruptBatch, match="where 4 was due"):
        decode_batches(buf, 0, 100, expected_base=4)


def test_take_values_stops_at_the_budget_but_takes_one_unless_told_not_to() -> None:
    buf = b"".join(encode_batch(10, 1, [b"a" * 5, b"b" * 7, b"c" * 3, b""]))
    header = parse_header(buf)
    lengths = record_batch.value_lengths(buf, header)
    assert lengths == (5, 7, 3, 0)
    assert record_batch.value_lengths(buf[: record_batch.values_at(header) - 1], header) is None
    take = record_batch.take_values
    assert take(header, lengths, 0, 12) == (0, 2, 12)
    assert take(header, lengths, 11, 100) == (1, 4, 10)
    assert take(header, lengths, 11, 2) == (1, 2, 7)
    assert take(header, lengths, 11, 2, at_least_one=False) == (1, 1, 0)
    assert take(header, lengths, 99, 100) == (4, 4, 0)
    records, total = decode_batches(buf, 11, 2, expected_base=10, at_least_one=False)
    assert (records, total) == ([], 0)


def _store_with_batches(data_dir: Path) -> tuple[SqliteLogStore, list[bytes]]:
    store = open_store(data_dir)
    store.create_topic("dc1.t", TopicConfig(partitions=1, segment_bytes=600_000))
    sizes = [[100_000] * 3, [7, 0, 90_000], [80_000, 5, 5, 70_000, 1], [300_000], [3] * 4]
    values = []
    for n, batch in enumerate(sizes):
        appended = [bytes([n * 16 + i]) * size for i, size in enumerate(batch)]
        store.append("dc1.t", 0, appended)
        values.extend(appended)
    return store, values


def test_reads_from_inside_batches_return_the_records_within_the_budget(tmp_path: Path) -> None:
    store, values = _store_with_batches(tmp_path / "data")
    for offset in range(len(values)):
        for budget in [1, 6, 75_000, 150_000, 250_000, 10**6]:
            got = store.read("dc1.t", 0, offset, budget).records
            assert [r.offset for r in got] == list(range(offset, offset + len(got)))
            assert [r.value for r in got] == values[offset : offset + len(got)]
            assert len(got) == 1 or sum(len(r.value) for r in got) <= budget
    store.close()


def _damage(data_dir: Path, at: int) -> None:
    segment = min((data_dir / "topics").rglob("*.log"))
    with open(segment, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.parametrize("read_before", [False, True])
@pytest.mark.parametrize("where", ["crc", "base", "value"])
def test_a_damaged_batch_is_refused_however_a_read_enters_it(
    tmp_path: Path, where: str, read_before: bool
) -> None:
    """Damaged bytes are never served, whether or not the batch was read (and found whole)
    before the damage: a read never trusts bytes it did not check.  A read of part of a
    batch read lately checks the bytes it reads (against the batch's CRC marks): records of
    it that the damage did not touch may be served, the damaged one never is."""
    data_dir = tmp_path / "data"
    store, values = _store_with_batches(data_dir)
    at = {"crc": 5, "base": 12, "value": 150_000}[where]  # "value": in offset 1's value
    if read_before:
        for offset in (0, 1, 2):
            assert store.read("dc1.t", 0, offset, 1).records
    _damage(data_dir, at)
    for offset in (0, 1, 2):
        for budget in (1, 10**6):
            try:
                got = store.read("dc1.t", 0, offset, budget).records
            except CorruptData as caught:
                assert (caught.topic, caught.partition, caught.offset) == ("dc1.t", 0, 0)
                continue
            assert where == "value" and read_before, (offset, budget)
            assert 1 not in [r.offset for r in got]  # the damaged one
            assert [r.value for r in got] == values[offset : offset + len(got)]
    with pytest.raises(CorruptData, match="corrupt segment data"):
        store.read("dc1.t", 0, 1, 1)
    store.close()


def _large_batch() -> bytes:
    values = [b"a" * 100_000, b"", b"b" * 120_000, b"c" * 90_000]
    return b"".join(encode_batch(3, 9, values, {"k": b"v"}))


def test_a_batch_of_large_values_is_checked_value_by_value_and_reads_the_same() -> None:
    buf = _large_batch()
    header = parse_header(buf)
    split = record_batch.check_and_split(buf, 0, header)
    assert split == [b"a" * 100_000, b"", b"b" * 120_000, b"c" * 90_000]
    small = b"".join(encode_batch(0, 1, [b"x" * 100]))
    assert record_batch.check_and_split(small, 0, parse_header(small)) is None
    records, total = decode_batches(buf, 4, 10**6, expected_base=3)
    assert [(r.offset, len(r.value)) for r in records] == [(4, 0), (5, 120_000), (6, 90_000)]
    assert total == 210_000


@pytest.mark.parametrize("where", [9, 20, 36, 50, 60, 70, 20_000, 150_000, 250_000, -1])
def test_any_flipped_byte_of_a_batch_of_large_values_fails_its_check(where: int) -> None:
    buf = bytearray(_large_batch())
    buf[where] ^= 0x40
    with pytest.raises(CorruptBatch):
        decode_batches(bytes(buf), 0, 10**6, expected_base=3)


def test_value_lengths_that_do_not_fill_the_payload_are_refused() -> None:
    buf = bytearray(_large_batch())
    header = parse_header(bytes(buf))
    lengths_at = record_batch.values_at(header) - 4 * header.count
    # move 10 bytes from the first value's length to the second's: same total, wrong cut
    first, second = struct.unpack_from("<II", buf, lengths_at)
    struct.pack_into("<II", buf, lengths_at, first - 10, second + 10)
    with pytest.raises(CorruptBatch, match="checksum"):
        record_batch.check_and_split(bytes(buf), 0, header)
    struct.pack_into("<II", buf, lengths_at, first + 10, second)
    with pytest.raises(CorruptBatch, match="checksum"):
        record_batch.check_and_split(bytes(buf), 0, header)
