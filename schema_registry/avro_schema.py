"""One version of a structured log type's schema: parsed by fastavro, named by its id.

A schema is an Avro *record* schema.  Its **schema id** is the 64-bit CRC-64-AVRO (Rabin)
fingerprint of its normalized JSON: every key sorted, no whitespace, ``doc`` left out, and
defaults kept.  Avro's parsing canonical form drops defaults, but a default decides whether a
new field is compatible, so two schemas that differ only in a default are different versions.
The id depends on the schema alone, not on which registry saw it first: a mirrored topic's
records name the same id in every data center.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import fastavro.schema

from schema_registry.errors import InvalidSchema

MAX_SCHEMA_BYTES = 256 * 1024
MAX_SCHEMA_DEPTH = 64
"""How deeply a schema's JSON may nest (objects and lists): a record in a record takes three
levels (its ``fields``, the field, its type), an array or a map one, a union one.  Parsing,
normalizing and checking a schema and its records recurse once per level."""


def format_schema_id(schema_id: int) -> str:
    """The id as the API and readers show it: 16 lowercase hex digits."""
    return f"{schema_id & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def parse_schema_id(text: str) -> int:
    """The id of 16 hex digits; ``InvalidSchema`` for anything else."""
    if len(text) != 16:
        raise InvalidSchema(f"a schema id is 16 hex digits, not {text[:40]!r}")
    try:
        return int(text, 16)
    except ValueError:
        raise InvalidSchema(f"a schema id is 16 hex digits, not {text[:40]!r}") from None


def _too_deep(max_depth: int | None) -> str:
    return f"a schema's JSON nests at most {max_depth or MAX_SCHEMA_DEPTH} levels deep"


def json_depth(value: Any, limit: int) -> int:
    """How deeply decoded JSON ``value`` nests (a scalar 0, ``{}`` or ``[]`` 1, ``[[]]`` 2),
    counted without recursion; past ``limit`` it stops counting, at ``limit + 1``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return depth
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def _normalized(value: Any) -> Any:
    """``value`` without documentation, for the id (docs never change what a record holds)."""
    if isinstance(value, dict):
        return {
            k: _normalized(v) for k, v in value.items() if k != "doc" and not k.startswith("__")
        }
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


@dataclass(frozen=True)
class AvroSchema:
    """A parsed record schema and its id; build with :func:`parse`."""

    definition: dict[str, Any]
    """The schema as fastavro parsed it: names fully qualified, named types defined once."""
    named: dict[str, dict[str, Any]]
    """Named types (records, enums, fixed) by full name, for references to them."""
    schema_id: int
    text: str
    """The schema as registered (JSON)."""

    @property
    def id_hex(self) -> str:
        return format_schema_id(self.schema_id)

    @property
    def name(self) -> str:
        return str(self.definition["name"])

    def resolve(self, schema: Any) -> Any:
        """``schema`` with a reference to a named type replaced by that type's definition."""
        if isinstance(schema, str) and schema in self.named:
            return self.named[schema]
        return schema


def parse(schema: Any, *, max_depth: int | None = MAX_SCHEMA_DEPTH) -> AvroSchema:
    """Parse a record schema given as JSON text or as its decoded JSON value.

    Raises :class:`InvalidSchema` with fastavro's reason for anything Avro rejects (unknown
    types, bad names, defaults that do not match their type, duplicate enum symbols, ...),
    and for JSON nested more than ``max_depth`` levels (None: a schema the registry holds,
    which may have been registered before the bound).
    """
    if isinstance(schema, bytes | bytearray):
        schema = bytes(schema).decode("utf-8", "replace")
    if isinstance(schema, str):
        if len(schema.encode("utf-8")) > MAX_SCHEMA_BYTES:
            raise InvalidSchema(f"a schema is at most {MAX_SCHEMA_BYTES} bytes of JSON")
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise InvalidSchema(f"the schema is not JSON ({exc})") from None
        except RecursionError:
            raise InvalidSchema(_too_deep(max_depth)) from None
    if max_depth is not None and json_depth(schema, max_depth) > max_depth:
        raise InvalidSchema(_too_deep(max_depth))
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise InvalidSchema(
            'a structured log type\'s schema is an Avro record: {"type": "record", ...}'
        )
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode("utf-8")) > MAX_SCHEMA_BYTES:
        raise InvalidSchema(f"a schema is at most {MAX_SCHEMA_BYTES} bytes of JSON")
    try:
        named: dict[str, Any] = {}
        parsed: Any = fastavro.schema.parse_schema(
            json.loads(text), named_schemas=named, _write_hint=False
        )
    except Exception as exc:  # fastavro raises SchemaParseException, UnknownType, ValueError...
        raise InvalidSchema(f"not a valid Avro schema: {exc}") from None
    definition = {k: v for k, v in parsed.items() if not k.startswith("__")}
    normalized = json.dumps(_normalized(definition), separators=(",", ":"), sort_keys=True)
    schema_id = int(fastavro.schema.fingerprint(normalized, "CRC-64-AVRO"), 16)
    return AvroSchema(definition, named, schema_id, text)
