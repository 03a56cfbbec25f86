"""HTTP errors as the protocol states them: JSON ``{"error", "reason"}`` and a status.

Route modules raise :class:`ApiError` (or let a :class:`~log_store.errors.BadRequest`,
:class:`~log_store.errors.StoreUnavailable` or :class:`~log_store.errors.CorruptData`
through); :func:`exception_handlers` turns each into its response, so no route formats an
error by hand.
"""

from __future__ import annotations

import errno
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from delivery.consumer_group import (
    NotGroupOwner,
    NotPartitionOwner,
    SubscriptionConflict,
    TopicRecreated,
    UnknownGroup,
    UnknownMember,
)
from delivery.filters import BadFilter
from delivery.legacy_txn import UnknownStagedData, UnknownTransaction, WindowExpired
from delivery.push import NotSubscriptionOwner, SubscriptionExists, UnknownSubscription
from log_store.errors import (
    BadRequest,
    CorruptData,
    LimitReached,
    LogbrokerError,
    OffsetOutOfRange,
    PartitionUnavailable,
    RecordTooLarge,
    StoreFull,
    StoreUnavailable,
    TopicDeletedInFlight,
    TopicExists,
    UnknownPartition,
    UnknownTopic,
)
from log_store.topic_names import TOPIC_NAME_PATTERN

RETRY_AFTER_S = 1
_PARTITION = re.compile(r"[0-9]+")  # what a route's {partition:int} matches
PARTITION_UNAVAILABLE = "partition_unavailable"
"""The error code of a 503 for partitions without a reachable owner (the rest of the store
may take writes); its body names them (``partitions``)."""
FULL_DISK_RETRY_AFTER_S = 10
"""A full disk is freed by retention or by hand, not within a second."""
_log = logging.getLogger("ingest_api")

# errno values that mean "the disk cannot take this write now", not "the gateway is broken".
_UNAVAILABLE_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EIO})


class ApiError(LogbrokerError):
    """An answer other than 200 that a route decided on: status, short code and reason."""

    def __init__(
        self,
        status: int,
        error: str,
        reason: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


def error_response(
    status: int,
    error: str,
    reason: str,
    *,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Response:
    """The JSON error body every endpoint uses; ``extra`` adds fields (e.g. offsets)."""
    body: dict[str, Any] = {"error": error, "reason": reason}
    if extra:
        body.update(extra)
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def unavailable_response(reason: str) -> Response:
    """503 with ``Retry-After``: nothing was acknowledged, the client keeps its data."""
    return error_response(
        503, "store_unavailable", reason, headers={"Retry-After": str(RETRY_AFTER_S)}
    )


def partitions_unavailable(
    failed: Sequence[tuple[str, PartitionUnavailable]], *, pins: bool = False
) -> ApiError:
    """The 503 of a write whose only failures are partitions without a reachable owner.

    ``failed`` holds (source id, error) of each section that failed so.  The body names them
    (``partitions``: topic, partition and ``source_ids`` each), so a client can hold back
    those sources alone and send the others again at once (the sections of other partitions
    were written: their resend is answered ``duplicate``).  Still a 503: a client that does
    not read the body retries the request as a whole, as it did before.

    ``pins``: the partitions named hold the pins of the sources named (sources this gateway
    routes for the first time), not necessarily their data: each entry says so
    (``"pins": true``), so that a client does not take it for the partition its data goes to.
    """
    sources: dict[tuple[str, int], list[str]] = {}
    reasons: dict[tuple[str, int], str] = {}
    for source_id, exc in failed:
        key = (exc.topic, exc.partition)
        sources.setdefault(key, []).append(source_id)
        reasons.setdefault(key, str(exc))
    return ApiError(
        503,
        PARTITION_UNAVAILABLE,
        "; ".join(reasons.values()),
        headers={"Retry-After": str(RETRY_AFTER_S)},
        extra={
            "partitions": [
                {
                    "topic": topic,
                    "partition": partition,
                    "source_ids": ids,
                    "reason": reasons[topic, partition],
                    **({"pins": True} if pins else {}),
                }
                for (topic, partition), ids in sources.items()
            ]
        },
    )


_BAD_REQUEST_STATUSES: tuple[tuple[type[BadRequest], int, str], ...] = (
    (LimitReached, 429, "limit_reached"),
    (RecordTooLarge, 413, "record_too_large"),
    (NotGroupOwner, 403, "forbidden"),
    (NotSubscriptionOwner, 403, "forbidden"),
    (UnknownTopic, 404, "unknown_topic"),
    (TopicExists, 409, "topic_exists"),
    (UnknownPartition, 404, "unknown_partition"),
    (OffsetOutOfRange, 416, "offset_out_of_range"),
    (UnknownGroup, 404, "unknown_group"),
    (UnknownMember, 404, "unknown_member"),
    (NotPartitionOwner, 409, "not_owner"),
    (SubscriptionConflict, 409, "subscription_conflict"),
    (TopicRecreated, 409, "topic_recreated"),
    (UnknownSubscription, 404, "unknown_subscription"),
    (SubscriptionExists, 409, "subscription_exists"),
    (BadFilter, 400, "bad_filter"),
    (UnknownTransaction, 404, "unknown_transaction"),
    (UnknownStagedData, 404, "unknown_store_id"),
    (WindowExpired, 409, "window_expired"),
)
"""Every error a part of logbroker raises for bad input, and how the API states it."""


def _bad_request_status(exc: BadRequest) -> tuple[int, str]:
    for kind, status, code in _BAD_REQUEST_STATUSES:
        if isinstance(exc, kind):
            return status, code
    return 400, "bad_request"


async def _on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.error, exc.reason, headers=exc.headers, extra=exc.extra)


async def _on_bad_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BadRequest)
    status, code = _bad_request_status(exc)
    extra: dict[str, Any] = {}
    headers: dict[str, str] | None = None
    if isinstance(exc, OffsetOutOfRange):
        extra = {"start_offset": exc.start_offset, "end_offset": exc.end_offset}
    if isinstance(exc, LimitReached):
        extra = {"limit": exc.limit, "max": exc.maximum}
        if exc.retry_after_s is not None:
            headers = {"Retry-After": str(exc.retry_after_s)}
    return error_response(status, code, str(exc), headers=headers, extra=extra)


async def _on_store_unavailable(request: Request, exc: Exception) -> Response:
    if isinstance(exc, TopicDeletedInFlight):
        # not the store's health: an operator deleted the topic; the retry makes it again
        return error_response(
            503, "topic_deleted", str(exc), headers={"Retry-After": str(RETRY_AFTER_S)}
        )
    if isinstance(exc, PartitionUnavailable):
        # one partition, not the store: named, so that a client may hold back its sources only
        return error_response(
            503,
            PARTITION_UNAVAILABLE,
            str(exc),
            headers={"Retry-After": str(RETRY_AFTER_S)},
            extra={"partitions": [{"topic": exc.topic, "partition": exc.partition}]},
        )
    if isinstance(exc, StoreFull):
        if exc.never_fits:
            # Retrying cannot help while the file system is this small: 507, not 503.
            return error_response(507, "insufficient_storage", str(exc))
        return error_response(
            503,
            "store_unavailable",
            str(exc),
            headers={"Retry-After": str(FULL_DISK_RETRY_AFTER_S)},
        )
    return unavailable_response(str(exc) or "the log store cannot take writes now")


async def _on_corrupt_data(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CorruptData)
    # 500 with no Retry-After: the data on disk is damaged and every retry gets the same
    # answer; an operator acts (docs/operations.md), a reader stops at this offset.
    return error_response(500, "corrupt_data", str(exc), extra=corrupt_data_fields(exc))


def corrupt_data_fields(exc: CorruptData) -> dict[str, Any]:
    """Where the damaged data lies, as the answer names it."""
    return {"topic": exc.topic, "partition": exc.partition, "offset": exc.offset}


async def _on_os_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, OSError)
    if exc.errno in _UNAVAILABLE_ERRNOS:
        return unavailable_response(f"the data directory cannot take writes: {exc.strerror}")
    _log.exception("unexpected OS error", exc_info=exc)
    return error_response(500, "internal", "internal error; see the gateway's log")


async def _on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    reason = str(exc.detail)
    path = request.url.path[:200]
    if exc.status_code == 404:
        reason = f"no endpoint {request.method} {path}" + _not_found_hint(request)
    elif exc.status_code == 405:
        reason = f"{request.method} is not allowed on {path}"
    return error_response(
        exc.status_code, codes.get(exc.status_code, "http_error"), reason, headers=exc.headers
    )


def _not_found_hint(request: Request) -> str:
    """What is wrong with a path under ``/v1/topics/{topic}`` or ``/v1/replica/{topic}`` that
    no route matched: the topic name, or the partition number; "" for anything else."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    # undecoded: a topic name holding '/' (sent as %2F) is one segment, shown as sent
    parts = raw.decode("latin-1").split("?", 1)[0].split("/")
    if len(parts) < 4 or parts[1] != "v1" or parts[2] not in ("topics", "replica"):
        return ""
    if not TOPIC_NAME_PATTERN.fullmatch(unquote(parts[3])):
        return "; a topic name is 1-201 characters of [a-z0-9._-]"
    if len(parts) > 5 and parts[4] == "partitions" and not _PARTITION.fullmatch(parts[5]):
        partition = unquote(parts[5])[:40]
        return f"; {partition!r} is not a partition number (0, 1, 2, ...)"
    return ""


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    _log.error("unexpected error in %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal error; see the gateway's log")


def exception_handlers() -> dict[Any, Callable[[Request, Exception], Any]]:
    """Starlette ``exception_handlers`` mapping every error we know to its JSON answer."""
    return {
        ApiError: _on_api_error,
        BadRequest: _on_bad_request,
        StoreUnavailable: _on_store_unavailable,
        CorruptData: _on_corrupt_data,
        OSError: _on_os_error,
        HTTPException: _on_http_exception,
        Exception: _on_unexpected,
    }
