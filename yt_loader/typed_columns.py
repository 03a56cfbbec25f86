"""Typed columns for structured topics: each record's fields as a struct column of the table.

A topic whose log type has a schema (see ``schema_registry``) gets, besides the columns every
topic has (``line`` keeps the record's JSON text), one struct column named
``record_<log type>`` (characters other than ``[a-z0-9_]`` become ``_``) holding the record
resolved to the log type's **newest** schema: each line is read with the schema whose id its
chunk is stamped with and resolved by Avro's rules (fastavro) to the newest one, so fields
added with a default are filled in, promoted types are widened and removed fields are gone.
A line that cannot be resolved (no stamp: written before the log type had a schema, or
through the legacy API; an id the registry does not know) gets a null struct.

Avro types become these column types: boolean -> boolean; int, long -> bigint; float,
double -> double; string, enum -> string; bytes, fixed -> binary; array -> array; map ->
map<string, ...>; record -> struct; a union of null and one type -> that type (nullable);
any other union, and a reference to a record that contains itself, -> string (the value as
JSON).  int and long share a column type (and float and double) so that Avro's promotions
int -> long and float -> double leave the table's column as it is.

The table evolves with the schema: when a version adds fields, the batch that first loads
them commits the wider struct with its rows (Delta's schema evolution, as ``mergeSchema``
does it: new fields are added, existing fields keep their place and type, fields a newer
schema dropped stay, null in new rows).  A field whose column type would change (int ->
double, string <-> bytes) is refused before anything is written: a Delta column does not
change type in place.

A schema that cannot become a column is refused for its topics alone
(:func:`usable_columns`): they are not loaded (their offsets stay where they are, to load once
it is fixed), every other topic is, and the load names each refused topic and why.  Refused:

- two log types whose column names are the same (``nginx-access`` and ``nginx_access`` both
  make ``record_nginx_access``), in one run or across runs (a column records its log type in
  its metadata, ``logbroker.log_type``): the loader does not pick one of them to type, nor
  rename one (a name that depended on which came first would differ between tables); load
  them into separate tables (``--topics``);
- fields of one record whose names differ only in case (``userId``, ``userid``): Spark and
  Delta compare column names without case, so the two would be one column;
- a field name with a character Delta does not take in a column name (a space, a tab, a
  newline or one of ``,;{}()=``);
- a record with no fields (Parquet has no empty group);
- a field whose column would change type (above), and a schema that does not parse.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fastavro
import orjson
import pyarrow as pa

from log_store import LogStore, open_store
from log_store.errors import BadRequest
from schema_registry import (
    AvroSchema,
    BadRecord,
    SchemaRegistry,
    can_read,
    format_schema_id,
    parse,
    record_of,
)
from schema_registry.compatibility import type_name
from yt_loader.log_source import HttpLogSource, SourceSpec

COLUMN_PREFIX = "record_"
SCHEMA_ID_COLUMN = "_schema_id"
"""The stamp of each line's chunk, carried from the reader to the writer of a range only."""
LOG_TYPE_METADATA = "logbroker.log_type"
"""The key, in a typed column's metadata, of the log type whose records it holds."""
_NOT_NAME = re.compile(r"[^a-z0-9_]")
_NOT_IN_DELTA_NAMES = frozenset(" ,;{}()\n\t=")


class TypedColumnConflict(BadRequest):
    """A schema version that would change the type of a column the table has."""


class UnloadableSchema(BadRequest):
    """A log type's schema that cannot become a column of the table (see the module's doc)."""


def column_name(log_type: str) -> str:
    return COLUMN_PREFIX + _NOT_NAME.sub("_", log_type)


@dataclass(frozen=True)
class TopicSchemas:
    """What a task needs to type one topic's lines (plain strings: Spark pickles it)."""

    topic: str
    log_type: str
    newest: str
    """The newest version's schema text: every record is resolved to it."""
    by_id: dict[str, str] = field(default_factory=dict)
    """Every version's schema text, by id (16 hex digits)."""

    @property
    def column(self) -> str:
        return column_name(self.log_type)


def _log_type_of(topic: str) -> str:
    return topic.split(".", 1)[1] if "." in topic else topic


def _from_versions(topic: str, log_type: str, texts: Sequence[tuple[str, str]]) -> TopicSchemas:
    return TopicSchemas(topic, log_type, texts[-1][1], dict(texts))


def schemas_from_registry(
    registry: SchemaRegistry, topics: Sequence[str]
) -> dict[str, TopicSchemas]:
    """The structured topics among ``topics``, as the registry over the store has them."""
    found: dict[str, TopicSchemas] = {}
    for topic in topics:
        log_type = _log_type_of(topic)
        structured = registry.log_type(log_type, fresh=True)
        if structured is None or not structured.versions:
            continue
        texts = [(v.schema.id_hex, v.schema.text) for v in structured.versions]
        found[topic] = _from_versions(topic, log_type, texts)
    return found


def schemas_from_gateway(gateways: HttpLogSource, topics: Sequence[str]) -> dict[str, TopicSchemas]:
    """The structured topics among ``topics``, as ``GET /v1/topics/{topic}/schemas`` has them."""
    found: dict[str, TopicSchemas] = {}
    for topic in topics:
        doc = gateways.topic_schemas(topic)
        if doc is None:
            continue
        texts = [(v["id"], json.dumps(v["schema"])) for v in doc["versions"]]
        if texts:
            found[topic] = _from_versions(topic, doc["log_type"], texts)
    return found


def schemas_for(spec: SourceSpec, topics: Sequence[str]) -> dict[str, TopicSchemas]:
    """The structured topics among ``topics``, from the log ``spec`` names."""
    if spec.server is not None:
        gateways = spec.gateways()
        try:
            return schemas_from_gateway(gateways, topics)
        finally:
            gateways.close()
    store: LogStore
    if spec.kafka_bootstrap is not None:
        from log_store.kafka import open_kafka_store

        # reads replay the registry's changelog: never its writer, so no gateway is fenced
        store = open_kafka_store(spec.kafka_settings())
    else:
        assert spec.data_dir is not None
        store = open_store(spec.data_dir, read_only=True)
    try:
        return schemas_from_registry(SchemaRegistry(store), topics)
    finally:
        store.close()


# -- column types ----------------------------------------------------------------------------
def _nullable_branch(schema: AvroSchema, node: list[Any]) -> Any | None:
    """The one non-null branch of a ``[null, X]`` union, else None."""
    others = [b for b in node if type_name(schema.resolve(b)) != "null"]
    return others[0] if len(others) == 1 and len(node) == 2 else None


class _Typing:
    """The Spark (Delta JSON) type and the Arrow type of one schema's records."""

    def __init__(self, schema: AvroSchema) -> None:
        self.schema = schema
        self._open: set[str] = set()

    def spark(self, node: Any) -> Any:
        node = self.schema.resolve(node)
        kind = type_name(node)
        if kind == "union":
            branch = _nullable_branch(self.schema, node)
            return "string" if branch is None else self.spark(branch)
        simple = {
            "boolean": "boolean",
            "int": "long",
            "long": "long",
            "float": "double",
            "double": "double",
            "string": "string",
            "enum": "string",
            "bytes": "binary",
            "fixed": "binary",
            "null": "string",
        }
        if kind in simple:
            return simple[kind]
        if kind == "array":
            return {"type": "array", "elementType": self.spark(node["items"]), "containsNull": True}
        if kind == "map":
            return {
                "type": "map",
                "keyType": "string",
                "valueType": self.spark(node["values"]),
                "valueContainsNull": True,
            }
        name = node["name"]
        if name in self._open:  # a record inside itself has no finite column type
            return "string"
        self._open.add(name)
        try:
            return {
                "type": "struct",
                "fields": [
                    {
                        "name": f["name"],
                        "type": self.spark(f["type"]),
                        "nullable": True,
                        "metadata": {},
                    }
                    for f in node["fields"]
                ],
            }
        finally:
            self._open.discard(name)


def spark_type(schema: AvroSchema) -> dict[str, Any]:
    """The Delta/Spark JSON type of the struct column of ``schema``'s records."""
    result: dict[str, Any] = _Typing(schema).spark(schema.definition)
    return result


def check_column_type(spark: Any, where: str) -> None:
    """Raise :class:`UnloadableSchema` if Spark, Delta or Parquet cannot hold ``spark``."""
    if isinstance(spark, str):
        return
    if spark["type"] == "array":
        check_column_type(spark["elementType"], where + "[]")
        return
    if spark["type"] == "map":
        check_column_type(spark["valueType"], where + "{}")
        return
    if not spark["fields"]:
        raise UnloadableSchema(f"{where} is a record with no fields: Parquet has no empty group")
    seen: dict[str, str] = {}
    for f in spark["fields"]:
        name = f["name"]
        bad = sorted(set(name) & _NOT_IN_DELTA_NAMES)
        if bad:
            raise UnloadableSchema(
                f"field {where}.{name!r} has {''.join(bad)!r} in its name, which Delta does "
                "not take in a column name"
            )
        other = seen.get(name.lower())
        if other is not None:
            raise UnloadableSchema(
                f"fields {where}.{other} and {where}.{name} differ only in case: Spark and "
                "Delta compare column names without case, so they would be one column"
            )
        seen[name.lower()] = name
        check_column_type(f["type"], f"{where}.{name}")


def arrow_type(spark: Any) -> pa.DataType:
    """The Arrow type that Parquet writes as the given Spark (Delta JSON) type."""
    if isinstance(spark, str):
        return {
            "boolean": pa.bool_(),
            "long": pa.int64(),
            "double": pa.float64(),
            "string": pa.string(),
            "binary": pa.binary(),
        }[spark]
    if spark["type"] == "array":
        return pa.list_(arrow_type(spark["elementType"]))
    if spark["type"] == "map":
        return pa.map_(pa.string(), arrow_type(spark["valueType"]))
    return pa.struct([pa.field(f["name"], arrow_type(f["type"])) for f in spark["fields"]])


def _to_column_value(spark: Any, value: Any) -> Any:
    """A resolved Avro value as Arrow takes it for the column type ``spark``."""
    if value is None:
        return None
    if spark == "string":
        if isinstance(value, str):
            return value
        return orjson.dumps(value, default=_json_default).decode()
    if isinstance(spark, str):
        return value
    if spark["type"] == "array":
        return [_to_column_value(spark["elementType"], v) for v in value]
    if spark["type"] == "map":
        return [(k, _to_column_value(spark["valueType"], v)) for k, v in value.items()]
    return {f["name"]: _to_column_value(f["type"], value.get(f["name"])) for f in spark["fields"]}


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(type(value).__name__)


# -- the table's schema -----------------------------------------------------------------------
def merge_struct(table: Any, new: Any, where: str) -> Any:
    """``table``'s type widened by ``new``'s fields; :class:`TypedColumnConflict` if a type
    would change."""
    if isinstance(table, dict) and isinstance(new, dict) and table["type"] == new["type"]:
        if table["type"] == "struct":
            fields = [dict(f) for f in table["fields"]]
            index = {f["name"]: i for i, f in enumerate(fields)}
            for f in new["fields"]:
                at = index.get(f["name"])
                if at is None:
                    fields.append(f)
                else:
                    merged = merge_struct(fields[at]["type"], f["type"], f"{where}.{f['name']}")
                    fields[at] = {**fields[at], "type": merged}
            return {**table, "fields": fields}
        if table["type"] == "array":
            return {
                **table,
                "elementType": merge_struct(table["elementType"], new["elementType"], where + "[]"),
            }
        return {
            **table,
            "valueType": merge_struct(table["valueType"], new["valueType"], where + "{}"),
        }
    if table == new:
        return table
    raise TypedColumnConflict(
        f"column {where} is {_show(table)} in the table, but the newest schema makes it "
        f"{_show(new)}; a Delta column does not change type: load this log type into a new "
        "table, or register a schema that keeps the type"
    )


def _show(spark: Any) -> str:
    return spark if isinstance(spark, str) else str(spark["type"])


def evolved_table_schema(
    table_schema: Mapping[str, Any], topics: Mapping[str, TopicSchemas]
) -> dict[str, Any] | None:
    """The table's schema (Delta JSON) with every structured topic's column added or widened;
    ``None`` if nothing changes.  Raises :class:`TypedColumnConflict` or
    :class:`UnloadableSchema` (see :func:`usable_columns`, which sorts the topics first)."""
    fields = [dict(f) for f in table_schema["fields"]]
    index = {f["name"]: i for i, f in enumerate(fields)}
    changed = False
    for schemas in sorted(topics.values(), key=lambda s: s.column):
        wanted = spark_type(parse(schemas.newest, max_depth=None))
        check_column_type(wanted, schemas.column)
        owner = {LOG_TYPE_METADATA: schemas.log_type}
        at = index.get(schemas.column)
        if at is None:
            index[schemas.column] = len(fields)
            fields.append(
                {"name": schemas.column, "type": wanted, "nullable": True, "metadata": owner}
            )
            changed = True
            continue
        holder = (fields[at].get("metadata") or {}).get(LOG_TYPE_METADATA)
        if holder is not None and holder != schemas.log_type:
            raise UnloadableSchema(
                f"log type {schemas.log_type!r} makes column {schemas.column}, which holds log "
                f"type {holder!r} in this table: {_FOLDED}"
            )
        merged = merge_struct(fields[at]["type"], wanted, schemas.column)
        if merged != fields[at]["type"] or holder is None:
            # a column typed before columns named their log type gets the name now
            metadata = {**(fields[at].get("metadata") or {}), **owner}
            fields[at] = {**fields[at], "type": merged, "metadata": metadata}
            changed = True
    return {**table_schema, "fields": fields} if changed else None


_FOLDED = (
    "a column's name is record_ and the log type with every character other than [a-z0-9_] "
    "made '_', so the two cannot both have a column in one table; load them into separate "
    "tables (--topics)"
)


def usable_columns(
    table_schema: Mapping[str, Any], topics: Mapping[str, TopicSchemas]
) -> tuple[dict[str, TopicSchemas], dict[str, str]]:
    """The structured topics whose columns the table can get, and the others with why not.

    One bad schema refuses only its own topics: each column is tried alone against the table.
    """
    by_column: dict[str, dict[str, TopicSchemas]] = {}
    for topic, schemas in topics.items():
        by_column.setdefault(schemas.column, {})[topic] = schemas
    usable: dict[str, TopicSchemas] = {}
    refused: dict[str, str] = {}
    for column, group in sorted(by_column.items()):
        log_types = sorted({s.log_type for s in group.values()})
        if len(log_types) > 1:
            shown = " and ".join(repr(t) for t in log_types)
            why = f"log types {shown} both make column {column}: {_FOLDED}"
            refused.update(dict.fromkeys(group, why))
            continue
        try:
            evolved_table_schema(table_schema, group)
        except Exception as exc:  # any schema that does not become a column: only its topics
            why = f"log type {log_types[0]!r} cannot be column {column}: {exc}"
            refused.update(dict.fromkeys(group, why))
            continue
        usable.update(group)
    return usable, refused


# -- in a task ----------------------------------------------------------------------------------
class RecordTyper:
    """Turns one topic's lines (with their chunks' schema ids) into its struct column."""

    def __init__(self, schemas: TopicSchemas) -> None:
        self.newest = parse(schemas.newest, max_depth=None)
        self.column_type = spark_type(self.newest)
        self.arrow = arrow_type(self.column_type)
        self._texts = schemas.by_id
        self._writers: dict[int, tuple[AvroSchema, Any] | None] = {}
        self._reader = fastavro.parse_schema(json.loads(schemas.newest))

    def _writer(self, schema_id: int) -> tuple[AvroSchema, Any] | None:
        if schema_id not in self._writers:
            text = self._texts.get(format_schema_id(schema_id))
            found = None
            if text is not None:
                writer = parse(text, max_depth=None)
                if can_read(self.newest, writer):
                    found = (writer, fastavro.parse_schema(json.loads(text)))
            self._writers[schema_id] = found
        return self._writers[schema_id]

    def _resolved(self, schema_id: int | None, line: bytes) -> Any:
        if schema_id is None:
            return None
        writer = self._writer(schema_id)
        if writer is None:
            return None
        schema, parsed = writer
        try:
            record = record_of(schema, line)
        except BadRecord:
            return None
        if schema.schema_id == self.newest.schema_id:
            return record
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, record)
        buffer.seek(0)
        return fastavro.schemaless_reader(buffer, parsed, self._reader)

    def column(self, lines: pa.Array, schema_ids: pa.Array) -> pa.Array:
        values = [
            _to_column_value(self.column_type, self._resolved(sid, line.encode("utf-8")))
            for sid, line in zip(schema_ids.to_pylist(), lines.to_pylist(), strict=True)
        ]
        return pa.array(values, self.arrow)
