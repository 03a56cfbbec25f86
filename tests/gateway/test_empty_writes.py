"""A write of nothing is 400 ``bad_framing``, not 200 with no results: a client that takes a
200 as "stored" would otherwise lose the chunks it meant to send, e.g. an HTTP/1.0 client
whose body, sent without ``Content-Length``, the gateway never reads.  The legacy ``/store``
refuses a request with no body at all, and still stages an explicitly empty one."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import orjson
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, NDJSON_MEDIA_TYPE, encode_binary
from tests.gateway.conftest import end_offsets, meta

LINE = b'{"log_type": "app", "source_id": "h10", "seqno": 1, "data": "x\\n"}\n'


def _exchange(port: int, request: bytes) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of the answer to a raw request (HTTP/1.0: closed after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), orjson.loads(body)


@pytest.mark.parametrize(
    ("media_type", "body"),
    [
        (NDJSON_MEDIA_TYPE, b""),
        (NDJSON_MEDIA_TYPE, b"\n  \n"),
        (BINARY_MEDIA_TYPE, b""),
        (BINARY_MEDIA_TYPE, b"LBW1"),
    ],
    ids=["ndjson-empty", "ndjson-blank-lines", "binary-empty", "binary-magic-only"],
)
def test_a_write_of_no_chunk_is_400_and_writes_nothing(
    shared_gateway: Any, media_type: str, body: bytes
) -> None:
    before = end_offsets(shared_gateway.data_dir)
    response = httpx.post(
        shared_gateway.url + "/v1/write", content=body, headers={"content-type": media_type}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "bad_framing"
    assert "the body holds no chunk" in response.json()["reason"]
    assert end_offsets(shared_gateway.data_dir) == before


def test_an_http_1_0_write_without_content_length_is_400_and_with_it_is_written(
    shared_gateway: Any,
) -> None:
    head = b"POST /v1/write HTTP/1.0\r\nContent-Type: " + NDJSON_MEDIA_TYPE.encode() + b"\r\n"
    before = end_offsets(shared_gateway.data_dir)
    # the body runs until the connection closes: HTTP reads none of it (RFC 9112, 6.3)
    status, answer = _exchange(shared_gateway.port, head + b"\r\n" + LINE)
    assert (status, answer["error"]) == (400, "bad_framing"), answer
    assert "Content-Length" in answer["reason"]
    assert end_offsets(shared_gateway.data_dir) == before
    status, answer = _exchange(
        shared_gateway.port, head + b"Content-Length: %d\r\n\r\n" % len(LINE) + LINE
    )
    assert status == 200, answer
    assert [a["status"] for a in answer["results"][0]["acks"]] == ["written"]


def test_a_section_without_chunks_is_still_answered_with_no_acks(shared_gateway: Any) -> None:
    response = httpx.post(
        shared_gateway.url + "/v1/write",
        content=encode_binary([(meta("no-chunks"), [])]),
        headers={"content-type": BINARY_MEDIA_TYPE},
    )
    assert response.status_code == 200, response.text
    [result] = response.json()["results"]
    assert result["acks"] == [] and result["last_seqno"] == 0


def test_a_legacy_store_without_a_body_is_400_and_an_explicitly_empty_one_is_staged(
    shared_gateway: Any,
) -> None:
    status, answer = _exchange(
        shared_gateway.port, b"POST /store?log_type=legacy HTTP/1.0\r\n\r\nthe data\n"
    )
    assert (status, answer["error"]) == (400, "bad_request"), answer
    assert "no body" in answer["reason"]
    status, answer = _exchange(
        shared_gateway.port,
        b"POST /store?log_type=legacy HTTP/1.0\r\nContent-Length: 9\r\n\r\nthe data\n",
    )
    assert status == 200 and len(answer["store_id"]) == 32, answer
    response = httpx.post(shared_gateway.url + "/store?log_type=legacy", content=b"")
    assert response.status_code == 200, response.text  # Content-Length: 0, as sent
