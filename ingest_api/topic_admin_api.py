"""Operators' changes to a topic: ``PATCH /v1/topics/{topic}`` (an ``admin`` token).

The body names what changes; a field left out stays as it is::

    {"partitions": 8}                         grow (never shrink), up to max_partitions_per_topic
    {"retention_ms": 259200000}               keep 72 hours
    {"retention_ms": null, "retention_bytes": null}   no retention limit (keep everything)
    {"segment_bytes": 67108864}

The change goes through the gateway's :class:`~log_store.topic_quota.TopicQuota`: a partition
count over ``max_partitions_per_topic`` is 429 ``limit_reached`` (as for a replica call), a
shrink, a negative retention or an unknown field 400, and a refused change changes nothing.
``logbroker topics alter --server URL`` calls it.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from delivery.internal_state import is_internal
from ingest_api.access import ADMIN, RouteDeclaration, route
from ingest_api.context import GatewayContext
from ingest_api.errors import ApiError
from ingest_api.openapi import operation, path_param
from ingest_api.params import json_body, json_response
from log_store.interface import UNLIMITED
from log_store.topic_names import validate_topic_name
from log_store.topic_quota import TopicChange

_MAX_VALUE = 2**63 - 1
_RETENTIONS = ("retention_ms", "retention_bytes")
_FIELDS = ("partitions", *_RETENTIONS, "segment_bytes")


def _change(doc: dict[str, Any]) -> TopicChange:
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise ApiError(
            400, "bad_request", f"unknown fields {unknown}; a change names {', '.join(_FIELDS)}"
        )
    if not doc:
        raise ApiError(400, "bad_request", f"nothing to change; name one of {', '.join(_FIELDS)}")
    values: dict[str, int | None] = {}
    for name, value in doc.items():
        if value is None and name in _RETENTIONS:
            values[name] = UNLIMITED
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            null = " or null (no limit)" if name in _RETENTIONS else ""
            raise ApiError(400, "bad_request", f"{name} must be an integer{null}")
        low = 1 if name == "partitions" else 0
        if not low <= value <= _MAX_VALUE:
            raise ApiError(400, "bad_request", f"{name} must be in {low}..{_MAX_VALUE}")
        values[name] = value
    return TopicChange(**values)


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    async def alter_topic(request: Request) -> Response:
        topic = validate_topic_name(request.path_params["topic"])
        if is_internal(topic):
            raise ApiError(400, "bad_request", "internal topics are managed by the gateway")
        change = _change(await json_body(request, ctx.settings.limits))
        info = await anyio.to_thread.run_sync(ctx.topic_quota.alter, topic, change)
        return json_response(info.settings_json())

    return [route("PATCH", "/v1/topics/{topic}", alter_topic, ADMIN)]


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    retention = {"type": ["integer", "null"], "minimum": 0, "description": "null: no limit"}
    body = {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {
            "partitions": {"type": "integer", "minimum": 1, "description": "grow only"},
            "retention_ms": retention,
            "retention_bytes": retention,
            "segment_bytes": {"type": "integer", "minimum": 0},
        },
    }
    return {
        "/v1/topics/{topic}": {
            "patch": operation(
                "alter_topic",
                "Grow a topic or change its retention (admin); a field left out stays",
                params=[path_param("topic")],
                body=body,
                errors=("400", "404", "429"),
            )
        }
    }
