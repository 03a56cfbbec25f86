"""The ``/openapi.json`` document, assembled from the route modules that are installed.

Each route module may offer ``openapi_paths(ctx)`` and ``openapi_schemas(ctx)`` (see
``ingest_api.app``); this module adds the shared parts (info, the Error schema, bearer auth).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ingest_api.context import GatewayContext

OPENAPI_VERSION = "3.1.0"


def build_openapi(ctx: GatewayContext, modules: Sequence[ModuleType]) -> dict[str, Any]:
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
            paths.update(paths_of(ctx))
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
    if ctx.settings.auth_enabled:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
