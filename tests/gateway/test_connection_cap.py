"""Idle connections cannot take the gateway's file descriptors, in the default configuration:
one address holds at most ``max_connections_per_client`` (256), the process at most what its
descriptor limit leaves after a reserve, and what is refused is answered and closed at once."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from ingest_api.request_head import connection_cap
from tests.conftest import GatewayProcess
from tests.gateway.conftest import meta

DESCRIPTORS = 1024
"""The gateway's ``ulimit -n``: 512 connections after the default reserve."""


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(
        tmp_path / "data", [], tmp_path / "gw.log", max_open_files=DESCRIPTORS
    ).start()
    try:
        yield gw
    finally:
        gw.kill()


def _open_idle(port: int, count: int, source: str) -> list[socket.socket]:
    """``count`` connections from ``source`` that send nothing."""
    held = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        held.append(sock)
    return held


def _refusals(socks: list[socket.socket], quiet_s: float = 1.5) -> dict[int, int]:
    """Status -> count of the connections answered (and closed) until ``quiet_s`` pass with
    no answer; the others are still held open by the gateway, unanswered."""
    statuses: dict[int, int] = {}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        while ready := selector.select(quiet_s):
            for key, _events in ready:
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                selector.unregister(sock)
                answer = sock.recv(4096)
                assert b'"too_many_connections"' in answer, answer[:200]
                status = int(answer.split(b" ", 2)[1])
                statuses[status] = statuses.get(status, 0) + 1
    return statuses


def _write_one(http: httpx.Client, source: str) -> bool:
    body = encode_binary([(meta(source, "capped"), [(1, 0, b"line\n")])])
    response = http.post("/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE})
    assert response.status_code == 200, response.text
    return response.json()["results"][0]["acks"][0]["status"] == "written"


def test_the_connection_cap_is_what_the_descriptor_limit_leaves_after_a_reserve() -> None:
    assert connection_cap(0, 256, descriptor_limit=20000) == 20000 - 256 - 8 * 256
    assert connection_cap(0, 256, descriptor_limit=1024) == 512  # at most half is reserved
    assert connection_cap(0, 4, descriptor_limit=160) == 80
    assert connection_cap(100, 256, descriptor_limit=20000) == 100
    assert connection_cap(50000, 256, descriptor_limit=20000) == 20000 - 256 - 8 * 256


def test_idle_connections_of_one_address_leave_the_gateway_serving_others(
    gateway: GatewayProcess,
) -> None:
    # More idle connections than the process has descriptors, from one address.
    flood = _open_idle(gateway.port, DESCRIPTORS + 100, "127.0.0.1")
    try:
        refused = _refusals(flood)
        assert refused == {429: DESCRIPTORS + 100 - 256}
        with httpx.Client(
            base_url=gateway.url,
            timeout=5,
            transport=httpx.HTTPTransport(local_address="127.0.0.2"),
        ) as other:
            assert other.get("/healthz").status_code == 200
            assert _write_one(other, "after-the-flood")
    finally:
        for sock in flood:
            sock.close()
    assert "Too many open files" not in gateway.log()


def test_idle_connections_of_many_addresses_stop_at_the_cap_and_keep_what_is_open(
    gateway: GatewayProcess,
) -> None:
    cap = connection_cap(0, 256, descriptor_limit=DESCRIPTORS)
    kept = httpx.Client(base_url=gateway.url, timeout=5)  # a client connected before
    assert kept.get("/healthz").status_code == 200
    flood: list[socket.socket] = []
    try:
        for i in range(2, 7):  # 5 x 250 from 5 addresses: more than the descriptors
            flood += _open_idle(gateway.port, 250, f"127.0.0.{i}")
        refused = _refusals(flood)
        assert refused == {503: 5 * 250 - (cap - 1)}
        # the connection open before keeps working, and the store has descriptors to write
        assert kept.get("/healthz").status_code == 200
        assert _write_one(kept, "during-the-flood")
    finally:
        for sock in flood:
            sock.close()
    deadline = time.monotonic() + 5
    while True:  # the closed connections free their places
        try:
            with httpx.Client(base_url=gateway.url, timeout=5) as fresh:
                assert fresh.get("/healthz").status_code == 200
            break
        except (httpx.TransportError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    kept.close()
    assert "Too many open files" not in gateway.log()
