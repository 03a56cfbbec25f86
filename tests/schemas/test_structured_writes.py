"""A real gateway with structured log types: registration under compatibility modes, writes
checked record by record with a refusal per section, the schema id read back by readers, and
the registry surviving a SIGKILL of the gateway."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from log_store import open_store
from schema_registry.avro_schema import parse
from schema_registry.registry import SchemaRegistry
from tests.conftest import GatewayProcess, logbroker_cmd
from tests.gateway.conftest import end_offsets, meta, topic_envelopes
from tests.schemas.conftest import ORDER_BROKEN, ORDER_V1, ORDER_V2


def register(http: httpx.Client, log_type: str, schema: Any) -> httpx.Response:
    return http.post(f"/v1/schemas/{log_type}/versions", json={"schema": schema})


def write(
    http: httpx.Client, sections: list[tuple[dict[str, str], list[tuple[int, bytes]]]]
) -> Any:
    body = encode_binary([(m, [(s, 0, d) for s, d in chunks]) for m, chunks in sections])
    return http.post("/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE})


def orders(*items: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(i).encode() + b"\n" for i in items)


GOOD = orders({"id": 1, "amount": 9.5, "city": "Oslo"}, {"id": 2, "amount": 3, "city": "Rome"})


@pytest.fixture
def http(gateway: GatewayProcess) -> Any:
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        yield client


def test_a_registered_version_is_listed_shown_and_registered_again_idempotently(
    http: httpx.Client,
) -> None:
    first = register(http, "orders", ORDER_V1)
    assert first.status_code == 201, first.text
    assert first.json()["version"] == 1 and first.json()["created"] is True
    again = register(http, "orders", json.dumps(ORDER_V1))  # the same schema, as a string
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["created"] is False
    described = http.get("/v1/schemas/orders").json()
    assert described["compatibility"] == "backward"
    assert [v["version"] for v in described["versions"]] == [1]
    shown = http.get("/v1/schemas/orders/versions/latest").json()
    assert shown["schema"]["name"] == "Order" and shown["id"] == first.json()["id"]
    assert http.get("/v1/schemas").json() == {"log_types": ["orders"]}
    assert http.get("/v1/schemas/orders/versions/7").status_code == 404
    for odd in ("%C2%B2", "%D9%A1", "1_0", "+1"):  # a superscript 2, an Arabic-Indic 1
        refused = http.get(f"/v1/schemas/orders/versions/{odd}")
        assert refused.status_code == 400, (odd, refused.text)
    assert http.get("/v1/schemas/nothing").json()["error"] == "unknown_log_type"


def test_registration_is_refused_when_it_breaks_the_compatibility_mode(
    http: httpx.Client,
) -> None:
    assert register(http, "orders", ORDER_V1).status_code == 201
    refused = register(http, "orders", ORDER_BROKEN)
    assert refused.status_code == 409
    assert refused.json()["error"] == "incompatible_schema"
    assert refused.json()["problems"] == [
        "the new schema cannot read version 1: country: the reader's field has no default "
        "and the writer lacks it"
    ]
    assert register(http, "orders", ORDER_V2).status_code == 201
    # forward: v1 and v2 must read the new schema's data; v2 dropping city breaks that
    mode = http.put("/v1/schemas/orders/compatibility", json={"compatibility": "forward"})
    assert mode.status_code == 200 and mode.json()["compatibility"] == "forward"
    no_city = {**ORDER_V2, "fields": [f for f in ORDER_V2["fields"] if f["name"] != "city"]}
    assert register(http, "orders", no_city).status_code == 409
    http.put("/v1/schemas/orders/compatibility", json={"compatibility": "none"})
    assert register(http, "orders", ORDER_BROKEN).json()["version"] == 3
    bad = register(http, "orders", {"type": "record", "name": "X", "fields": [{"name": "a"}]})
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_schema")
    mode = http.put("/v1/schemas/orders/compatibility", json={"compatibility": "sideways"})
    assert mode.status_code == 400
    versions = http.get("/v1/schemas/orders").json()["versions"]
    assert [v["version"] for v in versions] == [1, 2, 3]


def test_a_bad_record_refuses_its_section_alone_and_good_sections_are_stamped(
    gateway: GatewayProcess, http: httpx.Client
) -> None:
    v1 = register(http, "orders", ORDER_V1).json()
    bad_chunk = orders({"id": 3, "amount": 1, "city": "Oslo"}, {"id": "4", "amount": 1})
    answer = write(
        http,
        [
            (meta("good", "orders"), [(10, GOOD)]),
            (meta("bad", "orders"), [(10, GOOD), (20, bad_chunk)]),
            (meta("plain", "app"), [(5, b"not json at all\n")]),
            (meta("zipped", "orders", codec="gzip"), [(7, gzip.compress(GOOD))]),
        ],
    )
    assert answer.status_code == 200, answer.text
    good, bad, plain, zipped = answer.json()["results"]
    assert [a["status"] for a in good["acks"]] == ["written"]
    assert bad["status"] == 400 and bad["error"] == "bad_record"
    assert "chunk seqno 20, line 2: id: expected int, got a string" in bad["reason"]
    assert f"version 1 (id {v1['id']})" in bad["reason"]
    assert [a["status"] for a in plain["acks"]] == ["written"]
    assert [a["status"] for a in zipped["acks"]] == ["written"]
    written = [
        env
        for records in topic_envelopes(gateway.data_dir, "dc1.orders").values()
        for _, env in records
    ]
    assert sorted(e.source_id for e in written) == ["good", "zipped"]  # nothing of "bad"
    assert {f"{e.schema_id:016x}" for e in written} == {v1["id"]}
    [plain_env] = [
        env
        for records in topic_envelopes(gateway.data_dir, "dc1.app").values()
        for _, env in records
    ]
    assert plain_env.schema_id is None

    # after v2, writes are checked against v2 and stamped with its id
    v2 = register(http, "orders", ORDER_V2).json()
    coupon = orders({"id": 2**40, "amount": 1.5, "city": "Oslo", "coupon": "X1"})
    assert write(http, [(meta("good", "orders"), [(11, coupon)])]).status_code == 200
    # a pull reader sees each chunk's schema id
    partition = good["partition"]
    read = http.get(
        f"/v1/topics/dc1.orders/partitions/{partition}/messages", params={"offset": 0}
    ).json()
    stamps = [(m["source_id"], m["seqno"], m.get("schema_id")) for m in read["messages"]]
    assert ("good", 10, v1["id"]) in stamps and ("good", 11, v2["id"]) in stamps
    # and so does `logbroker read --format jsonl`
    out = subprocess.run(
        logbroker_cmd(
            "read",
            "--server",
            gateway.url,
            "--topic",
            "dc1.orders",
            "--from-beginning",
            "--format",
            "jsonl",
            "--idle-exit",
            "1",
        ),
        capture_output=True,
        timeout=120,
        check=True,
    ).stdout.decode()
    lines = [json.loads(line) for line in out.splitlines()]
    assert {(r["seqno"], r["schema_id"]) for r in lines if r["source_id"] == "good"} == {
        (10, v1["id"]),
        (11, v2["id"]),
    }
    # readers get the schemas by topic
    by_topic = http.get("/v1/topics/dc1.orders/schemas").json()
    assert [v["id"] for v in by_topic["versions"]] == [v1["id"], v2["id"]]


def test_a_request_whose_every_section_is_bad_is_a_400_that_writes_nothing(
    gateway: GatewayProcess, http: httpx.Client
) -> None:
    register(http, "orders", ORDER_V1)
    before = end_offsets(gateway.data_dir)
    answer = write(http, [(meta("s", "orders"), [(1, GOOD + b'{"id": 5, "amount": 1}\n')])])
    assert answer.status_code == 400
    assert answer.json()["error"] == "bad_record"
    assert "chunk seqno 1, line 3: city: missing" in answer.json()["reason"]
    assert end_offsets(gateway.data_dir) == before


def test_a_float_past_float32_and_a_key_written_twice_are_bad_records(
    gateway: GatewayProcess, http: httpx.Client
) -> None:
    register(http, "orders", ORDER_V1)
    before = end_offsets(gateway.data_dir)
    huge = write(
        http, [(meta("f", "orders"), [(1, b'{"id": 1, "amount": 1e39, "city": "Oslo"}\n')])]
    )
    twice = write(
        http, [(meta("d", "orders"), [(1, b'{"id": 1, "amount": 1, "city": "Oslo", "id": 2}\n')])]
    )
    assert huge.status_code == twice.status_code == 400
    assert "line 1: amount: 1e+39 is outside the range of float" in huge.json()["reason"]
    assert "line 1: key 'id' appears twice in one object" in twice.json()["reason"]
    assert end_offsets(gateway.data_dir) == before


def test_the_registry_survives_a_sigkill_of_the_gateway(start_gateway: Any, tmp_path: Path) -> None:
    gateway = start_gateway(tmp_path / "data")
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        register(http, "orders", ORDER_V1)
        v2 = register(http, "orders", ORDER_V2).json()
    gateway.kill()
    again = start_gateway(tmp_path / "data")
    with httpx.Client(base_url=again.url, timeout=30) as http:
        assert [v["id"] for v in http.get("/v1/schemas/orders").json()["versions"]][1] == v2["id"]
        assert register(http, "orders", ORDER_BROKEN).status_code == 409
        refused = write(http, [(meta("s", "orders"), [(1, b'{"id": 1}\n')])])
        assert refused.status_code == 400 and refused.json()["error"] == "bad_record"


def test_the_audit_log_type_takes_no_schema_and_its_records_are_written_as_ever(
    start_gateway: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:  # registered by a gateway that did not refuse it yet
        SchemaRegistry(store).register("logbroker-audit", parse(ORDER_V1))
    gateway = start_gateway(data_dir)
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        refused = register(http, "logbroker-audit", ORDER_V1)
        assert refused.status_code == 400, refused.text
        assert "audit" in refused.json()["reason"]
        record = {
            "tier": "push-client",
            "instance": "host-a",
            "topic": "dc1.app",
            "window_start": 1_700_000_400,
            "messages": 1,
            "lines": 2,
            "published_ms": 1,
        }
        written = write(
            http,
            [
                (
                    meta("audit:push-client:host-a", "logbroker-audit"),
                    [(1, json.dumps(record).encode() + b"\n")],
                )
            ],
        )
        assert written.status_code == 200, written.text
        assert written.json()["results"][0]["acks"][0]["status"] == "written"


def test_a_bad_record_refuses_every_section_of_its_source_in_the_request(
    gateway: GatewayProcess, http: httpx.Client
) -> None:
    """A later good section of the same source is not written over the gap the refused one
    leaves: the refused chunks, sent again once mended, would be answered ``duplicate``."""
    register(http, "orders", ORDER_V1)
    bad_chunk = orders({"id": "3", "amount": 1, "city": "Oslo"})
    answer = write(
        http,
        [
            (meta("mixed", "orders"), [(10, bad_chunk)]),
            (meta("other", "orders"), [(10, GOOD)]),
            (meta("mixed", "orders"), [(20, GOOD)]),
        ],
    )
    assert answer.status_code == 200, answer.text
    first, other, second = answer.json()["results"]
    assert first["error"] == "bad_record" and second["error"] == "bad_record"
    assert [a["status"] for a in other["acks"]] == ["written"]
    mended = write(http, [(meta("mixed", "orders"), [(10, GOOD), (20, GOOD)])])
    assert [a["status"] for a in mended.json()["results"][0]["acks"]] == ["written", "written"]
