"""A request body reaches the route without being copied on its way through the gateway's HTTP
protocol: the piece the transport hands over is what the route receives (copying 2 MiB bodies
twice more, into uvicorn's bytearray and out of it, and once for the head's tail check, cost
the gateway a fifth of the CPU it spends receiving them; httptools' copy of each piece, a
tenth of what was left)."""

from __future__ import annotations

import asyncio
import itertools
import tracemalloc
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from ingest_api.request_head import BoundedHeadProtocol

BODY_BYTES = 8 * 1024 * 1024


class _Transport(asyncio.Transport):
    """What the protocol writes, and whether it paused reading."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default
        )

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        """Flow control of a socket this stand-in transport does not have."""

    def resume_reading(self) -> None:
        """Flow control of a socket this stand-in transport does not have."""


async def _received(pieces: list[bytes], *, route_between: bool) -> tuple[int, list[bytes]]:
    """Feed ``pieces`` (a request, cut anywhere) to the protocol, letting the route run after
    each (``route_between``) or only after all; the peak of the memory allocated meanwhile,
    and the body pieces the route received."""
    received: list[bytes] = []
    done = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            received.append(message["body"])
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
        done.set()

    config = Config(app=app, lifespan="off", log_level="warning")
    config.load()
    protocol = BoundedHeadProtocol(
        config=config, server_state=ServerState(), app_state={}, head_timeout_s=30.0
    )
    transport = _Transport()
    protocol.connection_made(transport)
    tracemalloc.start()
    try:
        for piece in pieces:
            protocol.data_received(piece)
            if route_between:
                await asyncio.sleep(0)  # the route takes what arrived
        await asyncio.wait_for(done.wait(), 10)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        protocol.connection_lost(None)
    assert transport.written.startswith(b"HTTP/1.1 200 OK")
    return peak, received


def _request(body: bytes) -> bytes:
    return b"POST /v1/write HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def test_a_body_piece_reaches_the_route_without_being_copied() -> None:
    body = bytes(range(256)) * (BODY_BYTES // 256)
    request = _request(body)
    head = len(request) - len(body)
    peak, received = asyncio.run(_received([request[:head], body], route_between=True))
    assert b"".join(received) == body
    # the piece itself, not a copy (before: httptools' copy of it; before that also the tail
    # check's join, the cycle's bytearray and its bytes(): 3x the body at the peak)
    assert any(piece is body for piece in received)
    assert peak < 0.25 * BODY_BYTES, peak


def test_requests_after_a_body_in_the_same_pieces_are_answered() -> None:
    """The parser is left out of a body of known length: the request ends at its last byte,
    and what follows in the same piece is the next request, on a fresh parser."""
    bodies = [b"%07d\n" % i * (1000 + i) for i in range(3)]
    stream = b"".join(_request(body) for body in bodies)
    cuts = [0, 7, 60, 5000, 20_000, 20_070, 40_000, len(stream)]
    pieces = [stream[start:end] for start, end in itertools.pairwise(cuts)]
    answers, received = asyncio.run(_answered(pieces, len(bodies)))
    assert answers == len(bodies)
    assert received == bodies


async def _answered(pieces: list[bytes], requests: int) -> tuple[int, list[bytes]]:
    """Feed ``pieces`` (requests, cut anywhere) to the protocol; the answers written and each
    request's body as its route received it."""
    bodies: list[bytes] = []
    done = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        parts = []
        while True:
            message = await receive()
            parts.append(message["body"])
            if not message["more_body"]:
                break
        bodies.append(b"".join(parts))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
        if len(bodies) == requests:
            done.set()

    config = Config(app=app, lifespan="off", log_level="warning")
    config.load()
    protocol = BoundedHeadProtocol(
        config=config, server_state=ServerState(), app_state={}, head_timeout_s=30.0
    )
    transport = _Transport()
    protocol.connection_made(transport)
    try:
        for piece in pieces:
            protocol.data_received(piece)
            await asyncio.sleep(0)
        await asyncio.wait_for(done.wait(), 10)
    finally:
        protocol.connection_lost(None)
    return transport.written.count(b"HTTP/1.1 200 OK"), bodies


def test_pieces_arriving_before_the_route_takes_them_are_all_received_in_order() -> None:
    body = b"".join(b"%07d\n" % i for i in range(100_000))
    request = _request(body)
    head = len(request) - len(body)
    cuts = [0, 10, head - 1, head + 3, head + 5000, 300_000, 500_000, len(request)]
    # all fed before the route runs: the first piece kept as it came, the others joined to it
    pieces = [request[start:end] for start, end in itertools.pairwise(cuts)]
    _peak, received = asyncio.run(_received(pieces, route_between=False))
    assert b"".join(received) == body
