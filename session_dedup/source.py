"""What identifies a source and describes its chunks, validated once at the front door.

A source is one stream of chunks (for a push-client: one file identity on one host).  Its meta
(log type, server, file, codec) is constant for the source and goes into every envelope.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from log_store.errors import BadRequest
from log_store.topic_names import LOG_TYPE_PATTERN as LOG_TYPE_PATTERN  # one rule, re-exported
from log_store.topic_names import validate_log_type as validate_log_type
from session_dedup.envelope import CODECS

MAX_SEQNO = 2**63 - 1
MAX_SOURCE_ID_CHARS = 512
MAX_META_FIELD_CHARS = 4096
# C0 and C1 control characters and DEL: a source id is shown in logs and tables.
CONTROL_CHARACTERS = "\\x00-\\x1f\\x7f-\\x9f"
_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")


@dataclass(frozen=True, slots=True)
class SourceMeta:
    """A source and the fields its envelopes carry; build with :func:`source_meta`."""

    log_type: str
    source_id: str
    server: str = ""
    file: str = ""
    codec: str = "raw"
    schema_id: int | None = None
    """Set by the gateway for a structured log type's chunks, once their records passed the
    schema check (see ``schema_registry``); stamped into their envelopes."""


def _text(name: str, value: object, *, max_chars: int, required: bool) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string")
    if required and not value:
        raise BadRequest(f"{name} must not be empty")
    if len(value) > max_chars:
        raise BadRequest(f"{name} is {len(value)} characters; at most {max_chars} are allowed")
    if not value.isascii():  # only non-ASCII text can hold a lone surrogate
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"{name} is not valid UTF-8 (lone surrogate)") from None
    return value


def validate_seqno(value: object) -> int:
    """Return ``value`` if it is a seqno: an integer in ``1 .. 2**63-1``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"seqno must be an integer, got {type(value).__name__}")
    if not 1 <= value <= MAX_SEQNO:
        raise BadRequest(f"seqno {value} is outside 1 .. 2**63-1")
    return value


_KNOWN_LOG_TYPES: set[str] = set()
_MAX_KNOWN_LOG_TYPES = 10_000


def usual_source_meta(obj: dict[str, object]) -> SourceMeta | None:
    """:func:`source_meta` of a meta object holding only meta fields, all ASCII text, with a
    log type seen valid before: the usual section, checked in a few string tests.  None when
    any of that is not so: :func:`source_meta` then decides, and names what is wrong."""
    log_type = obj.get("log_type")
    source_id = obj.get("source_id")
    server = obj.get("server", "")
    file = obj.get("file", "")
    codec = obj.get("codec", "raw")
    if (
        type(log_type) is str
        and type(source_id) is str
        and type(server) is str
        and type(file) is str
        and type(codec) is str
        and log_type in _KNOWN_LOG_TYPES
        and codec in _CODEC_SET
        and 0 < len(source_id) <= MAX_SOURCE_ID_CHARS
        and len(server) <= MAX_META_FIELD_CHARS
        and len(file) <= MAX_META_FIELD_CHARS
        # an ASCII string is printable exactly when it holds no C0 control character or DEL
        and source_id.isascii()
        and source_id.isprintable()
        and server.isascii()
        and file.isascii()
        and "\x00" not in server
        and "\x00" not in file
        and obj.keys() <= _META_FIELDS
    ):
        return _checked_meta(log_type, source_id, server, file, codec)
    return None


_FIELD_SETTERS = tuple(
    SourceMeta.__dict__[name].__set__
    for name in ("log_type", "source_id", "server", "file", "codec", "schema_id")
)


def _checked_meta(log_type: str, source_id: str, server: str, file: str, codec: str) -> SourceMeta:
    """``SourceMeta(...)`` of checked fields, at a third of the cost of a frozen dataclass's
    ``__init__`` (which sets each field through ``object.__setattr__``)."""
    meta = object.__new__(SourceMeta)
    set_log_type, set_source_id, set_server, set_file, set_codec, set_schema_id = _FIELD_SETTERS
    set_log_type(meta, log_type)
    set_source_id(meta, source_id)
    set_server(meta, server)
    set_file(meta, file)
    set_codec(meta, codec)
    set_schema_id(meta, None)
    return meta


_CODEC_SET = frozenset(CODECS)
_META_FIELDS = frozenset({"log_type", "source_id", "server", "file", "codec"})


def _known_log_type(value: object) -> str:
    log_type = validate_log_type(value)
    if len(_KNOWN_LOG_TYPES) < _MAX_KNOWN_LOG_TYPES:
        _KNOWN_LOG_TYPES.add(log_type)
    return log_type


def source_meta(
    *,
    log_type: object,
    source_id: object,
    server: object = None,
    file: object = None,
    codec: object = None,
) -> SourceMeta:
    """Validate the parts of a source's meta; raises ``BadRequest`` naming the bad field."""
    sid = _text("source_id", source_id, max_chars=MAX_SOURCE_ID_CHARS, required=True)
    if _CONTROL.search(sid):
        raise BadRequest("source_id must not contain control characters")
    srv = _text("server", server, max_chars=MAX_META_FIELD_CHARS, required=False)
    fil = _text("file", file, max_chars=MAX_META_FIELD_CHARS, required=False)
    for name, value in (("server", srv), ("file", fil)):
        if "\x00" in value:
            raise BadRequest(f"{name} must not contain NUL characters")
    cod = "raw" if codec is None else codec
    if cod not in CODECS:
        raise BadRequest(f"unknown codec {str(cod)[:40]!r}; use one of {', '.join(CODECS)}")
    assert isinstance(cod, str)
    return SourceMeta(_known_log_type(log_type), sid, srv, fil, cod)
