"""Reading a request body within the size limit and the time limit.

A client that announces or sends more than ``max_body_bytes`` gets 413 as soon as that is
known; a client that stalls gets 408 after ``request_timeout_s``, so no client holds a
worker's attention forever.  A body that no route reads (its request was answered first) is
bounded by :mod:`ingest_api.request_head`, which closes a connection whose body has not
arrived ``request_timeout_s`` after its head.
"""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request

from ingest_api.errors import ApiError
from ingest_api.settings import Limits


def announces_body(request: Request) -> bool:
    """Whether the request has a body at all, if an empty one: ``Content-Length`` or
    ``Transfer-Encoding``.  Without either its body is empty (RFC 9112, 6.3), also when an
    HTTP/1.0 client meant it to run until the connection closes: the server reads none of it."""
    headers = request.headers
    return "content-length" in headers or "transfer-encoding" in headers


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "body_too_large", f"the request body is over the limit of {limit} bytes")


async def read_body(request: Request, limits: Limits, *, max_bytes: int | None = None) -> bytes:
    """The whole body, or :class:`ApiError` 413 (too large), 408 (too slow), 400 (cut off)."""
    limit = limits.max_body_bytes if max_bytes is None else max_bytes
    announced = request.headers.get("content-length")
    if announced is not None:
        if not (announced.isascii() and announced.isdigit()):  # '²'.isdigit(), int() refuses
            raise ApiError(400, "bad_request", "Content-Length is not a number")
        if int(announced) > limit:
            raise _too_large(limit)
    pieces: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.request_timeout_s):
            async for piece in request.stream():
                size += len(piece)
                if size > limit:
                    raise _too_large(limit)
                pieces.append(piece)
    except TimeoutError:
        raise ApiError(
            408,
            "request_timeout",
            f"the body did not arrive within {limits.request_timeout_s:g} s",
        ) from None
    except ClientDisconnect:
        raise ApiError(400, "client_disconnected", "the body was cut off") from None
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
