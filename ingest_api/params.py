"""Request values of the JSON endpoints, validated: query integers, JSON bodies and fields.

Each failure is a 400 with a reason that names the parameter; nothing is changed.

An integer in a query is plain ASCII decimal digits (a ``-`` before them only to say that a
negative number is out of range): Python's ``int()`` would also take ``1_0`` (10), `` 1`` and
``+1``, and a reader that misspelt an offset would read from somewhere else.  An integer in a
JSON body is a JSON number without fraction or exponent, never a string or a boolean.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from delivery.filters import BadFilter, MessageFilter, filter_from_json, parse_filter
from delivery.framing import BINARY_MEDIA_TYPE
from delivery.partition_reader import check_max_bytes
from ingest_api.body import read_body
from ingest_api.errors import ApiError
from ingest_api.settings import Limits
from log_store.errors import BadRequest

JSON_BODY_LIMIT = 4 * 1024 * 1024
"""JSON bodies (joins, commits, subscriptions, fetches) are small; at most this many bytes."""


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


_NAMED_AT_MOST = 20
"""A refusal names this many unknown names at most (a URL may carry thousands)."""


def refuse_unknown(names: Iterable[Any], known: Iterable[str], where: str) -> None:
    """400 naming every one of ``names`` not in ``known``, and listing ``known``: a misspelt
    option is never silently dropped (it would change what the request does)."""
    accepted = frozenset(known)
    unknown = sorted({str(name) for name in names} - accepted)
    if not unknown:
        return
    shown = ", ".join(_printable(name) for name in unknown[:_NAMED_AT_MOST])
    if len(unknown) > _NAMED_AT_MOST:
        shown += f" and {len(unknown) - _NAMED_AT_MOST} more"
    listed = ", ".join(sorted(accepted)) if accepted else "none"
    raise ApiError(400, "bad_request", f"unknown {where}: {shown}; known: {listed}")


def _printable(name: str) -> str:
    """A name as a reason shows it: as it is if it is plain ASCII, else quoted, escaped (a
    look-alike letter or a control character shows) and cut short."""
    if name and len(name) <= 60 and all(c.isascii() and (c.isalnum() or c in "_.-") for c in name):
        return name
    return ascii(name[:60])


_DECIMAL = re.compile(r"-?[0-9]{1,1000}")


def is_decimal(raw: str) -> bool:
    """Whether ``raw`` is an integer as a query gives one: ASCII decimal digits (at most
    1,000), a ``-`` before them at most."""
    return _DECIMAL.fullmatch(raw) is not None


def decimal(name: str, raw: str) -> int:
    """``raw`` (the query parameter ``name``) as an integer (:func:`is_decimal`)."""
    if not is_decimal(raw):
        raise ApiError(
            400, "bad_request", f"{name} must be an integer (decimal digits), got {raw[:60]!r}"
        )
    return int(raw)


def _shown(value: int) -> str:
    text = str(value)
    return text if len(text) <= 30 else f"a number of {len(text.lstrip('-'))} digits"


def int_param(
    params: Mapping[str, str], name: str, default: int | None, low: int, high: int
) -> int:
    """The query parameter ``name`` as an integer in ``low..high`` (required without default)."""
    raw = params.get(name)
    if raw is None:
        if default is None:
            raise ApiError(400, "bad_request", f"query parameter {name} is required")
        return default
    value = decimal(name, raw)
    if not low <= value <= high:
        raise ApiError(400, "bad_request", f"{name} must be in {low}..{high}, got {_shown(value)}")
    return value


def json_int(raw: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    """The JSON field ``name`` as an integer in ``low..high``."""
    value = raw.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, "bad_request", f"{name} must be an integer")
    if not low <= value <= high:
        raise ApiError(400, "bad_request", f"{name} must be in {low}..{high}, got {value}")
    return value


INTEGER_FILTERS = ("hash_mod", "hash_rem")


def query_filter(params: Any) -> MessageFilter:
    """The filter a read's query parameters give; its integers are decimal digits."""
    for name in INTEGER_FILTERS:
        for value in params.getlist(name):
            if not is_decimal(value):
                raise BadFilter(f"filter {name}: {value[:60]!r} is not an integer (decimal digits)")
    return parse_filter({k: params.getlist(k) for k in params})


def json_filter(raw: object) -> MessageFilter:
    """The filter a JSON body gives.  ``hash_mod`` and ``hash_rem`` are JSON integers, or
    strings of decimal digits as in a query (``MessageFilter.to_params``, which the project's
    clients send); never booleans, never ``"1_0"``, ``" 1"`` or ``"+1"``."""
    if isinstance(raw, dict):
        for name in INTEGER_FILTERS:
            value = raw.get(name)
            for item in value if isinstance(value, list) else [value]:
                if item is None or (isinstance(item, int) and not isinstance(item, bool)):
                    continue
                if not isinstance(item, str) or not is_decimal(item):
                    raise BadFilter(f"filter {name} must be an integer, got {item!r:.60}")
    return filter_from_json(raw)


def str_field(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str):
        raise ApiError(400, "bad_request", f"{name} must be a string")
    return value


def wants_binary(request: Request, explicit: str | None) -> bool:
    """Whether a read answers in the binary framing (``format`` or the ``Accept`` header)."""
    if explicit is not None:
        if explicit not in ("json", "binary"):
            raise ApiError(400, "bad_request", "format must be json or binary")
        return explicit == "binary"
    return BINARY_MEDIA_TYPE in request.headers.get("accept", "")


def max_bytes_param(value: int) -> int:
    try:
        return check_max_bytes(value)
    except BadRequest as exc:
        raise ApiError(400, "max_bytes_out_of_range", str(exc)) from None


async def json_body(request: Request, limits: Limits) -> dict[str, Any]:
    """The request's JSON object body ({} if empty), at most :data:`JSON_BODY_LIMIT` bytes.

    A body must be sent as ``application/json`` (else 415): a browser sends ``text/plain``
    or a form from any web page without asking first, so a gateway without tokens on
    loopback would otherwise take a push subscription to anywhere from a page its user
    opened; ``application/json`` from another origin needs a CORS preflight it never passes.
    """
    raw = await read_body(request, limits, max_bytes=JSON_BODY_LIMIT)
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "bad_json", f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_json", "the body must be a JSON object")
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if raw and media != "application/json":
        raise ApiError(
            415, "unsupported_media_type", f"this endpoint takes application/json, not {media!r}"
        )
    return body
