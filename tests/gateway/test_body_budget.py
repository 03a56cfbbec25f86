"""What a client can make a worker hold is bounded in all, not only per request: the bodies a
worker is receiving count against ``limits.max_body_bytes_in_flight`` together (a body that
does not fit waits a second for room, then is answered 503 ``too_busy`` with ``Retry-After``,
nothing written), and an answer its client does not take is dropped with its connection
``request_timeout_s`` after the transport stopped taking it."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, NDJSON_MEDIA_TYPE, encode_binary
from tests.gateway.conftest import end_offsets, meta

MIB = 1024 * 1024
TIMEOUT_S = 2.0
TOKENS = """
[tokens.writer-token]
write = ["app"]
read = ["dc1.app"]
"""


def _start(start_gateway: Any, tmp_path: Path, limits: str) -> Any:
    config = tmp_path / "gateway.toml"
    config.write_text(f"[limits]\nrequest_timeout_s = {TIMEOUT_S}\n{limits}\n{TOKENS}")
    return start_gateway(tmp_path / "data", "--config", str(config))


def _ndjson(source: str, seqno: int, size: int) -> bytes:
    line = orjson.dumps({"log_type": "app", "source_id": source, "seqno": seqno, "data": ""})
    data = "x" * (size - len(line) - 1)
    return orjson.dumps({"log_type": "app", "source_id": source, "seqno": seqno, "data": data})


def _head(length: int) -> bytes:
    return (
        b"POST /v1/write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer-token\r\n"
        b"Content-Type: " + NDJSON_MEDIA_TYPE.encode() + b"\r\nContent-Length: %d\r\n\r\n" % length
    )


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(lines[0].split(" ", 2)[1]), headers, body


def _held_bodies(port: int, count: int, size: int) -> list[tuple[socket.socket, bytes]]:
    """Connections each sending a write of ``size`` bytes but its last 10."""
    held = []
    for i in range(count):
        body = _ndjson(f"held-{i}", 1, size)
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(_head(len(body)) + body[:-10])
        held.append((sock, body[-10:]))
    time.sleep(0.3)  # the gateway has begun reading them
    return held


def test_a_body_over_the_process_budget_waits_then_is_503_and_writes_nothing(
    start_gateway: Any, tmp_path: Path
) -> None:
    gw = _start(
        start_gateway, tmp_path, f"max_body_bytes = {MIB}\nmax_body_bytes_in_flight = {2 * MIB}"
    )
    held = _held_bodies(gw.port, 2, MIB)
    try:
        before = end_offsets(gw.data_dir)
        small = _ndjson("small", 1, 200)
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(_head(len(small)) + small)
            status, headers, body = _answer(sock)
        assert status == 503, body
        assert orjson.loads(body)["error"] == "too_busy"
        assert "max_body_bytes_in_flight" in orjson.loads(body)["reason"]
        assert headers["retry-after"] == "1"
        assert 0.9 < time.monotonic() - started < TIMEOUT_S
        assert end_offsets(gw.data_dir) == before
        # one that gets room while it waits is written
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.sendall(_head(len(small)) + small)
            time.sleep(0.3)
            first, rest = held.pop(0)
            first.sendall(rest)
            assert _answer(first)[0] == 200
            first.close()
            status, _, body = _answer(sock)
        assert status == 200, body
        assert orjson.loads(body)["results"][0]["acks"][0]["status"] == "written"
    finally:
        for sock, _ in held:
            sock.close()


def test_bodies_of_honest_load_are_all_taken(start_gateway: Any, tmp_path: Path) -> None:
    """16 concurrent 2 MiB writes (the benchmarks'), 4 of 8 MiB (a push-client's default)."""
    gw = _start(start_gateway, tmp_path, "")
    statuses: list[int] = []

    def post(source: str, size: int) -> None:
        chunks = [(1, 0, b"y" * (size - 200))]
        body = encode_binary([(meta(source), chunks)])
        response = httpx.post(
            gw.url + "/v1/write",
            content=body,
            headers={"content-type": BINARY_MEDIA_TYPE, "authorization": "Bearer writer-token"},
            timeout=30,
        )
        statuses.append(response.status_code)

    threads = [threading.Thread(target=post, args=(f"honest-{i}", 2 * MIB)) for i in range(16)]
    threads += [threading.Thread(target=post, args=(f"big-{i}", 8 * MIB)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 20


def test_an_answer_its_client_does_not_take_is_dropped_in_time(
    start_gateway: Any, tmp_path: Path
) -> None:
    gw = _start(start_gateway, tmp_path, "")
    chunks = [(seqno, 0, bytes([65 + seqno]) * MIB) for seqno in range(1, 13)]
    written = httpx.post(
        gw.url + "/v1/write",
        content=encode_binary([(meta("big-answer"), chunks)]),
        headers={"content-type": BINARY_MEDIA_TYPE, "authorization": "Bearer writer-token"},
    )
    assert written.status_code == 200, written.text
    partition = written.json()["results"][0]["partition"]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    with sock:
        sock.sendall(
            b"GET /v1/topics/dc1.app/partitions/%d/messages?offset=0&max_bytes=%d HTTP/1.1\r\n"
            b"Host: x\r\nAuthorization: Bearer writer-token\r\nAccept: %s\r\n\r\n"
            % (partition, 32 * MIB, BINARY_MEDIA_TYPE.encode())
        )
        time.sleep(TIMEOUT_S + 2)  # taking nothing
        received = 0
        sock.settimeout(5)
        try:
            while piece := sock.recv(1 << 20):
                received += len(piece)
        except ConnectionResetError:
            pass
        except TimeoutError:
            pytest.fail("the connection still holds its answer")
    assert received < 12 * MIB, "the whole answer was kept for the client"
    assert httpx.get(gw.url + "/healthz").status_code == 200


def test_a_budget_below_one_body_is_refused(tmp_path: Path) -> None:
    from ingest_api.settings import ConfigError, GatewaySettings, Limits

    with pytest.raises(ConfigError, match="max_body_bytes_in_flight"):
        GatewaySettings(
            tmp_path, limits=Limits(max_body_bytes=MIB, max_body_bytes_in_flight=MIB - 1)
        )
    assert GatewaySettings(tmp_path, limits=Limits(max_body_bytes_in_flight=0)).limits
