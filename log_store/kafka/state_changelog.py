"""The changelog of a partition's state area: deltas committed with the data, and snapshots.

Partition ``p`` of a data topic has partition ``p`` of its state topic as changelog.  Every
Kafka transaction of the partition's owner that changes state writes its *delta* there, in the
same transaction as the data records: the state keys it changed with their new values, and the
data partition's end offset after it.  So a chunk and the seqno that admits it commit together
or not at all, exactly as in the embedded store.

A delta is one record, or several when it is larger than one record may be (a request of
100,000 new sources with 500-character ids changes about 110 MB of keys; a topic takes
records of 16 MiB): :func:`delta_records` cuts it into parts of at most ``max_bytes`` each,
every part carrying the same data end.  The parts are records of one Kafka transaction, and
every reader of the changelog is read_committed and reads up to a last stable offset, which
never falls between the records of one transaction (it is the first offset of the oldest
transaction still open): a reader applies all of a transaction's parts or none of them.  So
a replay needs nothing to tell parts from whole deltas, and a version that wrote one record
per transaction reads the parts as it reads several transactions in a row.

Replaying one small record per key is slow (about 11 µs a record through librdkafka here, so
1.1 s for 100,000 sources), and a compacted log's uncompacted tail would have no bound.  So
the owner writes a *snapshot* (the whole table, in chunks of packed entries) whenever
replaying its tail would cost about as much as the table itself, in a transaction that also
commits the snapshot's offset as the position of the consumer group
``logbroker-state-snapshots`` (``send_offsets_to_transaction``), and then deletes the records
before it (``delete_records``).  A new owner reads that committed position, then the snapshot
and the deltas after it: its takeover reads at most about two tables' worth of entries,
whatever the partition's history.

An empty value is a deletion (the state area's ``FORGOTTEN``, as idle source expiry writes
it): a delta carries it like any change, replaying it removes the key, and the owner's table
and every snapshot leave the key out, so a table rebuilt by a new owner never holds a deleted
key and a snapshot's size follows the live keys only.

Record values (keys are unused)::

    delta:     b"LBD1" u64 data_end  entries      (one or more per transaction)
    snapshot:  b"LBS1" u64 data_end  u32 chunk_index  u32 chunk_count  entries
    entries:   (u16 key_len, u32 value_len, key UTF-8, value)*
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

DELTA_MAGIC = b"LBD1"
SNAPSHOT_MAGIC = b"LBS1"
_DELTA_HEAD = struct.Struct(">4sQ")
_SNAPSHOT_HEAD = struct.Struct(">4sQII")
_ENTRY_HEAD = struct.Struct(">HI")
SNAPSHOT_CHUNK_BYTES = 768 * 1024
DELTA_RECORD_BYTES = 768 * 1024
"""The largest delta record (but for one entry alone larger) a transaction writes, as large
as a snapshot chunk; an owner of topics with a smaller ``max.message.bytes`` writes records
of a quarter of it at most (see ``PartitionOwner``): far below the limit, also where
compression makes a record larger."""
MAX_KEY_BYTES = 65_535


class CorruptChangelog(ValueError):
    """A state record that is not a delta or snapshot this version can read."""


def encode_entries(items: Iterable[tuple[str, bytes]]) -> bytes:
    parts: list[bytes] = []
    pack = _ENTRY_HEAD.pack
    for key, value in items:
        raw_key = key.encode("utf-8")
        if len(raw_key) > MAX_KEY_BYTES:
            raise ValueError(f"state key of {len(raw_key)} bytes; at most {MAX_KEY_BYTES}")
        parts.append(pack(len(raw_key), len(value)))
        parts.append(raw_key)
        parts.append(value)
    return b"".join(parts)


def decode_entries(buf: bytes, pos: int, into: dict[str, bytes]) -> int:
    """Apply the entries in ``buf[pos:]`` to ``into`` (an empty value deletes its key);
    returns how many there were."""
    unpack = _ENTRY_HEAD.unpack_from
    end = len(buf)
    count = 0
    try:
        while pos < end:
            key_len, value_len = unpack(buf, pos)
            pos += 6
            key = buf[pos : pos + key_len].decode("utf-8")
            pos += key_len
            if value_len:
                into[key] = buf[pos : pos + value_len]
            else:
                into.pop(key, None)
            pos += value_len
            count += 1
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptChangelog(f"bad state entry at byte {pos}: {exc}") from None
    if pos != end:
        raise CorruptChangelog("a state entry runs past the end of its record")
    return count


def data_end_of(value: bytes) -> int | None:
    """The data partition's end offset a delta or snapshot record carries (None: neither)."""
    magic = value[:4]
    if magic == DELTA_MAGIC and len(value) >= _DELTA_HEAD.size:
        return int(_DELTA_HEAD.unpack_from(value, 0)[1])
    if magic == SNAPSHOT_MAGIC and len(value) >= _SNAPSHOT_HEAD.size:
        return int(_SNAPSHOT_HEAD.unpack_from(value, 0)[1])
    return None


def apply_changes(table: dict[str, bytes], changes: Mapping[str, bytes]) -> None:
    """Apply a transaction's state changes to a table as a replay of its delta would."""
    for key, value in changes.items():
        if value:
            table[key] = value
        else:
            table.pop(key, None)


def delta_records(
    data_end: int, changes: Mapping[str, bytes], max_bytes: int = DELTA_RECORD_BYTES
) -> list[bytes]:
    """A transaction's state changes as delta records of at most ``max_bytes`` each (one
    entry larger than that alone in its record), at least one.

    Each record is joined once from its entries' pieces: the delta of a large request is
    held about twice (the changes and the records), not four times."""
    records: list[bytes] = []
    head = _DELTA_HEAD.pack(DELTA_MAGIC, data_end)
    parts: list[bytes] = [head]
    size = len(head)
    pack = _ENTRY_HEAD.pack
    for key, value in changes.items():
        raw_key = key.encode("utf-8")
        if len(raw_key) > MAX_KEY_BYTES:
            raise ValueError(f"state key of {len(raw_key)} bytes; at most {MAX_KEY_BYTES}")
        entry_bytes = _ENTRY_HEAD.size + len(raw_key) + len(value)
        if size + entry_bytes > max_bytes and len(parts) > 1:
            records.append(b"".join(parts))
            parts, size = [head], len(head)
        parts.append(pack(len(raw_key), len(value)))
        parts.append(raw_key)
        parts.append(value)
        size += entry_bytes
    records.append(b"".join(parts))
    return records


def snapshot_records(
    data_end: int, table: Mapping[str, bytes], chunk_bytes: int = SNAPSHOT_CHUNK_BYTES
) -> list[bytes]:
    """The table as snapshot chunks of about ``chunk_bytes`` each (at least one)."""
    bodies: list[bytes] = []
    batch: list[tuple[str, bytes]] = []
    size = 0
    for key, value in table.items():
        if not value:
            continue  # a deletion (the owner's table holds none; a caller's might)
        batch.append((key, value))
        size += len(key) + len(value) + 6
        if size >= chunk_bytes:
            bodies.append(encode_entries(batch))
            batch, size = [], 0
    if batch or not bodies:
        bodies.append(encode_entries(batch))
    count = len(bodies)
    return [
        _SNAPSHOT_HEAD.pack(SNAPSHOT_MAGIC, data_end, i, count) + body
        for i, body in enumerate(bodies)
    ]


@dataclass
class ReplayedState:
    """A state table as replayed from the changelog up to ``position``."""

    table: dict[str, bytes] = field(default_factory=dict)
    position: int = 0
    """The changelog offset to continue from."""
    data_end: int | None = None
    """The data partition's end offset after the last transaction replayed (None: none yet)."""
    tail_records: int = 0
    """Delta records replayed since the last snapshot."""
    tail_entries: int = 0
    """State entries in those deltas."""

    def apply(self, offset: int, value: bytes) -> None:
        """Apply one changelog record (read in offset order, read_committed)."""
        magic = value[:4]
        if magic == DELTA_MAGIC:
            _, data_end = _DELTA_HEAD.unpack_from(value, 0)
            self.tail_entries += decode_entries(value, _DELTA_HEAD.size, self.table)
            self.tail_records += 1
        elif magic == SNAPSHOT_MAGIC:
            _, data_end, index, _count = _SNAPSHOT_HEAD.unpack_from(value, 0)
            if index == 0:
                self.table = {}
                self.tail_records = self.tail_entries = 0
            decode_entries(value, _SNAPSHOT_HEAD.size, self.table)
        else:
            raise CorruptChangelog(f"changelog record at {offset} is neither delta nor snapshot")
        self.data_end = data_end
        self.position = offset + 1
