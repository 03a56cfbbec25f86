"""The envelope every message of the log carries (Avro, schema in ``schemas/``).

A stored value is one version byte (``ENVELOPE_VERSION``) followed by the Avro binary encoding
of :data:`SCHEMA`.  A chunk of a structured log type (see ``schema_registry``) is stored with
version byte ``STRUCTURED_ENVELOPE_VERSION`` and :data:`STRUCTURED_SCHEMA`, which adds the id
of the schema its records were checked against after ``txn_id``; every other chunk keeps
version 1, byte for byte.

The fields that are constant for a source (source_id, server, file, log_type, codec, kind,
txn_id) come first, so :class:`EnvelopeWriter` encodes them once per source and the
per-chunk work is four varints and a copy of the data.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro

from log_store.errors import BadRequest

ENVELOPE_VERSION = 1
STRUCTURED_ENVELOPE_VERSION = 2
ENVELOPE_VERSIONS = (ENVELOPE_VERSION, STRUCTURED_ENVELOPE_VERSION)
_VERSION_BYTE = bytes([ENVELOPE_VERSION])
_STRUCTURED_VERSION_BYTE = bytes([STRUCTURED_ENVELOPE_VERSION])

SCHEMA_PATH = Path(__file__).with_name("schemas") / "envelope.v1.avsc"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
_PARSED = fastavro.parse_schema(SCHEMA)
STRUCTURED_SCHEMA_PATH = Path(__file__).with_name("schemas") / "envelope.v2.avsc"
STRUCTURED_SCHEMA: dict[str, Any] = json.loads(STRUCTURED_SCHEMA_PATH.read_text())
_PARSED_STRUCTURED = fastavro.parse_schema(STRUCTURED_SCHEMA)
_U64 = 0xFFFF_FFFF_FFFF_FFFF


def schema_id_to_long(schema_id: int) -> int:
    """A 64-bit schema id (unsigned) as the Avro ``long`` (signed) that carries it."""
    return schema_id - (1 << 64) if schema_id >= 1 << 63 else schema_id


CODECS = ("raw", "gzip", "zstd")
KINDS = ("chunk", "legacy_data", "legacy_commit", "handover")
"""``handover``: no data of the source; its seqno says that the source's data up to there was
acknowledged by another installation (see ``ExactlyOnceWriter.open_sessions``).  Readers skip
it; the seqno table and the audit count it like a chunk."""


@dataclass(frozen=True)
class Envelope:
    source_id: str
    server: str
    file: str
    log_type: str
    codec: str
    seqno: int
    create_time: int
    write_time: int
    data: bytes
    kind: str = "chunk"
    txn_id: str | None = None
    schema_id: int | None = None
    """The id (unsigned 64 bits) of the schema a structured chunk's records were checked
    against; ``None`` for a log type without a schema."""


def _zigzag_slow(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL_ZIGZAG = [_zigzag_slow(n) for n in range(8192)]


_zigzag_recent = functools.lru_cache(maxsize=4096)(_zigzag_slow)
"""Times (ms since the epoch) recur: a request's write time and its clients' create times."""


def _zigzag(n: int) -> bytes:
    """Avro's zigzag varint of ``n``; lengths and small numbers come from a table."""
    if 0 <= n < 8192:
        return _SMALL_ZIGZAG[n]
    return _zigzag_recent(n)


_CODEC_BYTES = {codec: _zigzag(i) for i, codec in enumerate(CODECS)}
_KIND_BYTES = {kind: _zigzag(i) for i, kind in enumerate(KINDS)}


def _avro_string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return _zigzag(len(raw)) + raw


class EnvelopeWriter:
    """Encodes the envelopes of one source; the constant fields are encoded once."""

    __slots__ = ("_prefix",)

    def __init__(
        self,
        *,
        source_id: str,
        server: str,
        file: str,
        log_type: str,
        codec: str = "raw",
        kind: str = "chunk",
        txn_id: str | None = None,
        schema_id: int | None = None,
    ) -> None:
        codec_byte = _CODEC_BYTES.get(codec)
        if codec_byte is None:
            raise BadRequest(f"unknown codec {codec!r}; use one of {', '.join(CODECS)}")
        kind_byte = _KIND_BYTES.get(kind)
        if kind_byte is None:
            raise BadRequest(f"unknown kind {kind!r}")
        source_raw = source_id.encode("utf-8")
        server_raw = server.encode("utf-8")
        file_raw = file.encode("utf-8")
        log_type_raw = log_type.encode("utf-8")
        self._prefix = b"".join(
            (
                _VERSION_BYTE if schema_id is None else _STRUCTURED_VERSION_BYTE,
                _zigzag(len(source_raw)),
                source_raw,
                _zigzag(len(server_raw)),
                server_raw,
                _zigzag(len(file_raw)),
                file_raw,
                _zigzag(len(log_type_raw)),
                log_type_raw,
                codec_byte,
                kind_byte,
                b"\x00" if txn_id is None else b"\x02" + _avro_string(txn_id),
                b"" if schema_id is None else b"\x02" + _zigzag(schema_id_to_long(schema_id)),
            )
        )

    def encode(
        self, seqno: int, create_time: int, write_time: int, data: bytes | memoryview
    ) -> bytes:
        """The stored value of one chunk of this source."""
        return b"".join(
            (
                self._prefix,
                _zigzag(seqno),
                _zigzag(create_time),
                _zigzag(write_time),
                _zigzag(len(data)),
                data,
            )
        )

    def encoder(self, write_time: int) -> Callable[[int, int, bytes | memoryview], bytes]:
        """``encode`` for many chunks written at one ``write_time``: same bytes, less work.

        The write time is encoded once, and a create time equal to the previous chunk's is
        not encoded again (clients stamp whole batches with one time).
        """
        prefix = self._prefix
        write_time_bytes = _zigzag(write_time)
        join = b"".join
        zigzag = _zigzag
        last_create_time = 0
        create_time_bytes = _zigzag(0)

        def encode_chunk(seqno: int, create_time: int, data: bytes | memoryview) -> bytes:
            nonlocal last_create_time, create_time_bytes
            if create_time != last_create_time:
                last_create_time = create_time
                create_time_bytes = zigzag(create_time)
            return join(
                (
                    prefix,
                    zigzag(seqno),
                    create_time_bytes,
                    write_time_bytes,
                    zigzag(len(data)),
                    data,
                )
            )

        return encode_chunk


def encode(envelope: Envelope) -> bytes:
    """The stored value of one envelope."""
    writer = EnvelopeWriter(
        source_id=envelope.source_id,
        server=envelope.server,
        file=envelope.file,
        log_type=envelope.log_type,
        codec=envelope.codec,
        kind=envelope.kind,
        txn_id=envelope.txn_id,
        schema_id=envelope.schema_id,
    )
    return writer.encode(envelope.seqno, envelope.create_time, envelope.write_time, envelope.data)


def decode(value: bytes) -> Envelope:
    """Decode a stored value; raises ``ValueError`` on anything that is not an envelope."""
    if not value or value[0] not in ENVELOPE_VERSIONS:
        raise ValueError("not a logbroker envelope (unknown version byte)")
    buf = io.BytesIO(value)
    buf.seek(1)
    structured = value[0] == STRUCTURED_ENVELOPE_VERSION
    rec = fastavro.schemaless_reader(buf, _PARSED_STRUCTURED if structured else _PARSED, None)
    if not isinstance(rec, dict):
        raise ValueError("not a logbroker envelope")
    if structured:
        rec["schema_id"] &= _U64
    return Envelope(**rec)
