"""Deep nesting is refused with a 400, not a 500 and a traceback: a record nested deeper
than ``MAX_RECORD_DEPTH`` (against a recursive schema), a schema nested deeper than
``MAX_SCHEMA_DEPTH``; nothing is written or registered."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from schema_registry.avro_schema import MAX_SCHEMA_DEPTH, parse
from schema_registry.errors import BadRecord, InvalidSchema
from schema_registry.json_records import MAX_RECORD_DEPTH, record_of
from tests.conftest import GatewayProcess
from tests.gateway.conftest import end_offsets

NODE: dict[str, Any] = {  # a linked list: a record may hold another of its kind
    "type": "record",
    "name": "Node",
    "fields": [{"name": "next", "type": ["null", "Node"], "default": None}],
}


def _chain(levels: int) -> bytes:
    """A record nested ``levels`` objects deep (the outermost is level 1)."""
    return ('{"next":' * levels + "null" + "}" * levels).encode()


def _arrays(levels: int) -> dict[str, Any]:
    """A record schema whose field is an array of arrays ... ``levels`` arrays deep."""
    inner: Any = "int"
    for _ in range(levels):
        inner = {"type": "array", "items": inner}
    return {"type": "record", "name": "Deep", "fields": [{"name": "a", "type": inner}]}


def test_a_record_nested_past_the_bound_is_a_bad_record() -> None:
    schema = parse(NODE)
    record_of(schema, _chain(MAX_RECORD_DEPTH))  # at the bound: taken
    for levels in (MAX_RECORD_DEPTH + 1, 400, 1000):
        with pytest.raises(BadRecord, match=f"nests at most {MAX_RECORD_DEPTH} levels"):
            record_of(schema, _chain(levels))
    with pytest.raises(BadRecord, match="not JSON"):
        record_of(schema, _chain(5000))  # past what the JSON parser itself takes


def test_a_schema_nested_past_the_bound_is_invalid() -> None:
    # the field list, the field and the record: three levels; an array one more
    parse(_arrays(MAX_SCHEMA_DEPTH - 3))
    for levels in (MAX_SCHEMA_DEPTH - 2, 505):
        with pytest.raises(InvalidSchema, match=f"nests at most {MAX_SCHEMA_DEPTH} levels"):
            parse(_arrays(levels))
        with pytest.raises(InvalidSchema, match=f"nests at most {MAX_SCHEMA_DEPTH} levels"):
            parse(json.dumps(_arrays(levels)))
    with pytest.raises(InvalidSchema, match="nests"):
        parse("[" * 200_000)  # Python's JSON reader runs out of stack before any check


def test_deep_records_and_schemas_are_400_on_a_gateway(gateway: GatewayProcess) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        created = http.post("/v1/schemas/deep/versions", json={"schema": json.dumps(NODE)})
        assert created.status_code == 201, created.text
        before = end_offsets(gateway.data_dir)
        line = _chain(400).decode() + "\n"
        item = {"log_type": "deep", "source_id": "deep400", "seqno": 1, "data": line}
        written = http.post(
            "/v1/write",
            content=json.dumps(item) + "\n",
            headers={"content-type": "application/x-ndjson"},
        )
        assert written.status_code == 400, written.text
        assert written.json()["error"] == "bad_record", written.text
        assert end_offsets(gateway.data_dir) == before
        refused = http.post("/v1/schemas/app/versions", json={"schema": json.dumps(_arrays(505))})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == "invalid_schema"
        assert http.get("/v1/schemas/app").status_code == 404
        assert http.get("/healthz").status_code == 200
    assert "Traceback" not in gateway.log()
