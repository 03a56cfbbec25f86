"""A request's head (request line and headers) within a size limit and a time limit.

uvicorn's httptools protocol buffers a head of any size and waits for it forever: a client
holding no token could make a worker hold gigabytes of header bytes, or open connections
that never send a byte until the process runs out of file descriptors.  The gateway runs
uvicorn with :class:`BoundedHeadProtocol` instead: a head over :data:`MAX_HEAD_BYTES` is
answered 431 and one that has not arrived ``head_timeout_s`` after the connection was made
(or after its first byte, on a kept-alive connection) is answered 408, and what the HTTP
parser cannot parse (a ``Content-Length`` beside chunked encoding, a negative one) 400, each
with the usual ``{"error", "reason"}`` and the connection closed.  Bodies keep their own limits
(:mod:`ingest_api.body`).

With ``limits.max_connections_per_client`` set, a worker holds at most that many connections
from one peer address at once: one more is answered 429 ``too_many_connections`` and closed
before anything of it is read, so one client cannot take every file descriptor of the
process.  It is off (0) by default: behind a balancer or a NAT every client has the same
address.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections import Counter
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024
"""Request line and headers together; nginx's default allows 4 x 8 KiB."""

_ERRORS = {
    400: (b"Bad Request", "bad_http"),
    408: (b"Request Timeout", "request_timeout"),
    429: (b"Too Many Requests", "too_many_connections"),
    431: (b"Request Header Fields Too Large", "headers_too_large"),
}

_open_connections: Counter[str] = Counter()
"""This process's open connections by peer address (only with a per-client limit)."""


def bounded_head_protocol(
    head_timeout_s: float, max_connections_per_client: int = 0
) -> functools.partial[BoundedHeadProtocol]:
    """uvicorn's ``http`` setting: the protocol with these limits (picklable, for workers)."""
    return functools.partial(
        BoundedHeadProtocol,
        head_timeout_s=head_timeout_s,
        max_connections_per_client=max_connections_per_client,
    )


class BoundedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing a head that is too large or too slow."""

    def __init__(
        self,
        *args: Any,
        head_timeout_s: float,
        max_head_bytes: int = MAX_HEAD_BYTES,
        max_connections_per_client: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._head_timeout_s = head_timeout_s
        self._max_head_bytes = max_head_bytes
        self._max_per_client = max_connections_per_client
        self._peer: str | None = None
        """The address this connection is counted under, while it is."""
        self._head_bytes: int | None = 0
        """Bytes of the head being received; None while a body or nothing is due."""
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        if self._max_per_client > 0:
            peer = transport.get_extra_info("peername")
            address = peer[0] if isinstance(peer, tuple) and peer else None
            if address is not None:
                if _open_connections[address] >= self._max_per_client:
                    self._refuse(
                        429,
                        f"{address} holds {self._max_per_client} connections to this gateway "
                        "already (limits.max_connections_per_client); reuse one",
                    )
                    return
                _open_connections[address] += 1
                self._peer = address
        self._head_timer = self.loop.call_later(self._head_timeout_s, self._head_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        if self._peer is not None:
            _open_connections[self._peer] -= 1
            if _open_connections[self._peer] <= 0:
                del _open_connections[self._peer]
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._head_bytes is None:
            super().data_received(data)
            return
        room = self._max_head_bytes - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            super().data_received(data)
            return
        # The head must end within what fits; what follows it is a body (or the next request).
        super().data_received(data[:room])
        if self._head_bytes is not None and not self._refused:
            self._refuse(
                431, f"the request's head is over the limit of {self._max_head_bytes} bytes"
            )
            return
        self.data_received(data[room:])

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a later request of a kept-alive connection
            self._head_timer = self.loop.call_later(self._head_timeout_s, self._head_too_slow)

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._stop_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_bytes = 0

    def send_400_response(self, msg: str) -> None:
        """What the HTTP parser cannot parse (e.g. Content-Length with chunked encoding)."""
        self._refuse(400, "the request is not valid HTTP/1.1")

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._head_bytes is not None and not self._refused:
            self._refuse(
                408, f"the request's head did not arrive within {self._head_timeout_s:g} s"
            )

    def _refuse(self, status: int, reason: str) -> None:
        self._refused = True
        self._stop_head_timer()
        phrase, error = _ERRORS[status]
        body = json.dumps({"error": error, "reason": reason}).encode()
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, phrase, len(body))
        )
        if not self.transport.is_closing():
            self.transport.write(head + body)
            self.transport.close()
