"""Every malformed request gets a 4xx with a JSON reason and writes nothing at all.

A request whose good sections sit beside a bad one is not malformed as a whole: the bad section
is refused on its own and the rest written (``test_write_protocol``'s per-section tests).
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, MAGIC, NDJSON_MEDIA_TYPE, encode_binary
from log_store.errors import BadRequest
from ops.commands.read import _filter
from push_client.config import build_config
from tests.gateway.conftest import end_offsets, meta

GOOD_META = meta("src")


def section(meta_obj: Any, chunks: list[tuple[int, int, bytes]]) -> bytes:
    return encode_binary([(meta_obj, chunks)])[4:]


def raw_section(meta_bytes: bytes, count: int, chunk_bytes: bytes) -> bytes:
    return struct.pack(">H", len(meta_bytes)) + meta_bytes + struct.pack(">I", count) + chunk_bytes


GOOD_SECTION = section(GOOD_META, [(1, 0, b"ok\n")])
GOOD_META_JSON = orjson.dumps(GOOD_META)

BINARY_CASES: dict[str, bytes] = {
    "empty body": b"",
    "wrong magic": b"LBW2" + GOOD_SECTION,
    "truncated magic": b"LB",
    "truncated meta length": MAGIC + b"\x00",
    "meta length past the end": MAGIC + struct.pack(">H", 500) + GOOD_META_JSON,
    "meta not json": MAGIC + raw_section(b"{not json", 0, b""),
    "meta invalid utf-8": MAGIC
    + raw_section(b'{"log_type": "app", "source_id": "\xff\xfe"}', 0, b""),
    "meta is a list": MAGIC + raw_section(b"[1, 2]", 0, b""),
    "meta unknown field": MAGIC + section({**GOOD_META, "topic": "x"}, [(1, 0, b"a")]),
    "missing source_id": MAGIC + section({"log_type": "app"}, [(1, 0, b"a")]),
    "empty source_id": MAGIC + section(meta(""), [(1, 0, b"a")]),
    "source_id with control character": MAGIC + section(meta("a\x07b"), [(1, 0, b"a")]),
    "source_id over 512 characters": MAGIC + section(meta("é" * 513), [(1, 0, b"a")]),
    "source_id not a string": MAGIC + section({**GOOD_META, "source_id": 5}, [(1, 0, b"a")]),
    "log_type path traversal": MAGIC + section(meta("s", "../../etc"), [(1, 0, b"a")]),
    "log_type with slash": MAGIC + section(meta("s", "a/b"), [(1, 0, b"a")]),
    "log_type with dot-dot": MAGIC + section(meta("s", "a..b"), [(1, 0, b"a")]),
    "log_type uppercase": MAGIC + section(meta("s", "App"), [(1, 0, b"a")]),
    "log_type empty": MAGIC + section(meta("s", ""), [(1, 0, b"a")]),
    "unknown codec": MAGIC + section(meta("s", codec="lz4"), [(1, 0, b"a")]),
    "server with NUL": MAGIC + section(meta("s", server="a\x00b"), [(1, 0, b"a")]),
    "chunk count past the end": MAGIC + raw_section(GOOD_META_JSON, 3, b""),
    "truncated chunk header": MAGIC + raw_section(GOOD_META_JSON, 1, b"\x00" * 10),
    "chunk data past the end": MAGIC
    + raw_section(GOOD_META_JSON, 1, struct.pack(">QqI", 1, 0, 100) + b"short"),
    "seqno zero": MAGIC + section(GOOD_META, [(0, 0, b"a")]),
    "seqno 2**63": MAGIC + section(GOOD_META, [(2**63, 0, b"a")]),
    "seqno 2**64-1 (negative as i64)": MAGIC + section(GOOD_META, [(2**64 - 1, 0, b"a")]),
    "good section then garbage": MAGIC + GOOD_SECTION + b"\x01",
    "negative epoch": MAGIC + section({**GOOD_META, "epoch": -1}, [(1, 0, b"a")]),
    "epoch a string": MAGIC + section({**GOOD_META, "epoch": "1"}, [(1, 0, b"a")]),
    "prev_seqno null": MAGIC + section({**GOOD_META, "prev_seqno": None}, [(1, 0, b"a")]),
    "prev_seqno 2**63": MAGIC + section({**GOOD_META, "prev_seqno": 2**63}, [(1, 0, b"a")]),
}


def _line(**fields: Any) -> bytes:
    return orjson.dumps({"log_type": "app", "source_id": "nd", **fields})


NDJSON_CASES: dict[str, bytes] = {
    "not json": b"{nope\n",
    "a json list": b"[1, 2]\n",
    "invalid utf-8": b'{"log_type": "app", "source_id": "\xc3\x28", "seqno": 1, "data": "a"}\n',
    "lone surrogate escape": b'{"log_type":"app","source_id":"nd","seqno":1,"data":"\\ud800"}\n',
    "missing seqno": _line(data="a"),
    "negative seqno": _line(seqno=-1, data="a"),
    "seqno 2**64": b'{"log_type":"app","source_id":"nd","seqno":18446744073709551616,"data":"a"}',
    "seqno 2**63": _line(seqno=2**63, data="a"),
    "seqno float": _line(seqno=1.5, data="a"),
    "seqno boolean": _line(seqno=True, data="a"),
    "seqno string": _line(seqno="1", data="a"),
    "data and data_b64": _line(seqno=1, data="a", data_b64="YQ=="),
    "neither data nor data_b64": _line(seqno=1),
    "bad base64": _line(seqno=1, data_b64="!!!"),
    "data not a string": _line(seqno=1, data=5),
    "unknown field": _line(seqno=1, data="a", partition=2),
    "create_time a string": _line(seqno=1, data="a", create_time="now"),
    "epoch a float": _line(seqno=1, data="a", epoch=1.5),
    "prev_seqno negative": _line(seqno=1, data="a", prev_seqno=-2),
    "path-like log_type": orjson.dumps(
        {"log_type": "../x", "source_id": "nd", "seqno": 1, "data": "a"}
    ),
}

SESSION_CASES: dict[str, bytes] = {
    "not json": b"{",
    "a list": b"[]",
    "invalid utf-8": b'{"log_type": "app", "source_id": "\xff"}',
    "missing log_type": b'{"source_id": "a"}',
    "path-like log_type": b'{"log_type": "../../etc/passwd", "source_id": "a"}',
    "empty batch": b'{"sessions": []}',
    "batch not a list": b'{"sessions": {"log_type": "app"}}',
    "batch with an extra key": b'{"sessions": [{"log_type": "app", "source_id": "a"}], "x": 1}',
    "unknown field": b'{"log_type": "app", "source_id": "a", "seqno": 3}',
    "fence not a boolean": b'{"log_type": "app", "source_id": "a", "fence": 1}',
    "fence null": b'{"log_type": "app", "source_id": "a", "fence": null}',
}


def written_topics(data_dir: Any) -> dict[tuple[str, int], int]:
    """End offsets of the topics writes go to (``dc1.*``); other parts keep their own topics."""
    return {k: v for k, v in end_offsets(data_dir).items() if k[0].startswith("dc1.")}


def assert_rejected(response: httpx.Response, data_dir: Any) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    body = response.json()
    assert isinstance(body["error"], str) and body["error"]
    assert isinstance(body["reason"], str) and body["reason"]
    assert written_topics(data_dir) == {}, "a rejected request created a topic or wrote records"


@pytest.mark.parametrize("case", list(BINARY_CASES))
def test_malformed_binary_write_is_rejected_and_writes_nothing(
    shared_gateway: Any, case: str
) -> None:
    response = httpx.post(
        shared_gateway.url + "/v1/write",
        content=BINARY_CASES[case],
        headers={"content-type": BINARY_MEDIA_TYPE},
    )
    assert_rejected(response, shared_gateway.data_dir)


@pytest.mark.parametrize("case", list(NDJSON_CASES))
def test_malformed_ndjson_write_is_rejected_and_writes_nothing(
    shared_gateway: Any, case: str
) -> None:
    response = httpx.post(
        shared_gateway.url + "/v1/write",
        content=NDJSON_CASES[case],
        headers={"content-type": NDJSON_MEDIA_TYPE},
    )
    assert_rejected(response, shared_gateway.data_dir)


@pytest.mark.parametrize("case", list(SESSION_CASES))
def test_malformed_session_request_is_rejected_and_creates_nothing(
    shared_gateway: Any, case: str
) -> None:
    response = httpx.post(
        shared_gateway.url + "/v1/sessions",
        content=SESSION_CASES[case],
        headers={"content-type": "application/json"},
    )
    assert_rejected(response, shared_gateway.data_dir)


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/v1/write", "text/plain"),
        ("/v1/write", "application/json"),
        ("/v1/write", ""),
        ("/v1/sessions", "application/x-www-form-urlencoded"),
    ],
)
def test_wrong_content_type_is_415(shared_gateway: Any, path: str, content_type: str) -> None:
    response = httpx.post(
        shared_gateway.url + path,
        content=MAGIC + GOOD_SECTION,
        headers={"content-type": content_type},
    )
    assert response.status_code == 415
    assert_rejected(response, shared_gateway.data_dir)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/subscriptions",
            {"name": "exfil-{tag}", "endpoint": "http://93.184.216.34/c", "prefix": "dc1."},
        ),
        ("/v1/groups/csrf-{tag}/members", {"topics": ["dc1.app"]}),
        ("/v1/clients/status", {"client": "csrf-{tag}", "files": []}),
        ("/v1/fetch", {"partitions": [{"topic": "dc1.app", "partition": 0, "offset": 0}]}),
    ],
)
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_json_body_a_web_page_could_send_without_asking_is_415_and_changes_nothing(
    shared_gateway: Any, path: str, body: dict[str, Any], content_type: str
) -> None:
    # What any web page can make a browser POST to a gateway on loopback without tokens,
    # with no CORS preflight: nothing of it may be taken.
    tag = "form" if "form" in content_type else "text"
    path = path.replace("{tag}", tag)
    content = orjson.dumps(body).replace(b"{tag}", tag.encode())
    from_page = httpx.post(
        shared_gateway.url + path,
        content=content,
        headers={"content-type": content_type, "origin": "http://attacker.example"},
    )
    # the page's Origin is refused first (ingest_api/host_check.py); the content type is
    # refused as well, for a request that shows no Origin
    assert (from_page.status_code, from_page.json()["error"]) == (403, "cross_origin")
    response = httpx.post(
        shared_gateway.url + path, content=content, headers={"content-type": content_type}
    )
    assert (response.status_code, response.json()["error"]) == (415, "unsupported_media_type")
    listed = httpx.get(shared_gateway.url + "/v1/subscriptions").json()["subscriptions"]
    assert f"exfil-{tag}" not in [s["name"] for s in listed]
    if "/groups/" in path:
        assert httpx.get(shared_gateway.url + f"/v1/groups/csrf-{tag}").status_code == 404
    # the same body sent as application/json is read
    taken = httpx.post(
        shared_gateway.url + path, content=content, headers={"content-type": "application/json"}
    )
    assert taken.status_code != 415, taken.text
    httpx.delete(shared_gateway.url + f"/v1/subscriptions/exfil-{tag}")


def test_every_operation_taking_json_documents_415_and_answers_it(shared_gateway: Any) -> None:
    """Walked from /openapi.json, so a JSON route added later is checked too."""
    doc = httpx.get(shared_gateway.url + "/openapi.json").json()
    values = {"group": "g415", "member": "m415", "log_type": "app", "topic": "dc1.app"}
    walked = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if "application/json" not in op.get("requestBody", {}).get("content", {}):
                continue
            assert "415" in op["responses"], (method, path)
            url = shared_gateway.url + path.format(partition=0, **values)
            answer = httpx.request(
                method, url, content=b"{}", headers={"content-type": "text/plain"}
            )
            assert answer.status_code == 415, (method, path, answer.text)
            walked.append(path)
    assert "/v1/fetch" in walked and "/v1/sessions" in walked


def test_wrong_method_and_unknown_path_answer_json_errors(shared_gateway: Any) -> None:
    wrong_method = httpx.get(shared_gateway.url + "/v1/write")
    assert_rejected(wrong_method, shared_gateway.data_dir)
    assert wrong_method.status_code == 405
    assert wrong_method.json()["reason"] == "GET is not allowed on /v1/write"
    unknown = httpx.get(shared_gateway.url + "/v1/nothing")
    assert_rejected(unknown, shared_gateway.data_dir)
    assert unknown.json() == {"error": "not_found", "reason": "no endpoint GET /v1/nothing"}
    # a topic name holding '/' (sent as %2F) is never a route: the answer says why
    slashed = httpx.get(shared_gateway.url + "/v1/topics/dc1.a%2F..%2Fb/partitions")
    assert_rejected(slashed, shared_gateway.data_dir)
    assert slashed.status_code == 404
    assert "a topic name is 1-201 characters of [a-z0-9._-]" in slashed.json()["reason"]


def test_a_truncated_body_cut_by_the_client_is_rejected(shared_gateway: Any) -> None:
    import socket

    body = MAGIC + GOOD_SECTION
    with socket.create_connection(("127.0.0.1", shared_gateway.port)) as sock:
        sock.sendall(
            b"POST /v1/write HTTP/1.1\r\nHost: x\r\nContent-Type: "
            + BINARY_MEDIA_TYPE.encode()
            + b"\r\nContent-Length: "
            + str(len(body) + 100).encode()
            + b"\r\n\r\n"
            + body
        )
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(10)
        answer = sock.recv(65536)
    # the gateway may answer 400 or just close; either way nothing may be written
    assert answer == b"" or answer.split(b" ")[1].startswith(b"4")
    assert written_topics(shared_gateway.data_dir) == {}


def test_one_log_type_rule_for_the_gateway_the_legacy_api_the_push_client_and_read(
    gateway: Any, tmp_path: Path
) -> None:
    longest, too_long = "a" * 100, "a" * 101
    for log_type, ok in ((longest, True), (too_long, False), ("a..b", False)):
        session = httpx.post(
            gateway.url + "/v1/sessions", json={"log_type": log_type, "source_id": "s"}
        )
        staged = httpx.post(gateway.url + "/store", params={"log_type": log_type}, content=b"x\n")
        assert (session.status_code == 200, staged.status_code == 200) == (ok, ok), log_type
        args = argparse.Namespace(where=[f"log_type={log_type}"], hash=None)
        try:
            build_config(servers=["http://gw"], state_dir=str(tmp_path), log_type=log_type,
                         paths=["/var/log/x"])  # fmt: skip
            _filter(args)
            accepted = True
        except BadRequest:
            accepted = False
        assert accepted == ok, log_type
