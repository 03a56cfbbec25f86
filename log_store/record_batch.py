"""The on-disk record batch: how one group commit is laid out in a segment file.

One group commit writes one batch, and the batch is the commit's whole truth: its records and
the state-area updates it commits.  The index and the state area in SQLite are derived from
the batches and may lag them after a power cut; recovery replays the batches past the last
indexed one (see ``tail_recovery``)::

    header  := magic "LBB2", u32 crc32c(everything after this field to the batch's end),
               u64 base_offset, u32 count, u32 state_len, u32 payload_len, i64 timestamp_ms
    state   := u32 n, u16 key_len[n], u32 value_len[n], keys (UTF-8), values
    payload := u32 value_len[count], values

Integers in the header are big-endian; the length arrays are little-endian u32/u16 arrays, so a
batch is framed with a few joins and ``struct`` calls whatever its record count, and read back
without per-record unpacking.  A batch with ``count == 0`` carries only state updates.  The CRC
covers the header fields too, so recovery can trust a header only together with its batch.

Segments written before this format hold ``LBB1`` batches (no state section, zlib CRC-32 of
the payload, a big-endian length before each value); they are still read, and a segment may
hold both kinds.
"""

from __future__ import annotations

import contextlib
import struct
import zlib
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

import google_crc32c

from log_store.interface import Record

MAGIC = b"LBB2"
HEADER = struct.Struct(">4sIQIIIq")
HEADER_SIZE = HEADER.size
_CRC_FROM = 8  # the CRC covers the header from byte 8 on
_FIELDS = struct.Struct(">QIIIq")
_U32 = struct.Struct("<I")
MAGIC_V1 = b"LBB1"
HEADER_V1 = struct.Struct(">4sQIIqI")
_LEN_V1 = struct.Struct(">I")

# A batch whose values average this much is checked value by value (see check_and_split)
# and read value by value (see sqlite_partition).
_SPLIT_VALUES = 64 * 1024

_crc = google_crc32c.value
_crc_extend = google_crc32c.extend


class CorruptBatch(Exception):
    """The bytes at an indexed position are not the batch the index promised."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fields of one batch's header."""

    base_offset: int
    count: int
    state_len: int
    payload_len: int
    timestamp_ms: int
    crc: int

    @property
    def size(self) -> int:
        """The batch's length in the segment, header included."""
        return HEADER_SIZE + self.state_len + self.payload_len

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count


def _u32_array(values: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def _encode_state(state: Mapping[str, bytes]) -> bytes:
    if not state:
        return b""
    keys = [key.encode("utf-8") for key in state]
    values = list(state.values())
    return b"".join(
        (
            _U32.pack(len(keys)),
            struct.pack(f"<{len(keys)}H", *map(len, keys)),
            _u32_array(list(map(len, values))),
            *keys,
            *values,
        )
    )


def encode_batch(
    base_offset: int,
    timestamp_ms: int,
    values: Sequence[bytes],
    state: Mapping[str, bytes] | None = None,
) -> list[bytes]:
    """The pieces of one batch (header, state, the payload's lengths, its values), written
    with one ``pwritev``.

    The record values are copied once, into one piece (a single value not at all).
    """
    state_bytes = _encode_state(state) if state else b""
    lengths = struct.pack(f"<{len(values)}I", *map(len, values))
    joined = b"".join(values)
    fields = _FIELDS.pack(
        base_offset,
        len(values),
        len(state_bytes),
        len(lengths) + len(joined),
        timestamp_ms,
    )
    crc = _crc_extend(_crc_extend(_crc_extend(_crc(fields), state_bytes), lengths), joined)
    return [MAGIC + crc.to_bytes(4, "big") + fields, state_bytes, lengths, joined]


def parse_header(buf: bytes, pos: int = 0) -> BatchHeader:
    """The header at ``pos``; raises ``CorruptBatch`` if it is not one (the CRC is not checked)."""
    if pos + HEADER_SIZE > len(buf):
        raise CorruptBatch(f"batch header at byte {pos} is cut short")
    magic, crc, base, count, state_len, payload_len, ts = HEADER.unpack_from(buf, pos)
    if magic != MAGIC:
        raise CorruptBatch(f"bad batch magic at byte {pos}")
    return BatchHeader(base, count, state_len, payload_len, ts, crc)


def check_crc(buf: bytes, pos: int, header: BatchHeader) -> None:
    """Raise ``CorruptBatch`` unless the batch at ``pos`` of ``buf`` matches its CRC."""
    stop = pos + header.size
    if stop > len(buf):
        raise CorruptBatch(f"batch at byte {pos} runs past the data")
    if _crc(buf[pos + _CRC_FROM : stop]) != header.crc:
        raise CorruptBatch(f"batch of offset {header.base_offset} fails its checksum")


def decode_state(buf: bytes, pos: int, header: BatchHeader) -> dict[str, bytes]:
    """The state updates a (checked) batch at ``pos`` commits."""
    if not header.state_len:
        return {}
    p = pos + HEADER_SIZE
    (n,) = _U32.unpack_from(buf, p)
    p += 4
    key_lens = struct.unpack_from(f"<{n}H", buf, p)
    p += 2 * n
    value_lens = struct.unpack_from(f"<{n}I", buf, p)
    p += 4 * n
    keys = []
    for length in key_lens:
        keys.append(buf[p : p + length].decode("utf-8"))
        p += length
    state = {}
    for key, length in zip(keys, value_lens, strict=True):
        state[key] = buf[p : p + length]
        p += length
    return state


def check_and_split(buf: bytes, pos: int, header: BatchHeader) -> list[bytes] | None:
    """``check_crc``; for a batch of large values, the batch's values, the check having run
    over them as they were cut out instead of over a copy of the whole batch (one copy of
    8 MiB, fresh memory, for every batch a reader reads).  None for a batch of small values.
    """
    if not has_large_values(header):
        check_crc(buf, pos, header)
        return None
    stop = pos + header.size
    at = pos + values_at(header)
    if stop > len(buf) or at > stop:
        raise CorruptBatch(f"batch at byte {pos} runs past the data")
    lengths = struct.unpack_from(f"<{header.count}I", buf, at - 4 * header.count)
    values = []
    for n in lengths:
        values.append(buf[at : at + n])
        at += n
    check_pieces(buf[pos:at], header, values)
    return values


def has_large_values(header: BatchHeader) -> bool:
    """Whether a batch's values are large enough to be checked and read one by one."""
    return bool(header.count) and header.payload_len >= header.count * _SPLIT_VALUES


def check_pieces(head: bytes, header: BatchHeader, values: Sequence[bytes]) -> CrcMarks:
    """Raise ``CorruptBatch`` unless the batch whose bytes up to its first value are ``head``
    and whose values are ``values`` matches its CRC; its marks at the values' bounds.

    The CRC covers exactly the bytes ``check_crc`` covers: the values must fill the payload.
    """
    at = values_at(header)
    if len(head) < at or sum(map(len, values)) != header.size - at:
        raise CorruptBatch(f"batch of offset {header.base_offset} fails its checksum")
    crc = _crc(head[_CRC_FROM:at])
    bounds, crcs = [_CRC_FROM, at], [0, crc]
    for value in values:
        crc = _crc_extend(crc, value)
        at += len(value)
        bounds.append(at)
        crcs.append(crc)
    if crc != header.crc:
        raise CorruptBatch(f"batch of offset {header.base_offset} fails its checksum")
    return CrcMarks(tuple(bounds), tuple(crcs))


MARK_STEP = 256 * 1024
"""How far apart ``crc_marks`` puts the marks of a batch of small values."""


@dataclass(frozen=True, slots=True)
class CrcMarks:
    """The running CRC-32C of a batch that matched its CRC, at some of its bytes: ``crcs[i]``
    covers the batch's bytes from 8 (where the CRC starts) to ``bounds[i]``.  The first
    bound is 8 (CRC 0), the last the batch's size (its CRC); the bytes between any two bounds
    can be checked on their own, without reading the rest of the batch."""

    bounds: tuple[int, ...]
    crcs: tuple[int, ...]

    def span(self, first: int, stop: int) -> tuple[int, int]:
        """The indexes of the bounds around the batch's bytes ``first .. stop``."""
        return bisect_right(self.bounds, first) - 1, bisect_left(self.bounds, stop)

    def check(self, data: bytes, i: int, j: int, base: int) -> None:
        """Raise ``CorruptBatch`` unless ``data``, the batch's bytes from ``bounds[i]`` to
        ``bounds[j]``, are what they were when the batch matched its CRC."""
        if len(data) != self.bounds[j] - self.bounds[i] or (
            _crc_extend(self.crcs[i], data) != self.crcs[j]
        ):
            raise CorruptBatch(f"batch of offset {base} fails its checksum")


def crc_marks(buf: bytes, pos: int, header: BatchHeader) -> CrcMarks:
    """``check_crc`` of the batch at ``pos``, with its marks every ``MARK_STEP`` bytes."""
    stop = pos + header.size
    if stop > len(buf):
        raise CorruptBatch(f"batch at byte {pos} runs past the data")
    bounds, crcs = [_CRC_FROM], [0]
    crc = 0
    for at in range(pos + _CRC_FROM, stop, MARK_STEP):
        end = min(at + MARK_STEP, stop)
        crc = _crc_extend(crc, buf[at:end])
        bounds.append(end - pos)
        crcs.append(crc)
    if crc != header.crc:
        raise CorruptBatch(f"batch of offset {header.base_offset} fails its checksum")
    return CrcMarks(tuple(bounds), tuple(crcs))


class CheckedBatches:
    """Batches read whole and found to match their CRC lately, with their ``CrcMarks``.

    A read of part of one (a 4 MiB fetch from an 8 MiB batch; the next reader at the tail)
    reads only the bytes between the marks around that part and checks them against the
    marks: bytes changed since are refused as a whole-batch check would refuse them, and no
    read trusts bytes it did not check.  Known by (segment, position, base offset, size,
    CRC); only the last ``size`` are kept.  Safe to share between threads.
    """

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._seen: OrderedDict[tuple[int, int, int, int, int], CrcMarks] = OrderedDict()

    def marks(self, segment: int, pos: int, header: BatchHeader) -> CrcMarks | None:
        return self._seen.get((segment, pos, header.base_offset, header.size, header.crc))

    def remember(self, segment: int, pos: int, header: BatchHeader, marks: CrcMarks) -> None:
        self._seen[(segment, pos, header.base_offset, header.size, header.crc)] = marks
        if len(self._seen) > self._size:
            with contextlib.suppress(KeyError):  # another thread evicted it first
                self._seen.popitem(last=False)


def value_lengths(head: bytes, header: BatchHeader) -> tuple[int, ...] | None:
    """The lengths of the values of the batch whose first bytes are ``head``; None if ``head``
    ends before them."""
    at = HEADER_SIZE + header.state_len
    if at + 4 * header.count > len(head):
        return None
    return struct.unpack_from(f"<{header.count}I", head, at)


def values_at(header: BatchHeader) -> int:
    """Where a batch's first value starts, from the batch's start."""
    return HEADER_SIZE + header.state_len + 4 * header.count


def take_values(
    header: BatchHeader,
    lengths: Sequence[int],
    from_offset: int,
    max_bytes: int,
    *,
    at_least_one: bool = True,
) -> tuple[int, int, int]:
    """Which records of a batch a read from ``from_offset`` for about ``max_bytes`` of values
    returns: the index of the first, the index past the last, and their value bytes."""
    first = stop = min(header.count, max(0, from_offset - header.base_offset))
    total = 0
    while stop < header.count:
        n = lengths[stop]
        if (stop > first or not at_least_one) and total + n > max_bytes:
            break
        total += n
        stop += 1
    return first, stop, total


def decode_batches(
    buf: bytes,
    from_offset: int,
    max_bytes: int,
    *,
    expected_base: int,
    verify: bool = True,
    at_least_one: bool = True,
    partly_read: Callable[[int, bytes, int, BatchHeader], None] | None = None,
) -> tuple[list[Record], int]:
    """Records at or above ``from_offset`` in the consecutive batches of ``buf``.

    The first batch must start at ``expected_base`` and each next one where the previous
    ended: bytes from anywhere else are reported as corrupt, never returned.  Stops after
    about ``max_bytes`` of values (but returns at least one record, unless ``at_least_one``
    is False: then none if the first is larger).  Returns the records and the number of
    value bytes they hold.  ``partly_read(n, buf, pos, header)`` is called for a checked
    batch (the n-th of ``buf``) that the read stops inside of.
    """
    records: list[Record] = []
    total = 0
    pos = 0
    end = len(buf)
    index = -1
    while pos + 4 <= end:
        index += 1
        if buf[pos : pos + 4] == MAGIC_V1:
            pos, expected_base, total, full = _decode_v1(
                buf,
                pos,
                from_offset,
                max_bytes,
                expected_base,
                verify,
                records,
                total,
                at_least_one,
            )
            if full:
                return records, total
            continue
        header = parse_header(buf, pos)
        if header.base_offset != expected_base:
            raise CorruptBatch(
                f"batch of offset {header.base_offset} found where {expected_base} was due"
            )
        values: list[bytes] | None = None
        if verify:
            values = check_and_split(buf, pos, header)
        elif pos + header.size > end:
            raise CorruptBatch(f"batch at byte {pos} runs past the read")
        expected_base = header.next_offset
        count = header.count
        if count and header.next_offset > from_offset:
            lengths_at = pos + HEADER_SIZE + header.state_len
            lengths = struct.unpack_from(f"<{count}I", buf, lengths_at)
            ends = list(accumulate(lengths, initial=lengths_at + 4 * count))
            first, stop, taken = take_values(
                header,
                lengths,
                from_offset,
                max_bytes - total,
                at_least_one=at_least_one and not records,
            )
            ts = header.timestamp_ms
            base = header.base_offset
            if values is not None:
                records.extend(Record(base + i, values[i], ts) for i in range(first, stop))
            else:
                records.extend(
                    Record(base + i, buf[ends[i] : ends[i + 1]], ts) for i in range(first, stop)
                )
            total += taken
            if stop < count:
                if partly_read is not None and verify:
                    partly_read(index, buf, pos, header)
                return records, total
        pos += header.size
    return records, total


def _decode_v1(
    buf: bytes,
    pos: int,
    from_offset: int,
    max_bytes: int,
    expected_base: int,
    verify: bool,
    records: list[Record],
    total: int,
    at_least_one: bool,
) -> tuple[int, int, int, bool]:
    """Decode one ``LBB1`` batch into ``records``.

    Returns the next position, the next base offset, the value bytes now in ``records``, and
    whether ``max_bytes`` stopped it.
    """
    if pos + HEADER_V1.size > len(buf):
        raise CorruptBatch(f"batch header at byte {pos} is cut short")
    _, base, count, payload_len, ts, crc = HEADER_V1.unpack_from(buf, pos)
    if base != expected_base:
        raise CorruptBatch(f"batch of offset {base} found where {expected_base} was due")
    start = pos + HEADER_V1.size
    stop = start + payload_len
    if stop > len(buf):
        raise CorruptBatch(f"batch at byte {pos} runs past the read")
    if verify and zlib.crc32(memoryview(buf)[start:stop]) != crc:
        raise CorruptBatch(f"batch of offset {base} fails its checksum")
    p = start
    for offset in range(base, base + count):
        (n,) = _LEN_V1.unpack_from(buf, p)
        p += 4
        if offset >= from_offset:
            if (records or not at_least_one) and total + n > max_bytes:
                return stop, base + count, total, True
            records.append(Record(offset, buf[p : p + n], ts))
            total += n
        p += n
    return stop, base + count, total, False
