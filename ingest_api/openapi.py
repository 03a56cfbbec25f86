"""The ``/openapi.json`` document, assembled from the route modules that are installed.

Each route module may offer ``openapi_paths(ctx)`` and ``openapi_schemas(ctx)`` (see
``ingest_api.app``); this module adds the shared parts (info, the Error schema, bearer auth)
and, from the route table, each operation's security: a route declared public needs nothing,
every other route needs the bearer token and may answer 401 and 403; and every route that
refuses query parameters it does not take may answer 400.  The helpers below
(:func:`operation`, :func:`path_param`, :func:`query_param`) keep the modules' path items short.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ingest_api.access import GuardedRoute
from ingest_api.context import GatewayContext

OPENAPI_VERSION = "3.1.0"
OBJECT: dict[str, Any] = {"type": "object"}
_ERROR_REF = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
_ERROR_TEXTS = {
    "400": "bad input; nothing changed",
    "401": "missing or unknown bearer token",
    "403": "the token does not grant this (another client's object, topic or log type)",
    "404": "unknown topic, partition, group, member or subscription",
    "409": "conflict (not the owner, another subscription, a mirror gap)",
    "413": "body over the limit",
    "415": "the body is declared as something else than its route takes (JSON: application/json)",
    "416": "offset out of range; the body has start_offset and end_offset",
    "429": "a limit is reached (the body names it: limit, max)",
    "500": "corrupt_data: the read starts at a batch that fails its checksum on disk; the body "
    "has topic, partition, offset; a retry gets the same answer",
    "503": "the log store is unavailable",
}


def error_responses(*statuses: str) -> dict[str, Any]:
    return {s: {"description": _ERROR_TEXTS[s], "content": _ERROR_REF} for s in statuses}


def operation(
    op_id: str,
    summary: str,
    *,
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    ok: str = "200",
    ok_media: dict[str, Any] | None = None,
    errors: tuple[str, ...] = ("400", "404"),
) -> dict[str, Any]:
    """An operation answering JSON (or ``ok_media``), with the given error statuses (and 415,
    if it takes a JSON body: a body declared as anything else is refused)."""
    if body is not None and "415" not in errors:
        errors = (*errors, "415")
    op: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "responses": {
            ok: {
                "description": "see docs/protocol.md",
                "content": ok_media or {"application/json": {"schema": OBJECT}},
            },
            **error_responses(*errors),
        },
    }
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def path_param(name: str, kind: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": kind}}


def query_param(name: str, kind: str = "integer", required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": {"type": kind}}


def openapi_path(starlette_path: str) -> str:
    """``/v1/x/{partition:int}`` as OpenAPI writes it: ``/v1/x/{partition}``."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", starlette_path)


def _secure(paths: dict[str, Any], routes: Sequence[GuardedRoute], auth_enabled: bool) -> None:
    """Each documented operation's security, 401 and 403, from its route's permission."""
    for route in routes:
        item = paths.get(openapi_path(route.path))
        op = None if item is None else item.get(route.declaration.method.lower())
        if op is None:
            continue
        permission = route.permission
        op["x-permission"] = permission.describe()
        if permission.kind == "peer":
            op["security"] = [{"peer": []}]
            op["responses"].update(error_responses("401"))
            continue
        if permission.public or not auth_enabled:
            op["security"] = []
            continue
        op["security"] = [{"bearer": []}]
        op["responses"].update(
            {s: r for s, r in error_responses("401", "403").items() if s not in op["responses"]}
        )


def _query_refusals(paths: dict[str, Any], routes: Sequence[GuardedRoute]) -> None:
    """400 on every operation of a route that refuses query parameters it does not take
    (every route but the legacy Archive API's): a misspelt one is refused, never ignored."""
    for route in routes:
        item = paths.get(openapi_path(route.path))
        op = None if item is None else item.get(route.declaration.method.lower())
        if op is None or route.declaration.query.ignore_unknown:
            continue
        op.setdefault("responses", {}).setdefault("400", error_responses("400")["400"])


def build_openapi(
    ctx: GatewayContext, modules: Sequence[ModuleType], routes: Sequence[GuardedRoute] = ()
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every installed route module."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {
        "Error": {
            "type": "object",
            "required": ["error", "reason"],
            "properties": {
                "error": {"type": "string", "description": "short machine-readable code"},
                "reason": {"type": "string", "description": "what is wrong, for a human"},
            },
        }
    }
    for module in modules:
        paths_of = getattr(module, "openapi_paths", None)
        if paths_of is not None:
            # two modules may document two methods of one path (GET and PATCH of a topic)
            for path, item in paths_of(ctx).items():
                paths.setdefault(path, {}).update(item)
        schemas_of = getattr(module, "openapi_schemas", None)
        if schemas_of is not None:
            schemas.update(schemas_of(ctx))
    doc: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "logbroker",
            "version": "1",
            "description": "Exactly-once log collection and delivery. See docs/protocol.md.",
        },
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": schemas},
    }
    _secure(paths, routes, ctx.settings.auth_enabled)
    _query_refusals(paths, routes)
    schemes: dict[str, Any] = {}
    if ctx.settings.auth_enabled:
        schemes["bearer"] = {"type": "http", "scheme": "bearer"}
    if any(route.permission.kind == "peer" for route in routes):
        schemes["peer"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "the gateways' peer_token (internal calls between gateways)",
        }
    if schemes:
        doc["components"]["securitySchemes"] = schemes
    return doc
