"""Schemas of structured log types: Avro record schemas, their versions and compatibility.

A log type becomes *structured* when a schema is registered for it.  The gateway then checks
every line written to it (one JSON object per line, see :mod:`schema_registry.json_records`)
and stamps each chunk's envelope with the id of the schema it was checked against; the loader
turns structured topics into typed columns.  See ``docs/schemas.md``.
"""

from __future__ import annotations

from schema_registry.avro_schema import AvroSchema, format_schema_id, parse, parse_schema_id
from schema_registry.compatibility import (
    DEFAULT_MODE,
    MODES,
    Mode,
    can_read,
    compatibility_problems,
    parse_mode,
    read_problems,
)
from schema_registry.errors import BadRecord, IncompatibleSchema, InvalidSchema, UnknownSchema
from schema_registry.json_records import record_of, records_of
from schema_registry.registry import (
    REGISTRY_TOPIC,
    Registration,
    SchemaRegistry,
    SchemaVersion,
    StructuredLogType,
)

__all__ = [
    "DEFAULT_MODE",
    "MODES",
    "REGISTRY_TOPIC",
    "AvroSchema",
    "BadRecord",
    "IncompatibleSchema",
    "InvalidSchema",
    "Mode",
    "Registration",
    "SchemaRegistry",
    "SchemaVersion",
    "StructuredLogType",
    "UnknownSchema",
    "can_read",
    "compatibility_problems",
    "format_schema_id",
    "parse",
    "parse_mode",
    "parse_schema_id",
    "read_problems",
    "record_of",
    "records_of",
]
