"""Reading back the batches a segment holds past its last indexed one.

The segment files are the partition's truth; the SQLite index and state area are synced
lazily and may lag them after a power cut (or a writer killed between its segment sync and
its index commit).  Recovery walks the segment from the indexed end: every whole batch whose
base offset follows on and whose CRC matches is committed data and is replayed into the index
and the state area; the first batch that is cut short, fails its CRC or does not follow on is
where the log ends, and everything from there on is cut off (it was never acknowledged: an
ack waits for the segment's fdatasync, and fdatasync covers every earlier byte of the file).
A batch that fails its CRC although a whole batch follows on from it was not cut short by a
crash but damaged afterwards: recovery then refuses the partition (``DamagedSegment``) rather
than cut acknowledged batches or apply damaged state.
This is Kafka's recovery from its recovery point, with the producer state carried in the
batches themselves.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from log_store.record_batch import (
    HEADER_SIZE,
    BatchHeader,
    CorruptBatch,
    check_crc,
    decode_state,
    parse_header,
)


class DamagedSegment(CorruptBatch):
    """A batch past the index fails its checksum although whole batches follow it."""


@dataclass(frozen=True, slots=True)
class TailBatch:
    """One whole, checked batch found past the index: where it is and what it commits."""

    header: BatchHeader
    pos: int
    state: dict[str, bytes]


def scan_tail(fd: int, pos: int, expected_base: int) -> Iterator[TailBatch]:
    """The whole batches of the file ``fd`` from byte ``pos`` on, while they follow on.

    Stops (without an error) at the first position that does not hold the next batch; the
    caller cuts the file there.
    """
    file_size = os.fstat(fd).st_size
    while pos + HEADER_SIZE <= file_size:
        try:
            header = parse_header(os.pread(fd, HEADER_SIZE, pos))
        except CorruptBatch:
            return
        if header.base_offset != expected_base or pos + header.size > file_size:
            return
        body = os.pread(fd, header.size, pos)
        try:
            check_crc(body, 0, header)
        except CorruptBatch:
            if _whole_batch_at(fd, pos + header.size, header.next_offset, file_size):
                raise DamagedSegment(
                    f"the batch of offset {header.base_offset} at byte {pos} fails its "
                    "checksum, and a whole batch follows it: the data was damaged after it "
                    "was written (a crash cuts only the last batch short), so nothing is "
                    "replayed or cut; restore the partition from a copy"
                ) from None
            return
        yield TailBatch(header, pos, decode_state(body, 0, header))
        pos += header.size
        expected_base = header.next_offset


def _whole_batch_at(fd: int, pos: int, base: int, file_size: int) -> bool:
    """Whether a whole batch of offset ``base`` that matches its CRC starts at ``pos``."""
    if pos + HEADER_SIZE > file_size:
        return False
    try:
        header = parse_header(os.pread(fd, HEADER_SIZE, pos))
    except CorruptBatch:
        return False
    if header.base_offset != base or pos + header.size > file_size:
        return False
    try:
        check_crc(os.pread(fd, header.size, pos), 0, header)
    except CorruptBatch:
        return False
    return True
