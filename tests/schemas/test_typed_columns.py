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
    column_name,
    evolved_table_schema,
    spark_type,
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
