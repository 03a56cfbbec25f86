"""Operational endpoints: ``/healthz``, ``/metrics`` (Prometheus text), ``/openapi.json``.

``/metrics`` is public unless ``metrics_require_token`` is set; then it needs a token with
``metrics = true`` (metric labels name every topic, which a tenant may not know of).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ingest_api.access import METRICS, PUBLIC, RouteDeclaration, route
from ingest_api.context import GatewayContext
from ingest_api.metrics import MetricsRegistry
from ingest_api.openapi import build_openapi


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    openapi_doc: list[bytes] = []

    async def healthz(request: Request) -> Response:
        return Response(
            orjson.dumps({"status": "ok", "dc": ctx.settings.dc}), media_type="application/json"
        )

    async def metrics(request: Request) -> Response:
        return Response(ctx.metrics.render(), media_type=MetricsRegistry.CONTENT_TYPE)

    async def openapi(request: Request) -> Response:
        if not openapi_doc:
            # built on first use: every route module is loaded by then
            doc = build_openapi(
                ctx, ctx.extensions["route_modules"], ctx.extensions["guarded_routes"]
            )
            openapi_doc.append(orjson.dumps(doc))
        return Response(openapi_doc[0], media_type="application/json")

    return [
        route("GET", "/healthz", healthz, PUBLIC),
        route("GET", "/metrics", metrics, METRICS),
        route("GET", "/openapi.json", openapi, PUBLIC),
    ]


def _text_response(description: str, media_type: str) -> dict[str, Any]:
    return {
        "200": {
            "description": description,
            "content": {media_type: {"schema": {"type": "string"}}},
        }
    }


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    return {
        "/healthz": {
            "get": {
                "summary": "Liveness",
                "operationId": "healthz",
                "responses": {
                    "200": {
                        "description": "the gateway is up",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["status"],
                                    "properties": {
                                        "status": {"type": "string", "enum": ["ok"]},
                                        "dc": {"type": "string"},
                                    },
                                }
                            }
                        },
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "operationId": "openapi",
                "responses": {
                    "200": {
                        "description": "the OpenAPI 3.1 description of this gateway",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (text format 0.0.4)",
                "operationId": "metrics",
                "responses": _text_response("metrics of the worker that answered", "text/plain"),
            }
        },
    }
