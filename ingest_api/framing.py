"""Decoding ``POST /v1/write`` bodies: the binary chunk framing and NDJSON.

Binary, ``application/x-logbroker-chunks`` (integers big-endian)::

    body    := "LBW1" section+
    section := u16 meta_len, meta (UTF-8 JSON object: log_type, source_id, server, file, codec,
               and optionally the write conditions epoch and prev_seqno),
               u32 chunk_count, chunk{chunk_count}
    chunk   := u64 seqno, i64 create_time_ms, u32 data_len, data

A chunk's data stays a ``memoryview`` into the body (into the piece of it that the socket
delivered, for a write: the pieces are not joined) until its envelope is encoded, so decoding
costs one struct unpack and three list appends per chunk; only a chunk that straddles two
pieces is copied, joined.

Two kinds of defect: a body that cannot be cut into sections (bad framing, a meta that is not
JSON, too many chunks, no section at all) rejects the whole request before anything is
written; a section whose meta, seqnos or chunk sizes fail validation is *refused* on its own
(:attr:`Section.error`), together with every other section of the same source in the
request, and the others are written as usual.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ingest_api.errors import ApiError
from ingest_api.settings import Limits
from log_store.errors import BadRequest
from session_dedup.exactly_once import ChunkBatch
from session_dedup.source import (
    MAX_CREATE_TIME_MS,
    MAX_SEQNO,
    SourceMeta,
    source_meta,
    usual_source_meta,
)

BINARY_MEDIA_TYPE = "application/x-logbroker-chunks"
NDJSON_MEDIA_TYPE = "application/x-ndjson"
MAGIC = b"LBW1"

_META_LEN = struct.Struct(">H")
_COUNT = struct.Struct(">I")
_CHUNK = struct.Struct(">QqI")
_META_KEYS = frozenset({"log_type", "source_id", "server", "file", "codec"})
_CONDITION_KEYS = frozenset({"epoch", "prev_seqno"})
_SECTION_KEYS = _META_KEYS | _CONDITION_KEYS
_NDJSON_KEYS = _SECTION_KEYS | {"seqno", "data", "data_b64", "create_time"}


@dataclass(slots=True)
class Section:
    """The chunks of one source in a request, in request order.

    ``error`` is set when the section is refused (nothing of it is written); its ``meta`` may
    then be a placeholder carrying only the source id the client sent, if any.
    """

    meta: SourceMeta
    batch: ChunkBatch
    error: ApiError | None = None

    @classmethod
    def refused(cls, raw_meta: object, error: ApiError) -> Section:
        source_id = raw_meta.get("source_id") if isinstance(raw_meta, dict) else None
        placeholder = SourceMeta("", source_id if isinstance(source_id, str) else "")
        return cls(placeholder, ChunkBatch([], [], []), error)


def refuse_whole_sources(sections: list[Section]) -> None:
    """A source is written or refused as a whole: refuse every section of a refused source.

    Otherwise a later section of a source could be written over the gap an earlier refused
    one left, and the refused chunks would come back as ``duplicate`` when resent.
    """
    refused = {s.meta.source_id: s.error for s in sections if s.error is not None}
    if not refused:
        return
    for section in sections:
        error = refused.get(section.meta.source_id)
        if section.error is None and error is not None:
            section.error = error


def _bad(reason: str) -> ApiError:
    return ApiError(400, "bad_framing", reason)


def _nothing(what: str) -> ApiError:
    """A body with nothing to write: answering 200 to it would tell a client whose chunks
    never reached the gateway (an HTTP/1.0 body without ``Content-Length`` is not read at all)
    that they are stored."""
    return _bad(
        f"the body holds no chunk ({what}): nothing was written; a request without "
        "Content-Length or chunked encoding has no body"
    )


def _too_many(limits: Limits) -> ApiError:
    return ApiError(
        413,
        "too_many_chunks",
        f"a request may hold at most {limits.max_chunks_per_request} chunks",
    )


def _chunk_too_large(size: int, limits: Limits) -> ApiError:
    return ApiError(
        413,
        "chunk_too_large",
        f"a chunk of {size} bytes is over the limit of {limits.max_chunk_bytes} bytes",
    )


def meta_from_json(obj: Any, where: str) -> SourceMeta:
    """Validate a JSON meta object (400 naming ``where`` and the field if it is bad)."""
    if not isinstance(obj, dict):
        raise _bad(f"{where}: meta must be a JSON object")
    usual = usual_source_meta(obj)
    if usual is not None:
        return usual
    if not obj.keys() <= _META_KEYS:
        unknown = obj.keys() - _META_KEYS
        raise _bad(f"{where}: unknown meta fields {sorted(unknown)[:5]}")
    if None in obj.values():
        raise ApiError(400, "bad_meta", f"{where}: meta fields must not be null")
    try:
        return source_meta(
            log_type=obj.get("log_type"),
            source_id=obj.get("source_id"),
            server=obj.get("server"),
            file=obj.get("file"),
            codec=obj.get("codec"),
        )
    except BadRequest as exc:
        raise ApiError(400, "bad_meta", f"{where}: {exc}") from None


def _condition(obj: dict[str, Any], name: str, where: str) -> int | None:
    if name not in obj:
        return None
    value = obj[name]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_SEQNO:
        raise ApiError(400, "bad_meta", f"{where}: {name} must be an integer in 0 .. 2**63-1")
    return value


def _section_meta(obj: Any, where: str) -> tuple[SourceMeta, int | None, int | None]:
    """A section's source meta and its write conditions (``epoch``, ``prev_seqno``)."""
    if not isinstance(obj, dict):
        raise _bad(f"{where}: meta must be a JSON object")
    if obj.keys() <= _META_KEYS:  # the usual section: no write conditions
        return meta_from_json(obj, where), None, None
    unknown = obj.keys() - _SECTION_KEYS
    if unknown:
        raise _bad(f"{where}: unknown meta fields {sorted(unknown)[:5]}")
    meta = meta_from_json({k: v for k, v in obj.items() if k in _META_KEYS}, where)
    return meta, _condition(obj, "epoch", where), _condition(obj, "prev_seqno", where)


def _check_seqnos(seqnos: list[int], where: str) -> None:
    if seqnos and (min(seqnos) < 1 or max(seqnos) > MAX_SEQNO):
        bad = next(s for s in seqnos if s < 1 or s > MAX_SEQNO)
        raise ApiError(400, "bad_seqno", f"{where}: seqno {bad} is outside 1 .. 2**63-1")


def _check_create_times(create_times: list[int], where: str) -> None:
    if create_times and (min(create_times) < 0 or max(create_times) > MAX_CREATE_TIME_MS):
        bad = next(t for t in create_times if not 0 <= t <= MAX_CREATE_TIME_MS)
        raise _bad_create_time(bad, where)


def _bad_create_time(value: object, where: str) -> ApiError:
    """A create time every reader of the log can hold (Spark's TIMESTAMP among them)."""
    return ApiError(
        400,
        "bad_meta",
        f"{where}: create_time {str(value)[:40]} is not an integer of milliseconds in "
        f"0 .. {MAX_CREATE_TIME_MS} (1970-01-01 .. 9999-12-31 UTC)",
    )


class _Pieces:
    """A body as the pieces it arrived in, read from front to back: what lies within one piece
    is taken as a view into it, what straddles two is joined (a copy of that part alone).

    Joining the pieces first copied every byte of every body once more."""

    __slots__ = ("_at", "_end", "_next", "_piece", "_pieces", "_view", "left")

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self._pieces = pieces
        self._next = 0
        self._piece = b""
        self._view = memoryview(self._piece)
        self._at = self._end = 0
        self.left = sum(map(len, pieces))
        """Bytes not taken yet."""

    def _advance(self) -> None:
        self._piece = self._pieces[self._next]
        self._view = memoryview(self._piece)
        self._next += 1
        self._at = 0
        self._end = len(self._piece)

    def take(self, n: int) -> bytes | memoryview:
        """The next ``n`` bytes (at most :attr:`left`)."""
        at = self._at
        if at + n <= self._end:
            self._at = at + n
            self.left -= n
            return self._view[at : at + n]
        self.left -= n
        parts = [self._view[at:]]
        n -= self._end - at
        while n > 0:
            self._advance()
            part = min(n, self._end)
            parts.append(self._view[:part])
            self._at = part
            n -= part
        return b"".join(parts)

    def unpack(self, fields: struct.Struct) -> tuple[Any, ...]:
        """The next ``fields.size`` bytes (at most :attr:`left`), unpacked."""
        at = self._at
        if at + fields.size <= self._end:
            self._at = at + fields.size
            self.left -= fields.size
            return fields.unpack_from(self._piece, at)
        return fields.unpack(self.take(fields.size))


def parse_binary(body: bytes | list[bytes], limits: Limits) -> list[Section]:
    """The sections of a binary body, at least one; raises :class:`ApiError` (400/413) on any
    defect.  ``body`` may be the pieces it arrived in (``body.read_body_pieces``): each chunk
    is then a view into its piece, unless it straddles two."""
    pieces = body if isinstance(body, list) else [body]
    reader = _Pieces(pieces)
    if not reader.left:
        raise _nothing("it is empty")
    if reader.left < len(MAGIC) or reader.take(len(MAGIC)) != MAGIC:
        raise _bad(f"a binary body starts with {MAGIC!r}")
    sections: list[Section] = []
    total_chunks = 0
    max_chunks = limits.max_chunks_per_request
    take = reader.take
    unpack = reader.unpack
    max_chunk = limits.max_chunk_bytes
    loads = orjson.loads
    usual_meta = usual_source_meta
    while reader.left:
        if reader.left < 2:
            raise _bad(f"{_where(sections)}: truncated before its meta length")
        (meta_len,) = unpack(_META_LEN)
        if meta_len + 4 > reader.left:
            raise _bad(f"{_where(sections)}: truncated inside its meta or chunk count")
        try:
            meta_obj = loads(take(meta_len))
        except orjson.JSONDecodeError as exc:
            raise _bad(f"{_where(sections)}: meta is not UTF-8 JSON ({exc})") from None
        error: ApiError | None = None
        epoch = prev_seqno = None
        meta = usual_meta(meta_obj) if type(meta_obj) is dict else None
        if meta is None:  # conditions, non-ASCII text, a new log type, or a bad meta
            try:
                meta, epoch, prev_seqno = _section_meta(meta_obj, _where(sections))
            except ApiError as exc:
                error = exc
        (count,) = unpack(_COUNT)
        # an empty section still costs a route and a transaction: it counts as one chunk
        total_chunks += count or 1
        if total_chunks > max_chunks:
            raise _too_many(limits)
        # 20 header bytes per chunk at least: a count the body cannot hold is a lie
        if 20 * count > reader.left:
            raise _bad(
                f"{_where(sections)}: {count} chunks announced, the body is too short for them"
            )
        seqnos: list[int] = []
        create_times: list[int] = []
        datas: list[bytes | memoryview] = []
        for i in range(count):
            if reader.left < 20:
                raise _bad(f"{_where(sections)}: truncated inside chunk {i}")
            seqno, create_time, data_len = unpack(_CHUNK)
            if data_len > reader.left:
                raise _bad(f"{_where(sections)}: chunk {i} runs past the end of the body")
            if data_len > max_chunk and error is None:
                error = _chunk_too_large(data_len, limits)
            seqnos.append(seqno)
            create_times.append(create_time)
            datas.append(take(data_len))
        if error is None and seqnos and (min(seqnos) < 1 or max(seqnos) > MAX_SEQNO):
            try:
                _check_seqnos(seqnos, _where(sections))
            except ApiError as exc:
                error = exc
        if error is None and create_times:
            try:
                _check_create_times(create_times, _where(sections))
            except ApiError as exc:
                error = exc
        if error is not None:
            sections.append(Section.refused(meta_obj, error))
            continue
        assert meta is not None
        sections.append(Section(meta, ChunkBatch(seqnos, create_times, datas, epoch, prev_seqno)))
    if not sections:
        raise _nothing(f"only {MAGIC.decode()}, no section")
    refuse_whole_sources(sections)
    return sections


def _where(sections: list[Section]) -> str:
    """How an error names the section being decoded (built only for an error)."""
    return f"section {len(sections)}"


def _ndjson_data(obj: dict[str, Any], where: str) -> bytes:
    text = obj.get("data")
    encoded = obj.get("data_b64")
    if (text is None) == (encoded is None):
        raise _bad(f"{where}: give exactly one of 'data' (text) and 'data_b64'")
    if text is not None:
        if not isinstance(text, str):
            raise _bad(f"{where}: 'data' must be a string")
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(f"{where}: 'data' is not valid UTF-8") from None
    if not isinstance(encoded, str):
        raise _bad(f"{where}: 'data_b64' must be a string")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(f"{where}: 'data_b64' is not valid base64") from None


def parse_ndjson(body: bytes, limits: Limits, now_ms: int) -> list[Section]:
    """The sections of an NDJSON body, at least one: consecutive lines of one source form one
    section.

    A line that is not a JSON object rejects the request; a line that fails validation refuses
    its source (see :func:`refuse_whole_sources`).
    """
    sections: list[Section] = []
    batch: ChunkBatch | None = None
    total_chunks = 0
    for line_no, line in enumerate(body.split(b"\n"), start=1):
        if not line.strip():
            continue
        where = f"line {line_no}"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise _bad(f"{where}: not UTF-8 JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise _bad(f"{where}: each line must be a JSON object")
        total_chunks += 1
        if total_chunks > limits.max_chunks_per_request:
            raise _too_many(limits)
        try:
            seqno, create_time, data = _ndjson_chunk(obj, where, limits, now_ms)
            meta, epoch, prev_seqno = _section_meta(
                {k: v for k, v in obj.items() if k in _SECTION_KEYS}, where
            )
        except ApiError as exc:
            batch = None
            sections.append(Section.refused(obj, exc))
            continue
        if (
            batch is None
            or meta != sections[-1].meta
            or (epoch, prev_seqno) != (batch.epoch, batch.prev_seqno)
        ):
            batch = ChunkBatch([], [], [], epoch, prev_seqno)
            sections.append(Section(meta, batch))
        batch.seqnos.append(seqno)
        batch.create_times.append(create_time)
        batch.datas.append(data)
    if not sections:
        raise _nothing("no JSON line")
    for section in sections:
        if section.error is None:
            try:
                _check_seqnos(section.batch.seqnos, f"source {section.meta.source_id!r}")
            except ApiError as exc:
                section.error = exc
    refuse_whole_sources(sections)
    return sections


def _ndjson_chunk(
    obj: dict[str, Any], where: str, limits: Limits, now_ms: int
) -> tuple[int, int, bytes]:
    """One NDJSON line's seqno, create time and data; :class:`ApiError` if one is bad."""
    unknown = obj.keys() - _NDJSON_KEYS
    if unknown:
        raise _bad(f"{where}: unknown fields {sorted(unknown)[:5]}")
    if None in obj.values():
        raise _bad(f"{where}: fields must not be null")
    seqno = obj.get("seqno")
    if not isinstance(seqno, int) or isinstance(seqno, bool):
        raise ApiError(400, "bad_seqno", f"{where}: seqno must be an integer in 1 .. 2**63-1")
    create_time = obj.get("create_time", now_ms)
    if (
        not isinstance(create_time, int)
        or isinstance(create_time, bool)
        or not 0 <= create_time <= MAX_CREATE_TIME_MS
    ):
        raise _bad_create_time(create_time, where)
    data = _ndjson_data(obj, where)
    if len(data) > limits.max_chunk_bytes:
        raise _chunk_too_large(len(data), limits)
    return seqno, create_time, data


def encode_binary(
    sections: Sequence[tuple[Mapping[str, Any], Sequence[tuple[int, int, bytes]]]],
) -> bytes:
    """A binary body: per source its meta and its ``(seqno, create_time_ms, data)`` chunks.

    The reference encoder of the framing, for clients written in Python and for tests.
    """
    parts = [MAGIC]
    pack_chunk = _CHUNK.pack
    for meta, chunks in sections:
        meta_json = orjson.dumps(dict(meta))
        parts.append(_META_LEN.pack(len(meta_json)))
        parts.append(meta_json)
        parts.append(_COUNT.pack(len(chunks)))
        for seqno, create_time, data in chunks:
            parts.append(pack_chunk(seqno, create_time, len(data)))
            parts.append(data)
    return b"".join(parts)
