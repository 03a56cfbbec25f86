"""Operational endpoints: ``/healthz``, ``/metrics`` (Prometheus text), ``/openapi.json``."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ingest_api.context import GatewayContext
from ingest_api.metrics import MetricsRegistry
from ingest_api.openapi import build_openapi


def routes(ctx: GatewayContext) -> list[BaseRoute]:
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
            openapi_doc.append(orjson.dumps(build_openapi(ctx, ctx.extensions["route_modules"])))
        return Response(openapi_doc[0], media_type="application/json")

    return [
        Route("/healthz", healthz, methods=["GET"], name="healthz"),
        Route("/metrics", metrics, methods=["GET"], name="metrics"),
        Route("/openapi.json", openapi, methods=["GET"], name="openapi", include_in_schema=False),
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
                "security": [],
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
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (text format 0.0.4)",
                "operationId": "metrics",
                "security": [],
                "responses": _text_response("metrics of the worker that answered", "text/plain"),
            }
        },
    }
