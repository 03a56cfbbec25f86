"""Server-side filters: a reader names what it wants and gets only that over the wire.

As in Databus, filtering happens where the data is, so a partition-aware consumer does not pay
for the bandwidth of messages it would throw away.  Fields match exactly (``file`` also takes
``*``/``?`` globs); several values of one field are alternatives; different fields must all
match.  ``hash_mod``/``hash_rem`` keep the messages whose key (``source_id``, ``server`` or
``file``) hashes to ``hash_rem`` modulo ``hash_mod`` (CRC-32 of the UTF-8 key), so N readers
with remainders 0..N-1 split a stream with every source going to exactly one of them.
"""

from __future__ import annotations

import fnmatch
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from delivery.envelope_view import EnvelopeView
from log_store.errors import BadRequest

HASH_KEYS = ("source_id", "server", "file")
MAX_VALUES_PER_FIELD = 1000
MAX_HASH_MOD = 1 << 20


class BadFilter(BadRequest):
    """A filter that cannot be applied: unknown field, bad number, empty value."""


@dataclass(frozen=True)
class MessageFilter:
    """What a reader wants; the default matches everything."""

    source_ids: frozenset[str] = frozenset()
    servers: frozenset[str] = frozenset()
    files: tuple[str, ...] = ()
    log_types: frozenset[str] = frozenset()
    hash_key: str = "source_id"
    hash_mod: int = 0
    hash_rem: int = 0

    @property
    def matches_all(self) -> bool:
        return not (
            self.source_ids or self.servers or self.files or self.log_types or self.hash_mod
        )

    def matches(self, env: EnvelopeView) -> bool:
        if self.source_ids and env.source_id not in self.source_ids:
            return False
        if self.servers and env.server not in self.servers:
            return False
        if self.log_types and env.log_type not in self.log_types:
            return False
        if self.files and not any(_file_matches(env.file, f) for f in self.files):
            return False
        if self.hash_mod:
            key = getattr(env, self.hash_key)
            if zlib.crc32(key.encode("utf-8")) % self.hash_mod != self.hash_rem:
                return False
        return True

    def to_params(self) -> dict[str, list[str]]:
        """Query parameters that :func:`parse_filter` turns back into this filter."""
        params: dict[str, list[str]] = {}
        if self.source_ids:
            params["source_id"] = sorted(self.source_ids)
        if self.servers:
            params["server"] = sorted(self.servers)
        if self.files:
            params["file"] = list(self.files)
        if self.log_types:
            params["log_type"] = sorted(self.log_types)
        if self.hash_mod:
            params["hash_key"] = [self.hash_key]
            params["hash_mod"] = [str(self.hash_mod)]
            params["hash_rem"] = [str(self.hash_rem)]
        return params


def _file_matches(path: str, pattern: str) -> bool:
    if "*" in pattern or "?" in pattern or "[" in pattern:
        return fnmatch.fnmatchcase(path, pattern)
    return path == pattern


FILTER_FIELDS = ("source_id", "server", "file", "log_type", "hash_key", "hash_mod", "hash_rem")


def _values(params: Mapping[str, Iterable[str]], name: str) -> list[str]:
    raw = params.get(name)
    if raw is None:
        return []
    values = [raw] if isinstance(raw, str) else list(raw)
    if len(values) > MAX_VALUES_PER_FIELD:
        raise BadFilter(f"filter {name}: at most {MAX_VALUES_PER_FIELD} values")
    for v in values:
        if not isinstance(v, str) or not v:
            raise BadFilter(f"filter {name}: values must be non-empty strings")
    return values


def _int(params: Mapping[str, Iterable[str]], name: str) -> int | None:
    values = _values(params, name)
    if not values:
        return None
    if len(values) > 1:
        raise BadFilter(f"filter {name}: give it once")
    try:
        return int(values[0])
    except ValueError:
        raise BadFilter(f"filter {name}: {values[0]!r} is not an integer") from None


def parse_filter(params: Mapping[str, Iterable[str]]) -> MessageFilter:
    """Build a filter from query-string-like params (each name to a list of values).

    Names outside :data:`FILTER_FIELDS` are ignored here (they are other request options).
    Raises :class:`BadFilter` with a reason on anything that cannot be applied.
    """
    hash_key_values = _values(params, "hash_key")
    hash_key = hash_key_values[0] if hash_key_values else "source_id"
    if len(hash_key_values) > 1 or hash_key not in HASH_KEYS:
        raise BadFilter(f"filter hash_key must be one of {', '.join(HASH_KEYS)}")
    hash_mod = _int(params, "hash_mod")
    hash_rem = _int(params, "hash_rem")
    if hash_mod is None:
        if hash_rem is not None or hash_key_values:
            raise BadFilter("hash_rem and hash_key need hash_mod")
        hash_mod, hash_rem = 0, 0
    else:
        if not 1 <= hash_mod <= MAX_HASH_MOD:
            raise BadFilter(f"hash_mod must be in 1..{MAX_HASH_MOD}, got {hash_mod}")
        if hash_rem is None:
            raise BadFilter("hash_mod needs hash_rem (0..hash_mod-1)")
        if not 0 <= hash_rem < hash_mod:
            raise BadFilter(f"hash_rem must be in 0..{hash_mod - 1}, got {hash_rem}")
    return MessageFilter(
        source_ids=frozenset(_values(params, "source_id")),
        servers=frozenset(_values(params, "server")),
        files=tuple(_values(params, "file")),
        log_types=frozenset(_values(params, "log_type")),
        hash_key=hash_key,
        hash_mod=hash_mod,
        hash_rem=hash_rem,
    )


def filter_from_json(raw: object) -> MessageFilter:
    """The same filter given as a JSON object (``{"server": ["h1"], "hash_mod": 4, ...}``)."""
    if raw is None:
        return MessageFilter()
    if not isinstance(raw, dict):
        raise BadFilter("filter must be a JSON object")
    unknown = set(raw) - set(FILTER_FIELDS)
    if unknown:
        raise BadFilter(
            f"unknown filter fields: {', '.join(sorted(unknown))}; "
            f"known: {', '.join(FILTER_FIELDS)}"
        )
    params: dict[str, list[str]] = {}
    for name, value in raw.items():
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in items):
            raise BadFilter(f"filter {name}: values must be strings or integers")
        params[name] = [str(v) for v in items]
    return parse_filter(params)
