"""Read responses on the wire: JSON for people and scripts, a binary framing for throughput.

Binary ``application/x-logbroker-records`` (integers big-endian), one section per partition::

    body    := "LBR1" section*
    section := u16 meta_len, meta (UTF-8 JSON: {"topic", "partition", "start_offset",
                                                 "end_offset", "next_offset",
                                                 "not_envelopes": [{"offset", "reason"}],
                                                 "topic_id",
                                                 "error" (only if the partition is damaged,
                                                 not there, or of a topic made again)}),
               u32 count, record{count}
    record  := u64 offset, u32 value_len, value (value_len bytes: the stored envelope,
                                                 see session_dedup/envelope.py)

The values are sent as stored, so the server does no per-message encoding and a client
decodes only what it uses.  ``not_envelopes`` names the records the read left out because they
are not envelopes (a client of an older gateway finds no such key; one that does not know it
ignores it).  ``error`` is there only for a partition whose read starts at a batch that
fails its checksum: ``{"error": "corrupt_data", "reason", "offset"}``, no records, and
``next_offset`` where the read was; every read from there fails the same way.  In a fetch
of several partitions, one that is not there (its topic deleted, or made again with fewer
partitions) is answered with ``{"error": "unknown_topic" | "unknown_partition", "reason"}``,
no records and every offset where the read was.  ``topic_id`` is the identity of the topic
read (a gateway from before it was added sends none); a position that named another (the
topic was deleted and made again since its offset was read) is answered with
``{"error": "topic_recreated", "reason", "topic_id"}``, no records, ``topic_id`` the new one
and ``next_offset`` where the new topic starts.  A released
legacy transaction appears at its commit marker's offset with its
data record's envelope (``kind = legacy_data``).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from delivery.envelope_view import EnvelopeView, NotAnEnvelope, view
from delivery.partition_reader import DeliveredMessage, NotEnvelope, PartitionBatch
from log_store.errors import BadRequest, UnknownTopic

BINARY_MEDIA_TYPE = "application/x-logbroker-records"
JSON_MEDIA_TYPE = "application/json"
MAGIC = b"LBR1"
_SECTION_HEAD = struct.Struct(">H")
_COUNT = struct.Struct(">I")
_RECORD_HEAD = struct.Struct(">QI")


class BadFraming(BadRequest):
    """A binary read response that does not parse."""


def batch_meta(batch: PartitionBatch) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "topic": batch.topic,
        "partition": batch.partition,
        "start_offset": batch.start_offset,
        "end_offset": batch.end_offset,
        "next_offset": batch.next_offset,
        "not_envelopes": [{"offset": n.offset, "reason": n.reason} for n in batch.not_envelopes],
        "topic_id": batch.topic_id,
    }
    if batch.recreated is not None:
        meta["error"] = {
            "error": "topic_recreated",
            "reason": batch.recreated,
            "topic_id": batch.topic_id,
        }
    elif batch.corrupt is not None:
        meta["error"] = {
            "error": "corrupt_data",
            "reason": str(batch.corrupt),
            "offset": batch.corrupt.offset,
        }
    elif batch.gone is not None:
        code = "unknown_topic" if isinstance(batch.gone, UnknownTopic) else "unknown_partition"
        meta["error"] = {"error": code, "reason": str(batch.gone)}
    return meta


def not_envelopes_of(meta: dict[str, Any]) -> list[NotEnvelope] | None:
    """The records a section's read left out because they are not envelopes, from its meta;
    None if the gateway does not say (a version from before it did)."""
    named = meta.get("not_envelopes")
    if named is None:
        return None
    return [NotEnvelope(int(n["offset"]), str(n["reason"])) for n in named]


def message_json(topic: str, partition: int, message: DeliveredMessage) -> dict[str, Any]:
    """One message as a JSON object: metadata plus ``data`` (text) or ``data_b64``."""
    env = message.view
    if env is None:
        try:
            env = view(message.value)
        except NotAnEnvelope:
            return {
                "topic": topic,
                "partition": partition,
                "offset": message.offset,
                "kind": "unknown",
                "value_b64": base64.b64encode(message.value).decode(),
            }
    out: dict[str, Any] = {
        "topic": topic,
        "partition": partition,
        "offset": message.offset,
        "source_id": env.source_id,
        "seqno": env.seqno,
        "server": env.server,
        "file": env.file,
        "log_type": env.log_type,
        "codec": env.codec,
        "create_time": env.create_time,
        "write_time": env.write_time,
    }
    if env.kind != "chunk":
        out["kind"] = env.kind
        out["txn_id"] = env.txn_id
    if env.schema_id is not None:
        out["schema_id"] = f"{env.schema_id:016x}"  # as the schema registry names it
    if message.data_offset is not None:
        out["data_offset"] = message.data_offset
    _put_data(out, env)
    return out


def _put_data(out: dict[str, Any], env: EnvelopeView) -> None:
    data = env.data
    text = _utf8(data) if env.codec == "raw" else None
    if text is not None:
        out["data"] = text
    else:
        out["data_b64"] = base64.b64encode(data).decode()


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def encode_json_single(batch: PartitionBatch) -> bytes:
    """The single-partition read answer: the batch's bounds plus its messages."""
    body = batch_meta(batch)
    body["messages"] = [message_json(batch.topic, batch.partition, m) for m in batch.messages]
    return orjson.dumps(body)


def encode_json_multi(batches: Sequence[PartitionBatch]) -> bytes:
    """The multi-partition (fetch) answer: one entry per partition, in request order."""
    return orjson.dumps(
        {
            "partitions": [
                {
                    **batch_meta(b),
                    "messages": [message_json(b.topic, b.partition, m) for m in b.messages],
                }
                for b in batches
            ]
        }
    )


def encode_binary(batches: Sequence[PartitionBatch]) -> bytes:
    return b"".join(binary_pieces(batches))


def binary_pieces(batches: Sequence[PartitionBatch]) -> list[bytes]:
    """The binary answer as the pieces it is made of, in order: the stored values are pieces
    of their own, so an answer can be sent without joining them first."""
    parts: list[bytes] = [MAGIC]
    for batch in batches:
        meta = orjson.dumps(batch_meta(batch))
        parts.append(_SECTION_HEAD.pack(len(meta)))
        parts.append(meta)
        parts.append(_COUNT.pack(len(batch.messages)))
        pack = _RECORD_HEAD.pack
        for m in batch.messages:
            parts.append(pack(m.offset, len(m.value)))
            parts.append(m.value)
    return parts


def coalesced(pieces: Sequence[bytes], size: int) -> Iterator[bytes]:
    """``pieces`` in order, small neighbours joined into blocks of about ``size`` bytes and a
    piece of ``size`` or more passed on as it is (not copied)."""
    small: list[bytes] = []
    held = 0
    for piece in pieces:
        if len(piece) >= size:
            if small:
                yield b"".join(small)
                small, held = [], 0
            yield piece
            continue
        small.append(piece)
        held += len(piece)
        if held >= size:
            yield b"".join(small)
            small, held = [], 0
    if small:
        yield b"".join(small)


@dataclass(frozen=True)
class BinarySection:
    meta: dict[str, Any]
    records: list[tuple[int, bytes]]


def decode_binary(body: bytes) -> list[BinarySection]:
    """Parse a binary read answer into its sections; raises :class:`BadFraming`."""
    return decode_binary_stream(iter((body,)))


class _ChunkReader:
    """A body that arrives in chunks, read as exact-length pieces."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._chunk = b""
        self._pos = 0

    def _next_chunk(self) -> bool:
        for chunk in self._chunks:
            if chunk:
                self._chunk = chunk
                self._pos = 0
                return True
        return False

    def at_end(self) -> bool:
        return self._pos >= len(self._chunk) and not self._next_chunk()

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes, copied once; raises :class:`BadFraming` if the body ends first."""
        chunk, pos = self._chunk, self._pos
        if pos + n <= len(chunk):
            self._pos = pos + n
            return chunk[pos : pos + n]
        pieces = [memoryview(chunk)[pos:]]
        need = n - (len(chunk) - pos)
        while need > 0:
            if not self._next_chunk():
                raise BadFraming("the binary answer ends inside a section")
            part = min(need, len(self._chunk))
            pieces.append(memoryview(self._chunk)[:part])
            self._pos = part
            need -= part
        return b"".join(pieces)


def decode_binary_stream(chunks: Iterator[bytes]) -> list[BinarySection]:
    """The sections of a binary read answer that arrives as ``chunks`` (a whole one is one
    chunk), each value copied once out of the chunks (no join of the whole answer first);
    raises :class:`BadFraming`."""
    body = _ChunkReader(chunks)
    if body.at_end() or body.take(len(MAGIC)) != MAGIC:
        raise BadFraming("binary answer does not start with LBR1")
    sections: list[BinarySection] = []
    while not body.at_end():
        (meta_len,) = _SECTION_HEAD.unpack(body.take(_SECTION_HEAD.size))
        try:
            meta = orjson.loads(body.take(meta_len))
        except orjson.JSONDecodeError as exc:
            raise BadFraming(f"bad section header: {exc}") from None
        (count,) = _COUNT.unpack(body.take(_COUNT.size))
        records: list[tuple[int, bytes]] = []
        for _ in range(count):
            offset, length = _RECORD_HEAD.unpack(body.take(_RECORD_HEAD.size))
            records.append((offset, body.take(length)))
        sections.append(BinarySection(meta, records))
    return sections
