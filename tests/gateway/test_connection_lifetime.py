"""Every connection ends within ``request_timeout_s`` of what it owes: a request answered
before its body arrived (a refusal, ``/healthz``) does not keep its connection open by
sending a byte of that body now and then, an empty line does not keep a kept-alive one open,
and a refused connection says when to come back.  An upload that arrives in time is read
whole, however slowly, and its connection stays open for the next request."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from tests.gateway.conftest import meta

TIMEOUT_S = 2.0
"""The gateway's ``request_timeout_s``."""

CONFIG = f"""
[limits]
request_timeout_s = {TIMEOUT_S}
max_connections_per_client = 2

[tokens.writer-token]
write = ["app"]
read = ["dc1.app"]
"""

HUGE_BODY = b"Content-Length: 1000000000\r\n"


@pytest.fixture
def gw(start_gateway: Any, tmp_path: Path) -> Any:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    return start_gateway(tmp_path / "data", "--config", str(config))


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.settimeout(10)
    return sock


def _answer(sock: socket.socket) -> bytes:
    """One answer (head and body, by its Content-Length); b"" if the connection closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            return data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _closed_within(sock: socket.socket, seconds: float, trickle: bytes) -> float | None:
    """Seconds until the gateway closed the connection while ``trickle`` was sent every
    0.2 s; None if it was still open after ``seconds``."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < seconds:
        try:
            sock.sendall(trickle)
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - started
    return None


@pytest.mark.parametrize(
    "head",
    [
        b"POST /v1/write HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
    ],
    ids=["refused-without-token", "healthz"],
)
def test_a_request_answered_before_its_body_arrived_is_closed_in_time(gw: Any, head: bytes) -> None:
    with _connect(gw.port) as sock:
        sock.sendall(head + HUGE_BODY + b"\r\n")
        started = time.monotonic()
        answer = _answer(sock)
        assert answer.startswith((b"HTTP/1.1 401", b"HTTP/1.1 200")), answer[:200]
        # a byte of the body now and then: uvicorn's keep-alive timer never runs
        closed = _closed_within(sock, 3 * TIMEOUT_S, trickle=b"x")
        assert closed is not None, "the connection is still open"
        assert time.monotonic() - started < TIMEOUT_S + 1.5


def test_connections_whose_bodies_never_end_give_their_places_back(gw: Any) -> None:
    source = "127.0.0.2"  # max_connections_per_client = 2
    held = [_connect(gw.port, source) for _ in range(2)]
    try:
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + HUGE_BODY + b"\r\n")
            assert _answer(sock).startswith(b"HTTP/1.1 200")
            sock.sendall(b"x")
        with _connect(gw.port, source) as one_more:
            answer = _answer(one_more)
        assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
        assert b'"too_many_connections"' in answer
        assert b"\r\nretry-after: 1\r\n" in answer.lower()
        time.sleep(TIMEOUT_S + 0.5)
        with _connect(gw.port, source) as later:
            later.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = _answer(later)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    finally:
        for sock in held:
            sock.close()


def test_a_process_full_of_connections_says_when_to_retry(
    start_gateway: Any, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("[limits]\nmax_open_connections = 2\n")
    gw = start_gateway(tmp_path / "data", "--config", str(config))
    held = [_connect(gw.port) for _ in range(2)]
    try:
        with _connect(gw.port) as one_more:
            answer = _answer(one_more)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b'"too_many_connections"' in answer
        assert b"\r\nretry-after: 1\r\n" in answer.lower()
    finally:
        for sock in held:
            sock.close()


def test_empty_lines_do_not_keep_a_kept_alive_connection_open(gw: Any) -> None:
    with _connect(gw.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _answer(sock).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        sock.sendall(b"\r\n")
        sock.settimeout(3 * TIMEOUT_S)
        answer = _answer(sock)  # the parser skips empty lines: still a head due
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert time.monotonic() - started < TIMEOUT_S + 1.5
        # (the bytes after it keep coming: uvicorn's keep-alive timer never runs)
        assert _closed_within(sock, 1.0, trickle=b"\r\n") is not None


def test_a_route_answering_after_the_body_was_due_closes_the_connection_then(gw: Any) -> None:
    with _connect(gw.port) as sock:
        body = encode_binary([(meta("poll"), [(1, 0, b"line\n")])])
        sock.sendall(
            b"POST /v1/write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer-token\r\n"
            b"Content-Type: " + BINARY_MEDIA_TYPE.encode() + b"\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        written = orjson.loads(_answer(sock).partition(b"\r\n\r\n")[2])["results"][0]
        partition, end = written["partition"], written["acks"][0]["offset"] + 1
        # a long poll past the body's time: answered when it ends, then closed
        wait_ms = int(TIMEOUT_S * 1000 + 1000)
        sock.sendall(
            b"GET /v1/topics/dc1.app/partitions/%d/messages?offset=%d&wait_ms=%d HTTP/1.1\r\n"
            b"Host: x\r\nAuthorization: Bearer writer-token\r\n"
            % (partition, end, wait_ms)
            + HUGE_BODY
            + b"\r\n"
        )
        started = time.monotonic()
        sock.settimeout(3 * TIMEOUT_S)
        answer = _answer(sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert time.monotonic() - started > TIMEOUT_S
        assert _closed_within(sock, 1.0, trickle=b"x") is not None


def test_a_slow_but_steady_upload_is_written_and_keeps_its_connection(gw: Any) -> None:
    body = encode_binary([(meta("steady"), [(1, 0, b"x" * 60_000)])])
    pieces = 6
    step = len(body) // pieces + 1
    with _connect(gw.port) as sock:
        sock.sendall(
            b"POST /v1/write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer-token\r\n"
            b"Content-Type: " + BINARY_MEDIA_TYPE.encode() + b"\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        started = time.monotonic()
        for i in range(0, len(body), step):  # over about half of request_timeout_s
            time.sleep(TIMEOUT_S / 2 / pieces)
            sock.sendall(body[i : i + step])
        answer = _answer(sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert b'"written"' in answer
        assert time.monotonic() - started > TIMEOUT_S / 2
        # past the body's time now: the connection serves the next request
        time.sleep(TIMEOUT_S / 2 + 0.3)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _answer(sock).startswith(b"HTTP/1.1 200")


def test_a_refused_upload_sent_whole_in_time_keeps_its_connection(gw: Any) -> None:
    body = b'{"log_type": "app", "source_id": "s", "seqno": 1, "data": "x\\n"}\n' * 100
    with _connect(gw.port) as sock:
        sock.sendall(
            b"POST /v1/write HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body[:100]
        )
        assert _answer(sock).startswith(b"HTTP/1.1 401")  # no token: refused before the body
        time.sleep(TIMEOUT_S / 4)
        sock.sendall(body[100:])
        time.sleep(TIMEOUT_S)  # past the body's time, but the body is whole
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _answer(sock).startswith(b"HTTP/1.1 200")
