"""Checking every batch of a segment against its checksum, state-only batches included.

A read checks the batches it reads; but a batch that carries only state updates (a fencing
session open, an expiry) holds no record, so no read ever reads it, and only recovery would
(when the index lags it).  The audit walks each indexed segment from its first byte to its
indexed end instead: every batch must be whole, follow on from the one before and match its
CRC.  After a batch that fails, the walk goes on where its header says it ends if a batch that
follows on starts there, and otherwise at the next batch the index knows of.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence

from log_store.record_batch import (
    HEADER_SIZE,
    HEADER_V1,
    MAGIC_V1,
    CorruptBatch,
    check_crc,
    parse_header,
)


def _describe(count: int) -> str:
    return "state only" if count == 0 else f"{count} record(s)"


def check_segment(
    fd: int, segment: int, indexed_size: int, indexed: Sequence[tuple[int, int]]
) -> list[str]:
    """Problems with the batches of one segment file, up to ``indexed_size`` bytes.

    ``indexed`` are the (position, base offset) of the segment's record batches, as the index
    has them, in position order: where the walk picks up again after a damaged batch.
    """
    problems: list[str] = []
    where = f"segment {segment}"
    pos = 0
    expected = segment
    while pos < indexed_size:
        head = os.pread(fd, HEADER_SIZE, pos)
        if head[:4] == MAGIC_V1 and len(head) >= HEADER_V1.size:
            _, base, count, payload_len, _ts, crc = HEADER_V1.unpack_from(head)
            size, next_base = HEADER_V1.size + payload_len, base + count
            body = os.pread(fd, payload_len, pos + HEADER_V1.size)
            good = len(body) == payload_len and zlib.crc32(body) == crc
        else:
            try:
                header = parse_header(head)
            except CorruptBatch as exc:
                if len(head) < HEADER_SIZE:
                    problems.append(
                        f"{where} ends at byte {pos + len(head)}, before the {indexed_size} "
                        "bytes its index says were written"
                    )
                    return problems
                problems.append(f"{where} byte {pos}: no batch there ({exc})")
                resumed = _resume_after(pos, indexed)
                if resumed is None:
                    return problems
                pos, expected = resumed
                continue
            base, count, size, next_base = (
                header.base_offset,
                header.count,
                header.size,
                header.next_offset,
            )
            body = os.pread(fd, size, pos)
            try:
                check_crc(body, 0, header)
                good = True
            except CorruptBatch:
                good = False
        if base != expected:
            problems.append(f"{where} byte {pos}: batch of offset {base} where {expected} was due")
        if pos + size > indexed_size:
            problems.append(
                f"{where} byte {pos}: batch of offset {base} runs past the {indexed_size} "
                "bytes the index says were written"
            )
            return problems
        if good:
            pos, expected = pos + size, next_base
            continue
        problems.append(
            f"{where} byte {pos}: batch of offset {base} ({_describe(count)}) fails its checksum"
        )
        if _follows_on(fd, pos + size, next_base, indexed_size):
            pos, expected = pos + size, next_base
            continue
        resumed = _resume_after(pos, indexed)
        if resumed is None:
            return problems
        pos, expected = resumed
    return problems


def _follows_on(fd: int, pos: int, base: int, indexed_size: int) -> bool:
    """Whether the segment ends at ``pos`` or a batch of offset ``base`` starts there."""
    if pos == indexed_size:
        return True
    if pos > indexed_size:
        return False
    head = os.pread(fd, HEADER_SIZE, pos)
    try:
        return parse_header(head).base_offset == base
    except CorruptBatch:
        return head[:4] == MAGIC_V1 and HEADER_V1.unpack_from(head)[1] == base


def _resume_after(pos: int, indexed: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """The (position, base offset) of the first indexed batch after byte ``pos``."""
    for at, base in indexed:
        if at > pos:
            return at, base
    return None
