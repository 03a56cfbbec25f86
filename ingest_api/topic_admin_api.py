"""Operators' topics: ``POST /v1/topics`` creates one, ``PATCH /v1/topics/{topic}`` changes one,
``DELETE /v1/topics/{topic}`` deletes one and its data (each with an ``admin`` token; on a
gateway without tokens, on loopback, anyone may).

A creation names the topic and, optionally, its settings; a setting left out is the gateway's
(``partitions``: its ``partitions``; retention: none; the store's segment size)::

    {"name": "dc1.nginx-access", "partitions": 8, "retention_ms": 259200000}

and is answered 201 with the topic's settings, 409 ``topic_exists`` if the name is taken.
A change names what changes; a field left out stays as it is::

    {"partitions": 8}                         grow (never shrink), up to max_partitions_per_topic
    {"retention_ms": 259200000}               keep 72 hours
    {"retention_ms": null, "retention_bytes": null}   no retention limit (keep everything)
    {"segment_bytes": 67108864}

Both go through the gateway's :class:`~log_store.topic_quota.TopicQuota`: a partition count
over ``max_partitions_per_topic``, or a creation at ``max_topics``, is 429 ``limit_reached``
(as for a write or a replica call); a bad name, a shrink, a negative retention or an unknown
field 400; and a refused request changes nothing.  ``logbroker topics create|alter --server
URL`` call them.

A deletion (:meth:`TopicQuota.delete`) is answered with the settings the topic had (its
``topic_id`` included), 404 for a topic that does not exist, and logged as a warning with the
token's owner; ``logbroker topics delete --server URL`` calls it.  The next write of its log
type makes the topic again, with a new id: pins and seqnos are kept per topic id, and a
consumer's commit naming the old id is refused (``topic_recreated``).  The log type's schemas
are the log type's and stay.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from audit.records import is_audit_topic
from delivery.internal_state import is_internal
from ingest_api.access import ADMIN, RouteDeclaration, access_of, route
from ingest_api.context import GatewayContext
from ingest_api.errors import ApiError
from ingest_api.openapi import operation, path_param
from ingest_api.params import json_body, json_response
from log_store.interface import UNLIMITED, TopicConfig
from log_store.topic_names import TOPIC_NAME_PATTERN, validate_topic_name
from log_store.topic_quota import TopicChange

_MAX_VALUE = 2**63 - 1
_log = logging.getLogger("ingest_api")
_RETENTIONS = ("retention_ms", "retention_bytes")
_FIELDS = ("partitions", *_RETENTIONS, "segment_bytes")


def _settings(doc: dict[str, Any], what: str, max_partitions: int) -> dict[str, int | None]:
    """The settings ``doc`` names, checked (400 otherwise); a null retention is UNLIMITED.

    ``partitions`` below 1 is told the real range, up to ``max_partitions`` (the gateway's
    ``limits.max_partitions_per_topic``; above it is 429 ``limit_reached``, from the quota)."""
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise ApiError(
            400, "bad_request", f"unknown fields {unknown}; {what} names {', '.join(_FIELDS)}"
        )
    values: dict[str, int | None] = {}
    for name, value in doc.items():
        if value is None and name in _RETENTIONS:
            values[name] = UNLIMITED
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            null = " or null (no limit)" if name in _RETENTIONS else ""
            raise ApiError(400, "bad_request", f"{name} must be an integer{null}")
        if name == "partitions" and value < 1:
            raise ApiError(
                400,
                "bad_request",
                f"partitions must be in 1..{max_partitions} "
                f"(limits.max_partitions_per_topic), got {value}",
            )
        low = 1 if name == "partitions" else 0
        if not low <= value <= _MAX_VALUE:
            raise ApiError(400, "bad_request", f"{name} must be in {low}..{_MAX_VALUE}")
        values[name] = value
    return values


def _change(doc: dict[str, Any], max_partitions: int) -> TopicChange:
    if not doc:
        raise ApiError(400, "bad_request", f"nothing to change; name one of {', '.join(_FIELDS)}")
    return TopicChange(**_settings(doc, "a change", max_partitions))


def _creation(
    doc: dict[str, Any], default_partitions: int, max_partitions: int
) -> tuple[str, TopicConfig]:
    """The new topic's name and settings; a setting left out is the default."""
    name = doc.get("name")
    if not isinstance(name, str):
        raise ApiError(400, "bad_request", "name (the new topic's name, a string) is required")
    topic = validate_topic_name(name)
    if is_internal(topic):
        raise ApiError(400, "bad_request", "internal topics are managed by the gateway")
    settings = _settings(
        {k: v for k, v in doc.items() if k != "name"},
        "besides its name, a creation",
        max_partitions,
    )
    return topic, TopicConfig(
        partitions=_given(settings, "partitions", default_partitions),
        retention_ms=_no_limit_is_none(settings.get("retention_ms")),
        retention_bytes=_no_limit_is_none(settings.get("retention_bytes")),
        segment_bytes=_given(settings, "segment_bytes", TopicConfig().segment_bytes),
    )


def _given(settings: dict[str, int | None], name: str, default: int) -> int:
    value = settings.get(name)
    return default if value is None else value


def _no_limit_is_none(value: int | None) -> int | None:
    """A new topic's retention: left out and null (UNLIMITED) both mean no limit."""
    return None if value == UNLIMITED else value


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    async def create_topic(request: Request) -> Response:
        doc = await json_body(request, ctx.settings.limits)
        topic, config = _creation(
            doc, ctx.settings.partitions, ctx.settings.limits.max_partitions_per_topic
        )
        info = await anyio.to_thread.run_sync(ctx.topic_quota.create_new, topic, config)
        return json_response(info.settings_json(), status=201)

    async def alter_topic(request: Request) -> Response:
        topic = _operators_topic(request)
        change = _change(
            await json_body(request, ctx.settings.limits),
            ctx.settings.limits.max_partitions_per_topic,
        )
        info = await anyio.to_thread.run_sync(ctx.topic_quota.alter, topic, change)
        return json_response(info.settings_json())

    async def delete_topic(request: Request) -> Response:
        topic = _operators_topic(request)
        if is_audit_topic(topic):
            # its records are what `logbroker audit --windows` reconciles: a deletion loses
            # them, and the gateways make it again at their next publish
            raise ApiError(
                400,
                "bad_request",
                f"{topic} is the audit topic; it is not deleted by hand: bound it with "
                "PATCH /v1/topics/{topic} (retention_ms, retention_bytes)",
            )
        info = await anyio.to_thread.run_sync(ctx.topic_quota.delete, topic)
        # destructive and asked for over the network: said at the default log level
        _log.warning(
            "topic %s (id %s) and its data deleted at the request of %s",
            info.name,
            info.topic_id,
            access_of(request).owner or "a caller (the gateway has no tokens)",
        )
        return json_response(info.settings_json())

    return [
        route("POST", "/v1/topics", create_topic, ADMIN),
        route("PATCH", "/v1/topics/{topic}", alter_topic, ADMIN),
        route("DELETE", "/v1/topics/{topic}", delete_topic, ADMIN),
    ]


def _operators_topic(request: Request) -> str:
    topic = validate_topic_name(request.path_params["topic"])
    if is_internal(topic):
        raise ApiError(400, "bad_request", "internal topics are managed by the gateway")
    return topic


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
    creation = {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "pattern": f"^{TOPIC_NAME_PATTERN.pattern}$"},
            "partitions": {
                "type": "integer",
                "minimum": 1,
                "description": "left out: the gateway's partitions; over "
                "max_partitions_per_topic: 429",
            },
            "retention_ms": retention,
            "retention_bytes": retention,
            "segment_bytes": {"type": "integer", "minimum": 0},
        },
    }
    return {
        "/v1/topics": {
            "post": operation(
                "create_topic",
                "Create a topic (admin); a setting left out is the gateway's",
                body=creation,
                ok="201",
                errors=("400", "409", "429"),
            )
        },
        "/v1/topics/{topic}": {
            "patch": operation(
                "alter_topic",
                "Grow a topic or change its retention (admin); a field left out stays",
                params=[path_param("topic")],
                body=body,
                errors=("400", "404", "429"),
            ),
            "delete": operation(
                "delete_topic",
                "Delete a topic and its data (admin); the answer is the topic as it was",
                params=[path_param("topic")],
                errors=("400", "404"),
            ),
        },
    }
