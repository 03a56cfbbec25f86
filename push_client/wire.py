"""The write request of the rt protocol, binary framing ``application/x-logbroker-chunks``.

See docs/protocol.md: ``"LBW1"`` then per source a JSON meta and its chunks, big-endian.
The body is assembled from the chunks' buffers with one join: no per-line work.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

CONTENT_TYPE = "application/x-logbroker-chunks"
MAGIC = b"LBW1"
_META_LEN = struct.Struct(">H")
_COUNT = struct.Struct(">I")
_CHUNK_HEAD = struct.Struct(">QqI")


@dataclass(frozen=True)
class SourceMeta:
    """The constant fields of one source, as the gateway wants them."""

    log_type: str
    source_id: str
    server: str
    file: str
    codec: str

    def as_dict(self) -> dict[str, str]:
        return {
            "log_type": self.log_type,
            "source_id": self.source_id,
            "server": self.server,
            "file": self.file,
            "codec": self.codec,
        }

    def encoded(self, epoch: int | None = None, prev_seqno: int | None = None) -> bytes:
        """The section header: length and JSON, with the write conditions: ``epoch`` (the
        write is refused once a newer session fenced ours) and ``prev_seqno`` (refused as
        ``out_of_order`` unless the log already holds the source up to there)."""
        fields: dict[str, str | int] = dict(self.as_dict())
        if epoch is not None:
            fields["epoch"] = epoch
        if prev_seqno is not None:
            fields["prev_seqno"] = prev_seqno
        meta = orjson.dumps(fields)
        return _META_LEN.pack(len(meta)) + meta


@dataclass(frozen=True)
class WireChunk:
    """One chunk as sent: ``seqno`` is the byte offset of its end in the file."""

    seqno: int
    create_time_ms: int
    data: bytes | memoryview


def encode_write_body(sections: Sequence[tuple[bytes, Sequence[WireChunk]]]) -> bytes:
    """The body of one ``POST /v1/write``: ``sections`` are (encoded meta, chunks) pairs."""
    parts: list[bytes | memoryview] = [MAGIC]
    head = _CHUNK_HEAD.pack
    for meta, chunks in sections:
        parts.append(meta)
        parts.append(_COUNT.pack(len(chunks)))
        for chunk in chunks:
            parts.append(head(chunk.seqno, chunk.create_time_ms, len(chunk.data)))
            parts.append(chunk.data)
    return b"".join(parts)
