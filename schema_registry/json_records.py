"""The wire format of structured log types: one JSON object per line, checked against a schema.

A structured chunk stays what every chunk is, whole lines of text, so tailing, ``logbroker
read``, pull and push delivery and the mirror treat it like any other.  Each non-blank line
is a JSON object that must be a record of the log type's schema under these rules:

- a field the schema gives a default may be left out (the default is taken); any other field
  must be there, and a key the schema does not name is refused;
- a line is one JSON object whose keys (of every object in it) appear once each: JSON
  parsers disagree on which of two values of one key counts;
- ``null``, ``boolean``, ``string``: JSON null, true/false, a string; ``int`` and ``long``: a
  JSON integer inside the type's range; ``float``: a JSON number inside float32's range (a
  larger one would be written as infinity); ``double``: any JSON number;
- ``bytes`` and ``fixed``: a string, taken as its UTF-8 bytes (``fixed``: exactly ``size``);
- ``enum``: one of its symbols; ``array``: a list; ``map``: an object;
- a union: the value of the first branch it fits, in the order the schema lists them
  (``["null", "string"]`` takes ``null`` or a string, plainly, without Avro-JSON's
  ``{"string": ...}`` wrapper).

:func:`records_of` returns each line's record as a Python value fastavro writes with the
schema, which is what the loader turns into typed columns.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import orjson

from schema_registry.avro_schema import AvroSchema, json_depth
from schema_registry.compatibility import type_name
from schema_registry.errors import BadRecord

_INT_RANGE = (-(2**31), 2**31 - 1)
_LONG_RANGE = (-(2**63), 2**63 - 1)
_FLOAT32 = struct.Struct("<f")
MAX_RECORD_DEPTH = 64
"""How deeply a record's JSON may nest (the record's object is level 1): checking a record
recurses once or more per level, and a line nested deeper is refused before that."""


class _Mismatch(Exception):
    """A value that does not fit its type; ``path`` says where in the record."""

    def __init__(self, path: str, text: str) -> None:
        super().__init__(f"{path or 'the line'}: {text}")


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _shown(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 40 else text[:37] + "..."


def datum(schema: AvroSchema, node: Any, value: Any, path: str = "") -> Any:
    """``value`` (decoded JSON) as a datum of type ``node``; raises ``_Mismatch``."""
    node = schema.resolve(node)
    kind = type_name(node)
    if kind == "union":
        for branch in node:
            try:
                return datum(schema, branch, value, path)
            except _Mismatch:
                continue
        branches = ", ".join(type_name(schema.resolve(b)) for b in node)
        raise _Mismatch(path, f"{_shown(value)} fits no type of the union [{branches}]")
    if kind == "null":
        if value is None:
            return None
    elif kind == "boolean":
        if isinstance(value, bool):
            return value
    elif kind in ("int", "long"):
        if isinstance(value, int) and not isinstance(value, bool):
            low, high = _INT_RANGE if kind == "int" else _LONG_RANGE
            if not low <= value <= high:
                raise _Mismatch(path, f"{value} is outside the range of {kind}")
            return value
    elif kind in ("float", "double"):
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                number = float(value)
                if kind == "float":
                    _FLOAT32.pack(number)  # OverflowError past float32's largest finite value
            except OverflowError:
                raise _Mismatch(path, f"{_shown(value)} is outside the range of {kind}") from None
            return number
    elif kind == "string":
        if isinstance(value, str):
            return value
    elif kind == "bytes":
        if isinstance(value, str):
            return value.encode("utf-8")
    elif kind == "fixed":
        if isinstance(value, str):
            raw = value.encode("utf-8")
            if len(raw) != node["size"]:
                raise _Mismatch(
                    path, f"fixed {node['name']} holds {node['size']} bytes, not {len(raw)}"
                )
            return raw
    elif kind == "enum":
        if isinstance(value, str):
            if value in node["symbols"]:
                return value
            raise _Mismatch(path, f"{_shown(value)} is not a symbol of enum {node['name']}")
    elif kind == "array":
        if isinstance(value, list):
            return [datum(schema, node["items"], v, f"{path}[{i}]") for i, v in enumerate(value)]
    elif kind == "map":
        if isinstance(value, dict):
            return {k: datum(schema, node["values"], v, f"{path}.{k}") for k, v in value.items()}
    elif kind == "record":
        if isinstance(value, dict):
            return _record(schema, node, value, path)
    else:
        raise _Mismatch(path, f"unsupported type {kind}")
    raise _Mismatch(path, f"expected {kind}, got {_json_kind(value)} {_shown(value)}")


def _record(schema: AvroSchema, node: dict[str, Any], value: dict[str, Any], path: str) -> Any:
    record: dict[str, Any] = {}
    for field in node["fields"]:
        name = field["name"]
        where = f"{path}.{name}" if path else name
        if name in value:
            record[name] = datum(schema, field["type"], value[name], where)
        elif "default" in field:
            # A union's default belongs to its first branch; fastavro has checked it fits.
            field_type = schema.resolve(field["type"])
            default_type = field_type[0] if isinstance(field_type, list) else field_type
            record[name] = datum(schema, default_type, field["default"], where)
        else:
            raise _Mismatch(where, "missing, and the schema gives it no default")
    if len(record) != len(value):
        extra = sorted(set(value) - set(record))
        known = {f["name"] for f in node["fields"]}
        extra = [k for k in extra if k not in known]
        if extra:
            shown = extra[0] if len(extra[0]) <= 40 else extra[0][:37] + "..."
            raise _Mismatch(path, f"key {shown!r} is not a field of record {node['name']}")
    return record


def lines_of(data: bytes) -> Iterator[tuple[int, bytes]]:
    """``(line number from 1, line)`` of the non-blank lines of a chunk's raw data."""
    for number, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            yield number, line


def record_of(schema: AvroSchema, line: bytes) -> dict[str, Any]:
    """One line as a record of ``schema``; raises :class:`BadRecord` saying what is wrong."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise BadRecord(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise BadRecord(f"a record is a JSON object, not {_json_kind(value)}")
    if json_depth(value, MAX_RECORD_DEPTH) > MAX_RECORD_DEPTH:
        raise BadRecord(f"a record nests at most {MAX_RECORD_DEPTH} levels of objects and lists")
    try:
        # Every key is followed by a colon: a line with no more colons than the decoded
        # objects hold keys wrote no key twice (the common case, checked cheaply).
        if line.count(b":") > _members(value):
            _DUPLICATE_KEYS.decode(line.decode("utf-8"))
    except _DuplicateKey as exc:
        raise BadRecord(str(exc)) from None
    except RecursionError:
        raise BadRecord("nested too deeply") from None
    try:
        result: dict[str, Any] = datum(schema, schema.definition, value)
    except _Mismatch as exc:
        raise BadRecord(str(exc)) from None
    except RecursionError:
        raise BadRecord("nested too deeply") from None
    return result


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        shown = key if len(key) <= 40 else key[:37] + "..."
        super().__init__(
            f"key {shown!r} appears twice in one object (JSON readers differ on which value counts)"
        )


def _members(value: Any) -> int:
    """How many keys the objects of a decoded JSON value hold together."""
    if isinstance(value, dict):
        return len(value) + sum(_members(v) for v in value.values() if isinstance(v, dict | list))
    if isinstance(value, list):
        return sum(_members(v) for v in value if isinstance(v, dict | list))
    return 0


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return found


_DUPLICATE_KEYS = json.JSONDecoder(object_pairs_hook=_refuse_duplicate_keys)
"""orjson keeps the last value of a key written twice, silently; this decoder (slower, and
run only on a line orjson took) says so."""


def records_of(schema: AvroSchema, data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of every non-blank line of a chunk's raw data.

    Raises :class:`BadRecord` for the first line that is not a record, naming its number.
    """
    for number, line in lines_of(data):
        try:
            yield number, record_of(schema, line)
        except BadRecord as exc:
            raise BadRecord(f"line {number}: {exc}") from None
