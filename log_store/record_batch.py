"""The on-disk record batch: how appended records are laid out in a segment file.

One append writes one batch::

    header  := magic "LBB1", u64 base_offset, u32 count, u32 payload_len, i64 timestamp_ms,
               u32 crc32(payload)
    payload := (u32 value_len, value){count}

The segment index (SQLite) points at whole batches only after they are fsynced, so a reader
never meets a torn batch; the CRC guards against a disk that returns other bytes than it took.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from log_store.interface import Record

MAGIC = b"LBB1"
HEADER = struct.Struct(">4sQIIqI")
HEADER_SIZE = HEADER.size
_LEN = struct.Struct(">I")


class CorruptBatch(Exception):
    """The bytes at an indexed position are not the batch the index promised."""


def encode_batch(base_offset: int, timestamp_ms: int, values: Sequence[bytes]) -> list[bytes]:
    """The bytes of one batch holding ``values`` at ``base_offset ..``, as (header, payload).

    Two pieces, written with one ``pwritev``, so the payload is never copied again.
    """
    parts: list[bytes] = []
    pack = _LEN.pack
    for value in values:
        parts.append(pack(len(value)))
        parts.append(value)
    payload = b"".join(parts)
    header = HEADER.pack(
        MAGIC, base_offset, len(values), len(payload), timestamp_ms, zlib.crc32(payload)
    )
    return [header, payload]


def decode_batches(
    buf: bytes, from_offset: int, max_bytes: int, *, expected_base: int, verify: bool = True
) -> tuple[list[Record], int]:
    """Records at or above ``from_offset`` in the consecutive batches of ``buf``.

    The first batch must start at ``expected_base`` and each next one where the previous
    ended: bytes from anywhere else are reported as corrupt, never returned.  Stops after
    about ``max_bytes`` of values (but returns at least one record).  Returns the records and
    the number of value bytes they hold.
    """
    records: list[Record] = []
    total = 0
    pos = 0
    view = memoryview(buf)
    end = len(buf)
    unpack_len = _LEN.unpack_from
    while pos + HEADER_SIZE <= end:
        magic, base, count, payload_len, ts, crc = HEADER.unpack_from(buf, pos)
        if magic != MAGIC:
            raise CorruptBatch(f"bad batch magic at byte {pos}")
        if base != expected_base:
            raise CorruptBatch(f"batch of offset {base} found where {expected_base} was due")
        expected_base = base + count
        start = pos + HEADER_SIZE
        stop = start + payload_len
        if stop > end:
            raise CorruptBatch(f"batch at byte {pos} runs past the read")
        if verify and zlib.crc32(view[start:stop]) != crc:
            raise CorruptBatch(f"batch at offset {base} fails its checksum")
        p = start
        offset = base
        for _ in range(count):
            (n,) = unpack_len(buf, p)
            p += 4
            if offset >= from_offset:
                if records and total + n > max_bytes:
                    return records, total
                records.append(Record(offset, bytes(view[p : p + n]), ts))
                total += n
            p += n
            offset += 1
        pos = stop
    return records, total
