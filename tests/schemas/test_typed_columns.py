"""How a structured log type's schema becomes the loader's struct column, and how the table's
schema may evolve (the Spark load itself is in tests/yt_loader/test_structured_load.py)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from schema_registry import parse
from tests.schemas.conftest import ORDER_V1, ORDER_V2
from yt_loader.typed_columns import (
    RecordTyper,
    TopicSchemas,
    TypedColumnConflict,
    UnloadableSchema,
    column_name,
    evolved_table_schema,
    spark_type,
    usable_columns,
)

BASE_TABLE = {
    "type": "struct",
    "fields": [{"name": "line", "type": "string", "nullable": True, "metadata": {}}],
}


def topic(*versions: dict[str, Any]) -> TopicSchemas:
    texts = [(parse(v).id_hex, json.dumps(v)) for v in versions]
    return TopicSchemas("dc1.orders", "orders", texts[-1][1], dict(texts))


def field_types(table: dict[str, Any], column: str) -> dict[str, Any]:
    [found] = [f for f in table["fields"] if f["name"] == column]
    return {f["name"]: f["type"] for f in found["type"]["fields"]}


def test_avro_types_map_to_column_types_that_promotions_do_not_change() -> None:
    schema = parse(
        {
            "type": "record",
            "name": "All",
            "fields": [
                {"name": "i", "type": "int"},
                {"name": "f", "type": "float"},
                {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["a"]}},
                {"name": "b", "type": "bytes"},
                {"name": "o", "type": ["null", "boolean"]},
                {"name": "u", "type": ["int", "string"]},
                {"name": "a", "type": {"type": "array", "items": "long"}},
                {"name": "m", "type": {"type": "map", "values": "double"}},
            ],
        }
    )
    types = {f["name"]: f["type"] for f in spark_type(schema)["fields"]}
    assert types["i"] == "long" and types["f"] == "double"
    assert types["e"] == "string" and types["b"] == "binary" and types["o"] == "boolean"
    assert types["u"] == "string"  # a union of two types: its value as JSON
    assert types["a"]["elementType"] == "long" and types["m"]["valueType"] == "double"
    assert column_name("nginx-access.v2") == "record_nginx_access_v2"


def test_a_new_version_widens_the_column_and_keeps_the_old_fields_in_place() -> None:
    first = evolved_table_schema(BASE_TABLE, {"dc1.orders": topic(ORDER_V1)})
    assert first is not None
    assert list(field_types(first, "record_orders")) == ["id", "amount", "city"]
    assert evolved_table_schema(first, {"dc1.orders": topic(ORDER_V1)}) is None  # no change
    no_city = {**ORDER_V2, "fields": [f for f in ORDER_V2["fields"] if f["name"] != "city"]}
    wider = evolved_table_schema(first, {"dc1.orders": topic(ORDER_V1, ORDER_V2, no_city)})
    assert wider is not None
    assert list(field_types(wider, "record_orders")) == ["id", "amount", "city", "coupon"]


def test_a_column_type_change_is_refused_before_anything_is_written() -> None:
    first = evolved_table_schema(BASE_TABLE, {"dc1.orders": topic(ORDER_V1)})
    assert first is not None
    as_text = {
        **ORDER_V1,
        "fields": [{"name": "id", "type": "string"}, *ORDER_V1["fields"][1:]],
    }
    with pytest.raises(TypedColumnConflict, match=r"record_orders\.id is long .* string"):
        evolved_table_schema(first, {"dc1.orders": topic(ORDER_V1, as_text)})


def test_lines_are_resolved_to_the_newest_schema_and_untypable_lines_are_null() -> None:
    typer = RecordTyper(topic(ORDER_V1, ORDER_V2))
    v1, v2 = parse(ORDER_V1).schema_id, parse(ORDER_V2).schema_id
    lines = pa.array(
        [
            '{"id": 1, "amount": 2.5, "city": "Oslo"}',
            '{"id": 2, "amount": 1, "city": "Rome", "coupon": "X"}',
            "free text",
            '{"id": 3, "amount": 1, "city": "Riga"}',
        ]
    )
    ids = pa.array([v1, v2, None, 0xDEAD], pa.uint64())
    assert typer.column(lines, ids).to_pylist() == [
        {"id": 1, "amount": 2.5, "city": "Oslo", "coupon": None},
        {"id": 2, "amount": 1.0, "city": "Rome", "coupon": "X"},
        None,  # no stamp
        None,  # an id the registry does not know
    ]


def _named(log_type: str, *fields: dict[str, Any]) -> TopicSchemas:
    schema = {
        "type": "record",
        "name": "R",
        "fields": list(fields or [{"name": "x", "type": "int"}]),
    }
    return TopicSchemas(f"dc1.{log_type}", log_type, json.dumps(schema), {})


def test_a_schema_that_cannot_be_a_column_is_refused_for_its_topics_alone() -> None:
    good = _named("orders", {"name": "id", "type": "long"})
    twin_a = _named("web-log", {"name": "a", "type": "long"})
    twin_b = _named("web.log", {"name": "b", "type": "long"})
    cased = _named("cased", {"name": "Id", "type": "long"}, {"name": "id", "type": "long"})
    spaced = _named("spaced", {"name": "a b", "type": "long"})
    empty = _named(
        "empty", {"name": "inner", "type": {"type": "record", "name": "E", "fields": []}}
    )
    topics = {s.topic: s for s in (good, twin_a, twin_b, cased, spaced, empty)}

    usable, refused = usable_columns(BASE_TABLE, topics)

    assert list(usable) == ["dc1.orders"]
    assert (
        "log types 'web-log' and 'web.log' both make column record_web_log"
        in (refused["dc1.web-log"])
    )
    assert refused["dc1.web-log"] == refused["dc1.web.log"]
    assert "fields record_cased.Id and record_cased.id differ only in case" in refused["dc1.cased"]
    assert "field record_spaced.'a b' has ' ' in its name" in refused["dc1.spaced"]
    assert "record_empty.inner is a record with no fields" in refused["dc1.empty"]
    with pytest.raises(UnloadableSchema):
        evolved_table_schema(BASE_TABLE, {"dc1.cased": cased})


def test_a_column_names_its_log_type_and_another_log_type_folding_to_it_is_refused() -> None:
    table = evolved_table_schema(BASE_TABLE, {"dc1.web-log": _named("web-log")})
    assert table is not None
    [column] = [f for f in table["fields"] if f["name"] == "record_web_log"]
    assert column["metadata"] == {"logbroker.log_type": "web-log"}
    assert usable_columns(table, {"dc2.web-log": _named("web-log")})[1] == {}
    _, refused = usable_columns(table, {"dc1.web_log": _named("web_log")})
    assert (
        "column record_web_log, which holds log type 'web-log' in this table"
        in (refused["dc1.web_log"])
    )
