"""Pipelined requests are answered however many arrive in one read: only each request's own
head counts against the 64 KiB limit, not the requests and bodies before it; one head over
the limit is still answered 431 at once."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson
import pytest

CONFIG = """
[tokens.writer-token]
write = ["app"]
read = ["dc1.app"]
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.conftest import GatewayProcess

    root = tmp_path_factory.mktemp("pipelining")
    config = root / "gateway.toml"
    config.write_text(CONFIG)
    gateway = GatewayProcess(root / "data", ["--config", str(config)], root / "gateway.log")
    gateway.start()
    yield gateway
    gateway.kill()


class _Answers:
    """The answers of one connection, in order (each by its Content-Length)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> bool:
        piece = self.sock.recv(1 << 20)
        self.buffer += piece
        return bool(piece)

    def next(self) -> tuple[int, bytes]:
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                raise AssertionError(f"closed after {self.buffer[:300]!r}")
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(rest) < length:
            if not self._fill():
                raise AssertionError(f"closed in an answer: {head!r}")
            rest = self.buffer.partition(b"\r\n\r\n")[2]
        self.buffer = rest[length:]
        return int(head.split(b" ", 2)[1]), rest[:length]


def _write(source: str, seqno: int, chunked: bool = False) -> bytes:
    body = orjson.dumps(
        {"log_type": "app", "source_id": source, "seqno": seqno, "data": f"line {seqno}\n"}
    )
    body += b"\n"
    head = (
        b"POST /v1/write HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer writer-token\r\n"
        b"Content-Type: application/x-ndjson\r\n"
    )
    if chunked:  # in two chunks, the first ending with an empty line of the body's own
        return (
            head
            + b"Transfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n" % (len(body) - 1, body[:-1])
            + b"1\r\n\n\r\n0\r\n\r\n"
        )
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_400_pipelined_writes_in_one_send_are_all_written_in_order(gw: Any, chunked: bool) -> None:
    source = f"pipelined-{chunked}"
    requests = b"".join(_write(source, seqno, chunked) for seqno in range(1, 401))
    assert len(requests) > 80_000  # more than a head may be, in one read or a few
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(requests)
        answers = _Answers(sock)
        for seqno in range(1, 401):
            status, body = answers.next()
            assert status == 200, (seqno, body)
            ack = orjson.loads(body)["results"][0]["acks"][0]
            assert (ack["seqno"], ack["status"]) == (seqno, "written"), ack


def test_2000_pipelined_healthz_are_all_answered(gw: Any) -> None:
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n" * 2000)
        answers = _Answers(sock)
        assert [answers.next()[0] for _ in range(2000)] == [200] * 2000


@pytest.mark.parametrize("after", [b"", b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n" * 10])
def test_one_head_over_64_kib_is_431_at_once(gw: Any, after: bytes) -> None:
    big = b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(after + big)
        answers = _Answers(sock)
        for _ in range(after.count(b"GET")):
            assert answers.next()[0] == 200
        status, body = answers.next()
    assert status == 431, body
    assert orjson.loads(body)["error"] == "headers_too_large"


def test_a_head_of_just_under_64_kib_after_pipelined_requests_is_answered(
    gw: Any, tmp_path: Path
) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: "
    big = head + b"a" * (64 * 1024 - len(head) - 4) + b"\r\n\r\n"
    assert len(big) == 64 * 1024
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(_write("just-under", 1) * 3 + big)
        answers = _Answers(sock)
        assert [answers.next()[0] for _ in range(4)] == [200] * 4


def test_a_body_the_parser_cannot_read_is_400_at_once(gw: Any) -> None:
    head = _write("bad-chunk", 1, chunked=True).partition(b"\r\n\r\n")[0]
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(head + b'\r\n\r\n5\r\n{"log\r\nzz\r\n')  # not a chunk size
        status, body = _Answers(sock).next()
    assert status == 400, body
    assert orjson.loads(body)["error"] == "bad_http"
