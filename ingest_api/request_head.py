"""A request's head (request line and headers) within a size limit and a time limit.

uvicorn's httptools protocol buffers a head of any size and waits for it forever: a client
holding no token could make a worker hold gigabytes of header bytes, or open connections
that never send a byte until the process runs out of file descriptors.  The gateway runs
uvicorn with :class:`BoundedHeadProtocol` instead: a head over :data:`MAX_HEAD_BYTES` is
answered 431 and one that has not arrived ``head_timeout_s`` after the connection was made
(or after its first byte, on a kept-alive connection) is answered 408, and what the HTTP
parser cannot parse (a ``Content-Length`` beside chunked encoding, a negative one) 400, each
with the usual ``{"error", "reason"}`` and the connection closed.  A body must have arrived
``head_timeout_s`` after its head as well: a route reading it answers 408 by itself
(:mod:`ingest_api.body`), but a route answers many requests without reading their bodies (a
refusal, ``/healthz``), and uvicorn then discards the rest of the body as it comes, with no
timer running, since it cancels its keep-alive timer on every byte received.  So a connection
whose body is still due by then is closed: at once if its request was answered, or as soon as
it is.

Only a head's own bytes count against its limit: what a read brings is fed to the parser one
message at a time (a body of known length by its length, anything else up to its next empty
line, where a head or a chunked body ends), so requests pipelined in one read are all answered.
A body of known length on a kept-alive connection is not fed to the parser at all: its pieces
go to the route as the socket delivered them (httptools copied each), and the request ends at
its last byte, the next one starting on a fresh parser.
A refusal of a request pipelined behind others is sent once they are answered, and nothing
more of the connection is read.  A ``Transfer-Encoding`` other than ``chunked`` is refused 501
(httptools only undoes the chunking: ``gzip, chunked`` would be taken as identity).  An answer
its client does not take is bounded in time too: when the transport stops taking it (its
buffer over the high-water mark) the client has ``head_timeout_s`` to take some, or the
connection is aborted and the answer dropped.

Each connection holds a file descriptor until it is closed, so the number a worker holds is
bounded twice, before anything of a connection is read: one peer address holds at most
``limits.max_connections_per_client`` (256 by default; one more is answered 429
``too_many_connections``), and the process at most :func:`connection_cap` in all (one more
is answered 503 ``too_many_connections``), both with ``Retry-After``.  That cap is what the
descriptor limit (``RLIMIT_NOFILE``) leaves after a reserve for the store's files, Kafka's and
the peers' sockets and the outgoing deliveries, so a flood of idle connections from any number of
addresses is refused before the process runs out of descriptors: the connections already
open, the store and the audit publisher keep theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import resource
from collections import Counter
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ingest_api.errors import RETRY_AFTER_S
from log_store.partition_handles import (
    DESCRIPTORS_PER_PARTITION,
    RESERVED_DESCRIPTORS,
    partitions_that_fit,
)

MAX_HEAD_BYTES = 64 * 1024
"""Request line and headers together; nginx's default allows 4 x 8 KiB."""

_ERRORS = {
    400: (b"Bad Request", "bad_http"),
    408: (b"Request Timeout", "request_timeout"),
    429: (b"Too Many Requests", "too_many_connections"),
    431: (b"Request Header Fields Too Large", "headers_too_large"),
    501: (b"Not Implemented", "unsupported_transfer_encoding"),
    503: (b"Service Unavailable", "too_many_connections"),
}

_open_connections: Counter[str] = Counter()
"""This process's open connections by peer address (only with a per-client limit)."""
_open_total = 0
"""This process's open client connections (only with a cap on them)."""


def connection_cap(
    max_open_connections: int, max_open_partitions: int, descriptor_limit: int | None = None
) -> int:
    """The client connections one process may hold: what its descriptor limit
    (``RLIMIT_NOFILE``, soft) leaves after a reserve for everything else (256, and 8 for each
    partition the embedded store keeps open: ``log_store.partition_handles``), at least half
    of the limit, and at most ``max_open_connections`` when that is set (not 0)."""
    if descriptor_limit is None:
        descriptor_limit, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if descriptor_limit == resource.RLIM_INFINITY:
        descriptor_limit = 1 << 20
    partitions = partitions_that_fit(max_open_partitions, descriptor_limit)
    reserve = RESERVED_DESCRIPTORS + DESCRIPTORS_PER_PARTITION * partitions
    cap = descriptor_limit - min(reserve, descriptor_limit // 2)
    if max_open_connections > 0:
        cap = min(cap, max_open_connections)
    return max(cap, 1)


def bounded_head_protocol(
    head_timeout_s: float, max_connections_per_client: int = 0, max_open_connections: int = 0
) -> functools.partial[BoundedHeadProtocol]:
    """uvicorn's ``http`` setting: the protocol with these limits (picklable, for workers)."""
    return functools.partial(
        BoundedHeadProtocol,
        head_timeout_s=head_timeout_s,
        max_connections_per_client=max_connections_per_client,
        max_open_connections=max_open_connections,
    )


def _parser(protocol: HttpToolsProtocol) -> httptools.HttpRequestParser:
    """A request parser as uvicorn makes one for each connection."""
    parser = httptools.HttpRequestParser(protocol)
    with contextlib.suppress(AttributeError):  # httptools < 0.6.3
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser


class BoundedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing a head that is too large or too slow, and
    closing a connection whose body is too slow."""

    def __init__(
        self,
        *args: Any,
        head_timeout_s: float,
        max_head_bytes: int = MAX_HEAD_BYTES,
        max_connections_per_client: int = 0,
        max_open_connections: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._head_timeout_s = head_timeout_s
        self._max_head_bytes = max_head_bytes
        self._max_per_client = max_connections_per_client
        self._max_total = max_open_connections
        self._peer: str | None = None
        """The address this connection is counted under, while it is."""
        self._counted = False
        """Whether this connection is counted in :data:`_open_total`."""
        self._head_bytes: int | None = 0
        """Bytes of the head being received; None while a body or nothing is due."""
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        """Runs while a request's body is due (from its head to its end)."""
        self._overdue = False
        """A head or body was due past its time while a route was answering: the connection
        ends once the route has answered."""
        self._refused = False
        self._refusal: tuple[int, str] | None = None
        """A refusal to send once the requests before it are answered."""
        self._tail = b""
        """The last bytes fed to the parser (where an empty line may have begun)."""
        self._body_left: int | None = None
        """Bytes of a body of known length still due (None: none, or a chunked one)."""
        self._write_timer: asyncio.TimerHandle | None = None
        """Runs while the client does not take what it is sent (the transport is paused)."""
        self._body_bypass = False
        """The body being received is handed to the route past the parser."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        global _open_total
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
        if self._max_total > 0:
            if _open_total >= self._max_total:
                self._refuse(
                    503,
                    f"this gateway process holds {self._max_total} connections, all it may "
                    "(its file descriptor limit, limits.max_open_connections); retry later",
                )
                return
            _open_total += 1
            self._counted = True
        self._head_timer = self.loop.call_later(self._head_timeout_s, self._head_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        global _open_total
        self._stop_head_timer()
        self._stop_body_timer()
        self._stop_write_timer()
        if self._counted:
            _open_total -= 1
            self._counted = False
        if self._peer is not None:
            _open_connections[self._peer] -= 1
            if _open_connections[self._peer] <= 0:
                del _open_connections[self._peer]
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        # Fed message by message, so that only a head's own bytes count against its limit,
        # not the earlier requests and bodies that came in the same read (pipelining).
        start = 0
        while start < len(data) and not self._refused:
            if self._head_bytes is None and self._body_left is not None:
                end = start + min(self._body_left, len(data) - start)
                self._body_left -= end - start
            else:
                end = self._empty_line_end(data, start)
            if self._head_bytes is not None:
                if self._head_timer is None and self._answered():
                    # A later request of a kept-alive connection: timed from its first byte,
                    # even an empty line before it (the parser skips those, with no
                    # on_message_begin); one sent while a route answers is timed from that
                    # answer (uvicorn's keep-alive) on.
                    self._head_timer = self.loop.call_later(
                        self._head_timeout_s, self._head_too_slow
                    )
                # a head ends at its first empty line, so at ``end`` or later
                if self._head_bytes + end - start > self._max_head_bytes:
                    self._refuse(
                        431, f"the request's head is over the limit of {self._max_head_bytes} bytes"
                    )
                    return
                self._head_bytes += end - start
            # the last two bytes only: joining the tail to all that was fed copied every body
            self._tail = (self._tail + data[max(start, end - 2) : end])[-2:]
            piece = data[start:end] if start or end < len(data) else data
            start = end
            if self._body_bypass:
                self._body_received(piece)
                continue
            super().data_received(piece)
            if self.parser.should_upgrade():  # the rest is another protocol's, as uvicorn has it
                return

    def _body_received(self, piece: bytes) -> None:
        """A piece of a body taken past the parser (see :meth:`on_headers_complete`); the
        request's end once its last byte is in, and a fresh parser for the next request."""
        self.on_body(piece)
        if self._body_left == 0 and not self._refused:
            self._body_bypass = False
            self.on_message_complete()
            self.parser = _parser(self)

    def _empty_line_end(self, data: bytes, start: int) -> int:
        """Where in ``data`` the first empty line from ``start`` on ends (where a head or a
        chunked body ends: the parser takes CRLF line ends only), with the bytes fed before
        it; the end of ``data`` if none does."""
        joint = self._tail + data[start : start + 2]
        at = joint.find(b"\n\r\n")
        if 0 <= at < len(self._tail):  # an empty line begun in what was fed
            return start + at + 3 - len(self._tail)
        at = data.find(b"\n\r\n", start)
        return at + 3 if at >= 0 else len(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a later request of a kept-alive connection
            self._head_timer = self.loop.call_later(self._head_timeout_s, self._head_too_slow)

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._stop_head_timer()
        self._overdue = False  # a head late while a route answered is let in; its body timed
        codings = [
            coding.strip().lower()
            for name, value in self.headers
            if name == b"transfer-encoding"
            for coding in value.split(b",")
            if coding.strip()
        ]
        if codings and codings != [b"chunked"]:
            # httptools only undoes chunked: a body sent as "gzip, chunked" would be taken as
            # it is, compressed
            self._refuse(
                501,
                f"Transfer-Encoding: {b', '.join(codings).decode('latin-1')} is not supported "
                "(only chunked)",
            )
            return
        self._body_left = None if codings else self._content_length()
        super().on_headers_complete()
        if not (self.parser.should_upgrade() and self._should_upgrade()):
            self._body_timer = self.loop.call_later(self._head_timeout_s, self._body_too_slow)
            # A body of known length on a kept-alive connection goes to the route past the
            # parser: httptools would copy every piece of it into a bytes object of its own
            # (the parser only counts a body's bytes, and the message ends at its last one).
            # On a connection that closes after this request the parser stays in, to refuse
            # what follows the body as it does.
            self._body_bypass = bool(self._body_left) and self.cycle.keep_alive

    def on_body(self, body: bytes) -> None:
        """uvicorn's, except that a piece arriving while nothing of the body waits to be taken
        (the usual piece) is kept as it came: uvicorn's ``receive()`` hands it on as it is
        (its ``bytes()`` of a bytes object is that object) instead of copying it into the
        cycle's bytearray and out again, two copies of every body byte."""
        if self._refused:
            return
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        if not cycle.body:
            cycle.body = body  # type: ignore[assignment]  # receive() takes bytes() of it
        else:
            if type(cycle.body) is bytes:  # more arrived before the route took the first
                cycle.body = bytearray(cycle.body)
            cycle.body += body
        if len(cycle.body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._body_left = None
        self._stop_body_timer()
        self._overdue = False
        super().on_message_complete()
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refusal is not None and self._answered():
            status, reason = self._refusal
            self._refusal = None
            self._send_refusal(status, reason)
            return
        if self._overdue and self._answered():
            if self._head_bytes is not None:
                self._refuse(
                    408, f"the request's head did not arrive within {self._head_timeout_s:g} s"
                )
            else:
                self._close_unread()

    def pause_writing(self) -> None:
        """The client does not take its answer as fast as it is sent: it has
        ``request_timeout_s`` to take some (uvicorn would wait for ever, holding the answer)."""
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self._head_timeout_s, self._not_taken)

    def resume_writing(self) -> None:
        self._stop_write_timer()
        super().resume_writing()

    def send_400_response(self, msg: str) -> None:
        """What the HTTP parser cannot parse (e.g. Content-Length with chunked encoding)."""
        self._refuse(400, "the request is not valid HTTP/1.1")

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _stop_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _content_length(self) -> int | None:
        """The body's length as the parser takes it (it refuses one not all digits)."""
        for name, value in self.headers:
            if name == b"content-length":
                try:
                    return int(value)
                except ValueError:
                    return None
        return 0

    def _not_taken(self) -> None:
        """End a connection whose client took nothing of its answer for ``request_timeout_s``:
        what the transport holds of it is dropped with it."""
        self._write_timer = None
        self._refused = True
        self._stop_head_timer()
        self._stop_body_timer()
        self.transport.abort()

    def _answered(self) -> bool:
        """Whether every request of this connection so far has been answered."""
        return self.cycle is None or self.cycle.response_complete

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._head_bytes is None or self._refused:
            return
        if not self._answered():  # a 408 now would cut into the answer being sent
            self._overdue = True
            return
        self._refuse(408, f"the request's head did not arrive within {self._head_timeout_s:g} s")

    def _body_too_slow(self) -> None:
        self._body_timer = None
        if self._head_bytes is not None or self._refused:
            return
        if self._answered():
            self._close_unread()
        else:  # a route reading the body answers 408 itself; one that is not, when it is done
            self._overdue = True

    def _close_unread(self) -> None:
        """End a connection whose request was answered without its body having arrived."""
        self._refused = True
        self._stop_head_timer()
        self._stop_body_timer()
        if not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int, reason: str) -> None:
        """Answer ``status`` and close; a request refused before its body, pipelined behind
        others, once those are answered (they may have written): nothing more is read."""
        self._refused = True
        self._stop_head_timer()
        self._stop_body_timer()
        if self._answered() or (self.cycle is not None and self.cycle.more_body):
            # (a body cut by what the parser cannot read: its route would wait for the rest)
            self._send_refusal(status, reason)
        else:
            self._refusal = (status, reason)

    def _send_refusal(self, status: int, reason: str) -> None:
        phrase, error = _ERRORS[status]
        body = json.dumps({"error": error, "reason": reason}).encode()
        retry = b"retry-after: %d\r\n" % RETRY_AFTER_S if error == "too_many_connections" else b""
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"%sconnection: close\r\n\r\n" % (status, phrase, len(body), retry)
        )
        if not self.transport.is_closing():
            self.transport.write(head + body)
            self.transport.close()
