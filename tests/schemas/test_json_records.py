"""What a structured line must be beyond its schema's types: a float inside float32, and no
key written twice (which of two values counts differs between JSON readers)."""

from __future__ import annotations

import pytest

from schema_registry.avro_schema import parse
from schema_registry.errors import BadRecord
from schema_registry.json_records import record_of

SCHEMA = parse(
    {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "ratio", "type": "float"},
            {"name": "exact", "type": "double"},
            {"name": "tags", "type": {"type": "map", "values": "string"}},
            {"name": "either", "type": ["float", "double"], "default": 0.0},
        ],
    }
)


def _line(ratio: str = "1.5", exact: str = "2.5", tags: str = "{}", more: str = "") -> bytes:
    return f'{{"id": 1, "ratio": {ratio}, "exact": {exact}, "tags": {tags}{more}}}'.encode()


@pytest.mark.parametrize("ratio", ["1e39", "-1e39", "3.4028236e38"])
def test_a_float_outside_float32_is_refused(ratio: str) -> None:
    with pytest.raises(BadRecord, match=r"ratio: .* is outside the range of float"):
        record_of(SCHEMA, _line(ratio=ratio))


def test_float32_extremes_and_doubles_are_taken() -> None:
    record = record_of(SCHEMA, _line(ratio="3.4028234e38", exact="1e300"))
    assert record["ratio"] == 3.4028234e38 and record["exact"] == 1e300
    # a union of float and double takes what float cannot hold as a double
    assert record_of(SCHEMA, _line(more=', "either": 1e39'))["either"] == 1e39


@pytest.mark.parametrize(
    ("line", "key"),
    [
        (_line(more=', "id": 2'), "id"),
        (_line(tags='{"a": "x", "a": "y"}'), "a"),
        (_line(tags='{"a": "x:y", "\\u0061": "z"}'), "a"),  # the same key, escaped
        (_line(tags='{"url": "http://h/", "b": "1", "b": "2"}'), "b"),
    ],
)
def test_a_key_written_twice_is_refused_naming_it(line: bytes, key: str) -> None:
    with pytest.raises(BadRecord, match=f"key '{key}' appears twice in one object"):
        record_of(SCHEMA, line)


def test_colons_inside_strings_are_not_keys() -> None:
    line = _line(tags='{"time": "12:00:01", "url": "http://h:80/a\\":b"}')
    assert record_of(SCHEMA, line)["tags"] == {"time": "12:00:01", "url": 'http://h:80/a":b'}
