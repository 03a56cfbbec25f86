"""The dashboard: a page at ``/ui`` and the JSON it draws (``GET /v1/ui/overview``), plus the
reports push-clients and mirrors send about their lag.

The page and its script, style sheet and charts are files of this package
(``ingest_api/ui_static``): no CDN, no build step, so it works on a gateway without internet.
They are public (they hold no data); every number comes from ``/v1/ui/overview`` and
``/v1/audit/windows``, which need a token when tokens are configured (the page asks for one and
keeps it in the tab's ``sessionStorage``).  See ``docs/dashboard.md``.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from ingest_api.access import PUBLIC, REPLICATE, RouteDeclaration, access_of, read, route, write
from ingest_api.auth import forbidden
from ingest_api.client_status import ClientReports, mirror_rows, push_rows
from ingest_api.context import GatewayContext
from ingest_api.delivery_parts import delivery_parts
from ingest_api.errors import ApiError
from ingest_api.openapi import operation, path_param
from ingest_api.overview import Overview, RateWindow
from ingest_api.params import json_body, json_response

_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_PAGE = "index.html"
_HEADERS = {
    "Cache-Control": "no-cache",
    # Defence in depth for a page that holds a token: it loads its own files only, talks to
    # its own gateway only, runs no inline script or style, and is never framed.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _static_files() -> dict[str, tuple[bytes, str]]:
    """Every asset of the page by name, read once: nothing else can be asked for."""
    files = {}
    for entry in resources.files("ingest_api").joinpath("ui_static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _MEDIA_TYPES:
            files[entry.name] = (entry.read_bytes(), _MEDIA_TYPES[suffix])
    return files


class UiApi:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        parts = delivery_parts(ctx)
        self.clients = ClientReports(parts.state)
        self.overview = Overview(
            ctx.store,
            ctx.settings,
            parts.groups,
            parts.push.registry,
            self.clients,
            RateWindow(),
        )
        self.files = _static_files()

    def _file(self, name: str) -> Response:
        found = self.files.get(name)
        if found is None:
            raise ApiError(404, "not_found", f"the dashboard has no file {name[:100]!r}")
        content, media_type = found
        return Response(content, media_type=media_type, headers=_HEADERS)

    async def page(self, request: Request) -> Response:
        return self._file(_PAGE)

    async def asset(self, request: Request) -> Response:
        return self._file(request.path_params["name"])

    async def get_overview(self, request: Request) -> Response:
        access = access_of(request)
        doc = await anyio.to_thread.run_sync(self.overview.build, access)
        return json_response(doc)

    async def push_client_status(self, request: Request) -> Response:
        """A push-client's lag per file, kept for the files whose log type the token writes.

        The others are skipped and named in the answer (one file of a log type the token may
        not write, parked by the client, must not hide the lag of the rest); a report of only
        such files is 403.
        """
        access = access_of(request)
        body = await json_body(request, self.ctx.settings.limits)
        reported = push_rows(body)
        rows = [row for row in reported if access.may_write(row["log_type"])]
        skipped = [row["path"] for row in reported if not access.may_write(row["log_type"])]
        if skipped and not rows:
            raise forbidden(f"this token may not write log type {reported[0]['log_type']!r}")
        record = functools.partial(
            self.clients.record, "push", body.get("client"), body.get("host"), access.owner, rows
        )
        await anyio.to_thread.run_sync(record)
        return json_response({"recorded": len(rows), "skipped": skipped})

    async def mirror_status(self, request: Request) -> Response:
        """A mirror's lag per partition; each topic must be one the token replicates into."""
        access = access_of(request)
        body = await json_body(request, self.ctx.settings.limits)
        rows = mirror_rows(body)
        for row in rows:
            if not access.auth.may_replicate(access.grant, row["topic"]):
                raise forbidden(f"this token may not replicate into topic {row['topic']!r}")
        record = functools.partial(
            self.clients.record, "mirror", body.get("client"), body.get("host"), access.owner, rows
        )
        await anyio.to_thread.run_sync(record)
        return json_response({"recorded": len(rows)})


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    api = UiApi(ctx)
    return [
        # a page: a link may carry what the dashboard does not use (tracking, a bookmark's)
        route("GET", "/ui", api.page, PUBLIC, name="dashboard", unknown_query="ignore"),
        route(
            "GET",
            "/ui/static/{name}",
            api.asset,
            PUBLIC,
            name="dashboard_asset",
            unknown_query="ignore",
        ),
        route("GET", "/v1/ui/overview", api.get_overview, read(lists=True), name="ui_overview"),
        route("POST", "/v1/clients/status", api.push_client_status, write()),
        route("POST", "/v1/mirrors/status", api.mirror_status, REPLICATE),
    ]


def _status_body(rows_name: str, row: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["client", rows_name],
        "properties": {
            "client": {"type": "string", "description": "stable name of the reporting client"},
            "host": {"type": "string"},
            rows_name: {"type": "array", "items": row},
        },
    }


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    html = {"text/html": {"schema": {"type": "string"}}}
    count = {"type": "integer", "minimum": 0}
    file_row = {
        "type": "object",
        "required": ["path", "log_type", "size", "acked", "lag_bytes"],
        "properties": {
            "path": {"type": "string"},
            "log_type": {"type": "string"},
            "size": count,
            "acked": count,
            "lag_bytes": count,
            "lag_s": {"type": "number", "minimum": 0},
            "phase": {"type": "string"},
            "errno": {"type": ["string", "null"], "description": "the phase's error: EACCES"},
        },
    }
    partition_row = {
        "type": "object",
        "required": ["topic", "partition", "position", "source_end_offset"],
        "properties": {
            "topic": {"type": "string"},
            "partition": count,
            "position": count,
            "source_end_offset": count,
        },
    }
    return {
        "/ui": {"get": operation("dashboard", "The dashboard page", ok_media=html, errors=())},
        "/ui/static/{name}": {
            "get": operation(
                "dashboard_asset",
                "A file of the dashboard page (script, style sheet)",
                params=[path_param("name")],
                ok_media={"*/*": {"schema": {"type": "string"}}},
                errors=("404",),
            )
        },
        "/v1/ui/overview": {
            "get": operation(
                "ui_overview",
                "Topics, rates, lags, client reports and disk use (what the token may see)",
                errors=(),
            )
        },
        "/v1/clients/status": {
            "post": operation(
                "push_client_status",
                "A push-client's lag per file (kept for the dashboard)",
                body=_status_body("files", file_row),
                errors=("400", "413"),
            )
        },
        "/v1/mirrors/status": {
            "post": operation(
                "mirror_status",
                "A mirror's lag per partition (kept for the dashboard)",
                body=_status_body("partitions", partition_row),
                errors=("400", "413"),
            )
        },
    }
