"""A fast read-only view of a stored envelope's fields, without copying its data.

Filters and the transaction filter look at every record a reader scans; decoding the whole
Avro record with fastavro would copy each chunk's data only to throw most of it away.  This
parser walks the fixed field order of ``session_dedup/schemas/envelope.v1.avsc`` (and v2's, which
adds ``schema_id`` after ``txn_id``) and records
where the data lies inside the value.
"""

from __future__ import annotations

from dataclasses import dataclass

from session_dedup.envelope import (
    CODECS,
    ENVELOPE_VERSIONS,
    KINDS,
    STRUCTURED_ENVELOPE_VERSION,
    Envelope,
)


class NotAnEnvelope(ValueError):
    """A stored value that does not parse as an envelope of a known version."""


@dataclass(frozen=True, slots=True)
class EnvelopeView:
    """The fields of one stored envelope; ``data`` is a slice of the stored value."""

    source_id: str
    server: str
    file: str
    log_type: str
    codec: str
    kind: str
    txn_id: str | None
    seqno: int
    create_time: int
    write_time: int
    data_start: int
    value: bytes
    schema_id: int | None = None

    @property
    def data(self) -> bytes:
        return self.value[self.data_start :]

    def to_envelope(self) -> Envelope:
        return Envelope(
            source_id=self.source_id,
            server=self.server,
            file=self.file,
            log_type=self.log_type,
            codec=self.codec,
            seqno=self.seqno,
            create_time=self.create_time,
            write_time=self.write_time,
            data=self.data,
            kind=self.kind,
            txn_id=self.txn_id,
            schema_id=self.schema_id,
        )


def _varint(value: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    acc = 0
    while True:
        try:
            byte = value[pos]
        except IndexError:
            raise NotAnEnvelope("truncated envelope") from None
        pos += 1
        acc |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (acc >> 1) ^ -(acc & 1), pos
        shift += 7
        if shift > 63:
            raise NotAnEnvelope("varint longer than 64 bits")


def _string(value: bytes, pos: int) -> tuple[str, int]:
    length, pos = _varint(value, pos)
    end = pos + length
    if length < 0 or end > len(value):
        raise NotAnEnvelope("string runs past the end of the envelope")
    try:
        return value[pos:end].decode("utf-8"), end
    except UnicodeDecodeError:
        raise NotAnEnvelope("string is not UTF-8") from None


def _enum(value: bytes, pos: int, symbols: tuple[str, ...]) -> tuple[str, int]:
    index, pos = _varint(value, pos)
    if not 0 <= index < len(symbols):
        raise NotAnEnvelope(f"enum index {index} outside {symbols}")
    return symbols[index], pos


def view(value: bytes) -> EnvelopeView:
    """Parse a stored value; raises :class:`NotAnEnvelope` on anything else."""
    if not value or value[0] not in ENVELOPE_VERSIONS:
        raise NotAnEnvelope("unknown envelope version byte")
    source_id, pos = _string(value, 1)
    server, pos = _string(value, pos)
    file, pos = _string(value, pos)
    log_type, pos = _string(value, pos)
    codec, pos = _enum(value, pos, CODECS)
    kind, pos = _enum(value, pos, KINDS)
    branch, pos = _varint(value, pos)
    txn_id: str | None = None
    if branch == 1:
        txn_id, pos = _string(value, pos)
    elif branch != 0:
        raise NotAnEnvelope("bad txn_id union branch")
    schema_id: int | None = None
    if value[0] == STRUCTURED_ENVELOPE_VERSION:
        branch, pos = _varint(value, pos)
        if branch == 1:
            signed, pos = _varint(value, pos)
            schema_id = signed & 0xFFFF_FFFF_FFFF_FFFF
        elif branch != 0:
            raise NotAnEnvelope("bad schema_id union branch")
    seqno, pos = _varint(value, pos)
    create_time, pos = _varint(value, pos)
    write_time, pos = _varint(value, pos)
    data_len, pos = _varint(value, pos)
    if data_len < 0 or pos + data_len != len(value):
        raise NotAnEnvelope("data length does not match the envelope's size")
    return EnvelopeView(
        source_id=source_id,
        server=server,
        file=file,
        log_type=log_type,
        codec=codec,
        kind=kind,
        txn_id=txn_id,
        seqno=seqno,
        create_time=create_time,
        write_time=write_time,
        data_start=pos,
        value=value,
        schema_id=schema_id,
    )


def kind_of(value: bytes) -> str:
    """Only the ``kind`` field: skips the four strings without decoding them."""
    if not value or value[0] not in ENVELOPE_VERSIONS:
        raise NotAnEnvelope("unknown envelope version byte")
    pos = 1
    for _ in range(4):
        length, pos = _varint(value, pos)
        pos += length
    _codec, pos = _varint(value, pos)
    kind, _ = _enum(value, pos, KINDS)
    return kind
