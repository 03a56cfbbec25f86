"""A body is taken only as it was sent: a ``Content-Encoding`` other than ``identity`` is
refused 415 (the legacy ``/store`` kept a gzip upload as its log line, silently), and a
``Transfer-Encoding`` other than ``chunked`` (which httptools would have taken as identity
once de-chunked) is refused before any route runs; nothing is written."""

from __future__ import annotations

import gzip
import socket
from typing import Any

import httpx
import orjson
import pytest

from ingest_api.framing import NDJSON_MEDIA_TYPE
from tests.gateway.conftest import end_offsets

LINES = b'{"log_type": "app", "source_id": "coded", "seqno": 1, "data": "x\\n"}\n'


@pytest.mark.parametrize("coding", ["gzip", "identity, gzip", "br"])
@pytest.mark.parametrize("path", ["/v1/write", "/store?log_type=app&file=ce.log"])
def test_a_content_coded_body_is_415_and_nothing_is_written(
    shared_gateway: Any, path: str, coding: str
) -> None:
    before = end_offsets(shared_gateway.data_dir)
    response = httpx.post(
        shared_gateway.url + path,
        content=gzip.compress(LINES),
        headers={"content-type": NDJSON_MEDIA_TYPE, "content-encoding": coding},
    )
    assert response.status_code == 415, response.text
    assert response.json()["error"] == "unsupported_media_type"
    assert "Content-Encoding" in response.json()["reason"]
    assert response.headers["accept-encoding"] == "identity"
    assert "store_id" not in response.json()
    assert end_offsets(shared_gateway.data_dir) == before


def test_an_identity_content_encoding_is_taken(shared_gateway: Any) -> None:
    response = httpx.post(
        shared_gateway.url + "/v1/write",
        content=LINES,
        headers={"content-type": NDJSON_MEDIA_TYPE, "content-encoding": "identity"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["acks"][0]["status"] in ("written", "duplicate")


def _exchange(port: int, request: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize("path", [b"/v1/write", b"/store?log_type=app&file=te.log"])
@pytest.mark.parametrize("coding", [b"gzip, chunked", b"x-custom,chunked"])
def test_a_transfer_coding_other_than_chunked_is_501_and_nothing_is_written(
    shared_gateway: Any, path: bytes, coding: bytes
) -> None:
    before = end_offsets(shared_gateway.data_dir)
    body = gzip.compress(LINES)
    status, answer = _exchange(
        shared_gateway.port,
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nTransfer-Encoding: %s\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n" % (path, NDJSON_MEDIA_TYPE.encode(), coding, len(body), body),
    )
    assert status == 501, answer
    assert orjson.loads(answer)["error"] == "unsupported_transfer_encoding"
    assert b"Transfer-Encoding" in answer
    assert end_offsets(shared_gateway.data_dir) == before


def test_a_transfer_coding_without_chunked_last_is_400(shared_gateway: Any) -> None:
    before = end_offsets(shared_gateway.data_dir)
    status, answer = _exchange(
        shared_gateway.port,
        b"POST /v1/write HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nTransfer-Encoding: gzip"
        b"\r\n\r\n%s" % (NDJSON_MEDIA_TYPE.encode(), gzip.compress(LINES)),
    )
    assert status in (400, 501), answer
    assert end_offsets(shared_gateway.data_dir) == before
