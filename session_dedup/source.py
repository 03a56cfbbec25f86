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
MAX_CREATE_TIME_MS = 253_402_214_400_000
"""The latest ``create_time`` a chunk may carry: 9999-12-31T00:00:00Z, in ms since 1970.

Every consumer of the log can hold ``0 .. MAX_CREATE_TIME_MS``: Spark's and Delta's TIMESTAMP
(years 1-9999, shown in any time zone), Arrow's microseconds, Python's ``datetime``."""
MAX_SOURCE_ID_CHARS = 512
MAX_META_FIELD_CHARS = 4096

# Characters that act on whoever shows the text rather than being shown: the C0 and C1
# controls and DEL (Unicode category Cc: ESC, CR, LF, BEL...), the line and paragraph
# separators, and the format characters (Cf: the bidirectional overrides such as U+202E,
# zero-width characters, the byte order mark, tags).  Listed here rather than asked of
# ``unicodedata`` (Unicode 14's Cf), so that the rule does not move with the Python version.
_CONTROLS = ((0x00, 0x1F), (0x7F, 0x9F))
_SEPARATORS = ((0x2028, 0x2029),)
_BIDI_CONTROLS = ((0x202A, 0x202E), (0x2066, 0x2069))
"""The bidirectional embeddings, overrides and isolates: they reorder how text reads."""
_FORMAT = (
    (0xAD, 0xAD),
    (0x600, 0x605),
    (0x61C, 0x61C),
    (0x6DD, 0x6DD),
    (0x70F, 0x70F),
    (0x890, 0x891),
    (0x8E2, 0x8E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x13438),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
)


def _char_class(*groups: tuple[tuple[int, int], ...]) -> str:
    """The body of a regular expression's character class of the ranges (astral characters
    as themselves, which Python's ``re`` and JSON Schema's Unicode patterns both read)."""

    def char(code: int) -> str:
        if code < 0x100:
            return f"\\x{code:02x}"
        return f"\\u{code:04x}" if code < 0x10000 else chr(code)

    ranges = sorted(r for group in groups for r in group)
    return "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in ranges)


CONTROL_CHARACTERS = _char_class(_CONTROLS)
"""Cc: refused in ``source_id`` by every version of the gateway (see ``copied``)."""
ID_REFUSED_CHARACTERS = _char_class(_CONTROLS, _SEPARATORS, _FORMAT)
"""Refused in ``source_id`` and ``server``: control, separator and format characters."""
FILE_REFUSED_CHARACTERS = _char_class(_CONTROLS, _SEPARATORS, _BIDI_CONTROLS)
"""Refused in ``file``: control and separator characters and the bidirectional controls.
The other format characters are in real file names (U+200C, the zero-width non-joiner, in
Persian words; U+200D in emoji sequences), and a file's name is what it is."""
_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")
_ID_REFUSED = re.compile(f"[{ID_REFUSED_CHARACTERS}]")
_FILE_REFUSED = re.compile(f"[{FILE_REFUSED_CHARACTERS}]")


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
        and server.isprintable()
        and file.isascii()
        and file.isprintable()
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


def check_shown_text(name: str, value: str) -> None:
    """Raise ``BadRequest`` if ``value``, the ``source_id``, ``server`` or ``file`` of a
    source, holds a character that field refuses (see ``ID_REFUSED_CHARACTERS``)."""
    if name == "file":
        _refuse_shown(name, value, _FILE_REFUSED, _FILE_CHARACTERS)
    else:
        _refuse_shown(name, value, _ID_REFUSED, _ID_CHARACTERS)


def _refuse_shown(name: str, value: str, refused: re.Pattern[str], what: str) -> None:
    found = refused.search(value)
    if found is not None:
        raise BadRequest(
            f"{name} must not contain {what}: U+{ord(found.group()):04X} at character "
            f"{found.start()}"
        )


_ID_CHARACTERS = "control, line-separator or format characters (Unicode Cc, Zl, Zp, Cf)"
_FILE_CHARACTERS = (
    "control, line-separator or bidirectional-control characters (Unicode Cc, Zl, Zp, "
    "U+202A-U+202E, U+2066-U+2069)"
)


def source_meta(
    *,
    log_type: object,
    source_id: object,
    server: object = None,
    file: object = None,
    codec: object = None,
    copied: bool = False,
) -> SourceMeta:
    """Validate the parts of a source's meta; raises ``BadRequest`` naming the bad field.

    ``copied``: the meta of a record copied from another installation's log, which a gateway
    of any version may have written: held only to the text rules every version applied (no
    control character in ``source_id``, no NUL in ``server`` or ``file``), so that a record
    stored before a rule came in is still copied rather than stopping its mirror for good.
    """
    sid = _text("source_id", source_id, max_chars=MAX_SOURCE_ID_CHARS, required=True)
    srv = _text("server", server, max_chars=MAX_META_FIELD_CHARS, required=False)
    fil = _text("file", file, max_chars=MAX_META_FIELD_CHARS, required=False)
    if copied:
        if _CONTROL.search(sid):
            raise BadRequest("source_id must not contain control characters")
        for name, value in (("server", srv), ("file", fil)):
            if "\x00" in value:
                raise BadRequest(f"{name} must not contain NUL characters")
    else:
        for name, value in (("source_id", sid), ("server", srv), ("file", fil)):
            check_shown_text(name, value)
    cod = "raw" if codec is None else codec
    if cod not in CODECS:
        raise BadRequest(f"unknown codec {str(cod)[:40]!r}; use one of {', '.join(CODECS)}")
    assert isinstance(cod, str)
    return SourceMeta(_known_log_type(log_type), sid, srv, fil, cod)
