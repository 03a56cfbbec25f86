"""Operational endpoints: ``/healthz``, ``/metrics`` (Prometheus text), ``/openapi.json``.

``/metrics`` is public unless ``metrics_require_token`` is set; then it needs a token with
``metrics = true`` (metric labels name every topic, which a tenant may not know of).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anyio.to_thread
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
        # callbacks read the worker's state in its own thread; gauges read from the store
        # (disk, offsets, lag) may block, so the text is rendered off the event loop
        ctx.metrics.refresh()
        text = await anyio.to_thread.run_sync(ctx.metrics.render, False)
        return Response(text, media_type=MetricsRegistry.CONTENT_TYPE)

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


_REFRESHER = "ingest_api.admin_api.refresher"


async def on_startup(ctx: GatewayContext) -> None:
    # Callback gauges are read in the event loop that owns their state, and stored: other
    # workers' scrapes read them from the shared files, the Graphite sender from the registry.
    ctx.extensions[_REFRESHER] = asyncio.create_task(ctx.metrics.refresh_forever())


async def on_shutdown(ctx: GatewayContext) -> None:
    task = ctx.extensions.pop(_REFRESHER, None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    ctx.metrics.retire()


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
                "responses": _text_response(
                    "metrics of the gateway (all its workers)", "text/plain"
                ),
            }
        },
    }
