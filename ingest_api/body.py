"""Reading a request body within the size limit, the time limit and the process's budget.

A client that announces or sends more than ``max_body_bytes`` gets 413 as soon as that is
known; a client that stalls gets 408 after ``request_timeout_s``, so no client holds a
worker's attention forever.  A body that no route reads (its request was answered first) is
bounded by :mod:`ingest_api.request_head`, which closes a connection whose body has not
arrived ``request_timeout_s`` after its head.

The bodies a worker holds while they arrive are bounded together by
``limits.max_body_bytes_in_flight`` (:func:`body_budget`): each piece of a body is counted
before it is kept, until the body has been read or refused.  A piece that does not fit waits
up to :data:`BUDGET_WAIT_S` for other bodies to end, and its request is then answered 503
``too_busy`` with ``Retry-After``, nothing of it written; a body is never kept waiting by its
own bytes alone.  Without it, many connections each holding all but the last bytes of a
64 MiB body made the process hold gigabytes.  Bytes are counted as they arrive, not as
announced: a client announcing a large body and sending little of it does not take the room
of others.

A body is taken as it was sent: one with a ``Content-Encoding`` other than ``identity`` is
refused 415 (a write's chunks carry their own codec; a legacy ``/store`` body would otherwise
be kept compressed as the log line).
"""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request

from ingest_api.errors import RETRY_AFTER_S, ApiError
from ingest_api.settings import Limits

BUDGET_WAIT_S = 1.0
"""How long a body that does not fit the budget waits for room before it is refused 503."""

_held = 0
"""Bytes of the bodies this process is reading (counted by :func:`read_body`)."""
_room: set[asyncio.Future[None]] = set()
"""Bodies waiting for room, woken each time some is given back."""


def body_budget(limits: Limits) -> int:
    """The bytes of bodies one process may hold while they arrive: ``max_body_bytes_in_flight``,
    or 4 x ``max_body_bytes`` when that is 0."""
    return limits.max_body_bytes_in_flight or 4 * limits.max_body_bytes


def announces_body(request: Request) -> bool:
    """Whether the request has a body at all, if an empty one: ``Content-Length`` or
    ``Transfer-Encoding``.  Without either its body is empty (RFC 9112, 6.3), also when an
    HTTP/1.0 client meant it to run until the connection closes: the server reads none of it."""
    headers = request.headers
    return "content-length" in headers or "transfer-encoding" in headers


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "body_too_large", f"the request body is over the limit of {limit} bytes")


def _check_coding(request: Request) -> None:
    codings = [
        coding.strip().lower()
        for value in request.headers.getlist("content-encoding")
        for coding in value.split(",")
        if coding.strip()
    ]
    unknown = [coding for coding in codings if coding != "identity"]
    if unknown:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Encoding: {', '.join(unknown)} is not supported: send the body as it is "
            "(a write's chunks are compressed by their own codec)",
            headers={"Accept-Encoding": "identity"},
        )


async def _take(size: int, own: int, budget: int) -> None:
    """Count ``size`` more bytes of a body holding ``own`` already, waiting up to
    :data:`BUDGET_WAIT_S` for room; else 503."""
    global _held
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BUDGET_WAIT_S
    # a body over the whole budget may still be read while it is the only one
    while _held > own and _held + size > budget:
        left = deadline - loop.time()
        if left <= 0:
            raise ApiError(
                503,
                "too_busy",
                f"this gateway process is receiving {budget} bytes of request bodies, all it "
                "may at once (limits.max_body_bytes_in_flight); nothing was written, retry later",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        room = loop.create_future()
        _room.add(room)
        try:
            await asyncio.wait((room,), timeout=left)
        finally:
            _room.discard(room)
    _held += size


def _give_back(size: int) -> None:
    global _held
    _held -= size
    for room in _room:
        if not room.done():
            room.set_result(None)
    _room.clear()


async def read_body(request: Request, limits: Limits, *, max_bytes: int | None = None) -> bytes:
    """The whole body, or :class:`ApiError` 413 (too large), 408 (too slow), 400 (cut off),
    415 (content-coded), 503 (the process holds all the bodies it may)."""
    pieces = await read_body_pieces(request, limits, max_bytes=max_bytes)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


async def read_body_pieces(
    request: Request, limits: Limits, *, max_bytes: int | None = None
) -> list[bytes]:
    """:func:`read_body`, but the body as the pieces it arrived in (none if it is empty), for
    a reader that takes them one after the other: joining them copied every byte once more
    (``framing.parse_binary`` keeps each chunk a view into its piece)."""
    limit = limits.max_body_bytes if max_bytes is None else max_bytes
    _check_coding(request)
    announced = request.headers.get("content-length")
    if announced is not None:
        if not (announced.isascii() and announced.isdigit()):  # '²'.isdigit(), int() refuses
            raise ApiError(400, "bad_request", "Content-Length is not a number")
        if int(announced) > limit:
            raise _too_large(limit)
    budget = body_budget(limits)
    pieces: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.request_timeout_s):
            async for piece in request.stream():
                if not piece:  # the stream ends with an empty one
                    continue
                if size + len(piece) > limit:
                    raise _too_large(limit)
                await _take(len(piece), size, budget)
                size += len(piece)
                pieces.append(piece)
    except TimeoutError:
        raise ApiError(
            408,
            "request_timeout",
            f"the body did not arrive within {limits.request_timeout_s:g} s",
        ) from None
    except ClientDisconnect:
        raise ApiError(400, "client_disconnected", "the body was cut off") from None
    finally:
        if size:
            _give_back(size)
    return pieces
