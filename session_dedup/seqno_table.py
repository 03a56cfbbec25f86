"""The per-source last seqno of a partition, kept in the partition's state area.

Beside it, a source may have a writer *epoch*: a session opened with ``fence`` bumps it, and a
write that names an older epoch is refused, so a writer that was replaced (a client killed and
restarted while a request of it was still in flight) cannot write after its successor began.

The state area commits in the same transaction as the records it admits (see
``log_store.interface``), so the table is never behind or ahead of the log: a crash loses both
or neither, and a session can be answered from the table alone, without scanning the log.
:func:`rebuild_from_records` derives the same table from the log itself (for audits).

Both values carry the time the gateway last changed them (:func:`encode_source_value`): a
source neither written nor fenced for ``limits.source_idle_expiry_s`` is forgotten by
:mod:`session_dedup.source_expiry`.  Values written before that existed are 8 bytes, without
a time; an empty value is a forgotten one (a deletion).
"""

from __future__ import annotations

from collections.abc import Iterable

from log_store.interface import PartitionState, Record
from session_dedup.envelope import decode

_SEQNO_BYTES = 8
SEQUENCED_KINDS = frozenset({"chunk", "handover"})
"""Envelope kinds that move their source's last seqno."""


def seqno_key(source_id: str) -> str:
    """The state-area key of a source's last written seqno."""
    return f"seq/{source_id}"


def epoch_key(source_id: str) -> str:
    """The state-area key of a source's writer epoch (bumped by a fencing session open)."""
    return f"epoch/{source_id}"


SOURCE_COUNT_KEY = "sources/count"
"""The state-area key of how many sources have state in the partition (counted since the
source limit exists: sources written by an older release are not in the count)."""


def admit_new_source(state: PartitionState, maximum: int) -> bool:
    """Count a source that gets its first state in this partition; False (nothing changed) if
    the partition holds ``maximum`` sources already."""
    count = decode_seqno(state.get(SOURCE_COUNT_KEY))
    if count >= maximum:
        return False
    state.put(SOURCE_COUNT_KEY, encode_seqno(count + 1))
    return True


FORGOTTEN = b""
"""The value that deletes a key of the state area (see ``log_store.interface``)."""


def present(value: bytes | None) -> bytes | None:
    """``value``, or None if the key is absent or was forgotten."""
    return value or None


def forget_source(state: PartitionState, source_id: str) -> None:
    """Delete a source's last seqno and epoch, and take it out of the partition's count."""
    for key in (seqno_key(source_id), epoch_key(source_id)):
        if present(state.get(key)) is not None:
            state.put(key, FORGOTTEN)
    count = decode_seqno(state.get(SOURCE_COUNT_KEY))
    if count > 0:
        state.put(SOURCE_COUNT_KEY, encode_seqno(count - 1))


def encode_seqno(seqno: int) -> bytes:
    return seqno.to_bytes(_SEQNO_BYTES, "big")


def encode_source_value(number: int, changed_ms: int) -> bytes:
    """A source's last seqno (or epoch) and when the gateway set it (ms since the epoch)."""
    return number.to_bytes(_SEQNO_BYTES, "big") + changed_ms.to_bytes(_SEQNO_BYTES, "big")


def decode_seqno(value: bytes | None) -> int:
    """The stored last seqno (or epoch, or count); 0 for a source never written."""
    if not value:
        return 0
    if len(value) not in (_SEQNO_BYTES, 2 * _SEQNO_BYTES):
        raise ValueError(f"a stored seqno is {_SEQNO_BYTES} bytes, got {len(value)}")
    return int.from_bytes(value[:_SEQNO_BYTES], "big")


def changed_ms(value: bytes) -> int | None:
    """When a source value was set, or None for a value written without its time."""
    if len(value) != 2 * _SEQNO_BYTES:
        return None
    return int.from_bytes(value[_SEQNO_BYTES:], "big")


def last_seqno(state: PartitionState, source_id: str) -> int:
    """The source's last written seqno as the transaction sees it (0 if never written)."""
    return decode_seqno(state.get(seqno_key(source_id)))


def rebuild_from_records(records: Iterable[Record]) -> dict[str, int]:
    """The last seqno of every source that wrote chunk (or handover) envelopes in ``records``.

    Records that are not envelopes, and envelopes of other kinds, are skipped.
    """
    table: dict[str, int] = {}
    for record in records:
        try:
            envelope = decode(record.value)
        except ValueError:
            continue
        if envelope.kind not in SEQUENCED_KINDS:
            continue
        if envelope.seqno > table.get(envelope.source_id, 0):
            table[envelope.source_id] = envelope.seqno
    return table
