"""Schemas of structured log types over HTTP, and the check of structured chunks on write.

Routes (see ``docs/schemas.md``)::

    GET  /v1/schemas                                   structured log types the token may write
    GET  /v1/schemas/{log_type}                        compatibility mode and versions
    POST /v1/schemas/{log_type}/versions               register a version {"schema": ...}
    GET  /v1/schemas/{log_type}/versions/{version}     one version (a number or "latest")
    PUT  /v1/schemas/{log_type}/compatibility          {"compatibility": "backward"|...}
    GET  /v1/topics/{topic}/schemas                    every version, for the topic's readers

The first five need the write permission of the log type; the last one the read permission
of the topic (a loader or consumer that reads a structured topic needs its schemas).

:class:`StructuredWrites` is the write path's hook: a section of ``/v1/write`` whose log type
has a schema is checked line by line against the newest version; the first line that is not a
record of it refuses that section (400 ``bad_record`` naming the chunk's seqno, the line and
the field) and, in the write path, every other section of its source in the request, as any
refusal does (see :func:`~ingest_api.framing.refuse_whole_sources`), and a section that
passes is written with the schema's id in its envelopes.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import Response

from audit.records import AUDIT_LOG_TYPE
from ingest_api.access import RouteDeclaration, access_of, read, route, write
from ingest_api.body import read_body
from ingest_api.context import GatewayContext
from ingest_api.errors import ApiError
from ingest_api.framing import Section
from ingest_api.openapi import OBJECT, error_responses, path_param
from log_store.topic_names import is_valid_log_type, validate_topic_name
from schema_registry import (
    MODES,
    BadRecord,
    IncompatibleSchema,
    InvalidSchema,
    SchemaRegistry,
    SchemaVersion,
    StructuredLogType,
    UnknownSchema,
    parse,
    parse_mode,
    records_of,
)
from session_dedup.chunk_codecs import CorruptChunk, decompress

MAX_SCHEMA_REQUEST_BYTES = 512 * 1024
STRUCTURED_WRITES = __name__
"""The key of the write path's :class:`StructuredWrites` in ``GatewayContext.extensions``."""


def _json(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def _log_type(request: Request) -> str:
    value = request.path_params["log_type"]
    if not is_valid_log_type(value):
        raise ApiError(400, "bad_request", f"invalid log type {str(value)[:60]!r}")
    assert isinstance(value, str)
    return value


def _summary(found: StructuredLogType) -> dict[str, Any]:
    return {
        "log_type": found.log_type,
        "compatibility": found.compatibility,
        "versions": [v.to_json(with_schema=False) for v in found.versions],
    }


def _first_bad_record(version: SchemaVersion, section: Section) -> ApiError | None:
    """The refusal of a section with a line that is not a record of ``version``'s schema."""
    batch = section.batch
    where = f"schema version {version.version} (id {version.schema.id_hex})"
    for seqno, data in zip(batch.seqnos, batch.datas, strict=True):
        try:
            raw = decompress(section.meta.codec, bytes(data))
            collections.deque(records_of(version.schema, raw), maxlen=0)  # check every record
        except CorruptChunk as exc:
            return ApiError(400, "bad_chunk", f"chunk seqno {seqno}: {exc}")
        except BadRecord as exc:
            return ApiError(
                400,
                "bad_record",
                f"log type {section.meta.log_type!r} is structured: chunk seqno {seqno}, {exc} "
                f"(against {where}); nothing of this source's section was written",
            )
    return None


class StructuredWrites:
    """The write path's schema check (see the module docstring)."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry

    def _check(self, sections: Sequence[Section]) -> None:
        for section in sections:
            if section.error is not None:
                continue
            if section.meta.log_type == AUDIT_LOG_TYPE:  # one registered before this was refused
                continue
            latest = self.registry.latest(section.meta.log_type)
            if latest is None:
                continue
            section.error = _first_bad_record(latest, section)
            if section.error is None:
                section.meta = dataclasses.replace(section.meta, schema_id=latest.schema_id)

    async def check(self, sections: Sequence[Section]) -> None:
        """Refuse the sections with a bad record; stamp the others of structured log types.

        Log types known (from the cache) to have no schema cost nothing more; any other
        section is checked in a worker thread, off the event loop.
        """
        if all(
            s.error is not None or self.registry.known_unstructured(s.meta.log_type)
            for s in sections
        ):
            return
        await anyio.to_thread.run_sync(self._check, sections)


class SchemasApi:
    def __init__(self, ctx: GatewayContext, registry: SchemaRegistry) -> None:
        self.ctx = ctx
        self.registry = registry

    async def _body(self, request: Request) -> dict[str, Any]:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise ApiError(415, "unsupported_media_type", "this endpoint takes application/json")
        body = await read_body(
            request, self.ctx.settings.limits, max_bytes=MAX_SCHEMA_REQUEST_BYTES
        )
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, "bad_json", f"the body is not UTF-8 JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ApiError(400, "bad_json", "the body must be a JSON object")
        return doc

    async def _structured(self, log_type: str) -> StructuredLogType:
        found = await anyio.to_thread.run_sync(lambda: self.registry.log_type(log_type, fresh=True))
        if found is None:
            raise ApiError(404, "unknown_log_type", f"log type {log_type!r} has no schema")
        return found

    async def list_log_types(self, request: Request) -> Response:
        access = access_of(request)
        names = await anyio.to_thread.run_sync(self.registry.structured_log_types)
        return _json({"log_types": [n for n in names if access.may_write(n)]})

    async def describe(self, request: Request) -> Response:
        return _json(_summary(await self._structured(_log_type(request))))

    async def register(self, request: Request) -> Response:
        log_type = _log_type(request)
        if log_type == AUDIT_LOG_TYPE:
            # every tier writes its counts there in the audit's own format (audit.records)
            raise ApiError(400, "bad_request", f"{AUDIT_LOG_TYPE} is the audit's own log type")
        doc = await self._body(request)
        if set(doc) != {"schema"}:
            raise ApiError(400, "bad_json", 'the body is {"schema": <an Avro record schema>}')
        try:
            schema = parse(doc["schema"])
        except InvalidSchema as exc:
            raise ApiError(400, "invalid_schema", str(exc)) from None
        try:
            registration = await anyio.to_thread.run_sync(self.registry.register, log_type, schema)
        except IncompatibleSchema as exc:
            raise ApiError(
                409, "incompatible_schema", str(exc), extra={"problems": exc.problems[:50]}
            ) from None
        answer = registration.version.to_json(with_schema=False)
        answer["created"] = registration.created
        return _json(answer, 201 if registration.created else 200)

    async def version(self, request: Request) -> Response:
        found = await self._structured(_log_type(request))
        asked = request.path_params["version"]
        if asked == "latest":
            if found.latest is None:
                raise ApiError(404, "unknown_version", f"log type {found.log_type!r} has none")
            return _json(found.latest.to_json())
        if not (asked.isascii() and asked.isdigit()) or len(asked) > 9:  # '²'.isdigit()
            raise ApiError(400, "bad_request", "a version is a positive number or 'latest'")
        try:
            return _json(found.version(int(asked)).to_json())
        except UnknownSchema as exc:
            raise ApiError(404, "unknown_version", str(exc)) from None

    async def set_compatibility(self, request: Request) -> Response:
        log_type = _log_type(request)
        doc = await self._body(request)
        if set(doc) != {"compatibility"}:
            raise ApiError(400, "bad_json", 'the body is {"compatibility": <mode>}')
        try:
            mode = parse_mode(doc["compatibility"])
        except ValueError as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
        found = await anyio.to_thread.run_sync(self.registry.set_compatibility, log_type, mode)
        return _json(_summary(found))

    async def topic_schemas(self, request: Request) -> Response:
        topic = validate_topic_name(request.path_params["topic"])
        log_type = topic.split(".", 1)[1] if "." in topic else ""
        found = None
        if is_valid_log_type(log_type):
            found = await anyio.to_thread.run_sync(
                lambda: self.registry.log_type(log_type, fresh=True)
            )
        if found is None:
            raise ApiError(404, "unknown_log_type", f"topic {topic!r} has no schema")
        return _json(
            {
                "topic": topic,
                "log_type": log_type,
                "compatibility": found.compatibility,
                "versions": [v.to_json() for v in found.versions],
            }
        )


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    limits = ctx.settings.limits
    registry = SchemaRegistry(
        ctx.store,
        max_versions=limits.max_schema_versions,
        max_log_types=limits.max_structured_log_types,
    )
    ctx.extensions[STRUCTURED_WRITES] = StructuredWrites(registry)
    api = SchemasApi(ctx, registry)
    base = "/v1/schemas/{log_type}"
    return [
        route("GET", "/v1/schemas", api.list_log_types, write(lists=True), name="list_schemas"),
        route("GET", base, api.describe, write(log_type="log_type"), name="describe_schemas"),
        route(
            "POST",
            base + "/versions",
            api.register,
            write(log_type="log_type"),
            name="register_schema",
        ),
        route(
            "GET",
            base + "/versions/{version}",
            api.version,
            write(log_type="log_type"),
            name="schema_version",
        ),
        route(
            "PUT",
            base + "/compatibility",
            api.set_compatibility,
            write(log_type="log_type"),
            name="set_compatibility",
        ),
        route(
            "GET",
            "/v1/topics/{topic}/schemas",
            api.topic_schemas,
            read(topic="topic"),
            name="topic_schemas",
        ),
    ]


# -- OpenAPI ----------------------------------------------------------------------------------
def _ok(ref: str, status: str = "200", text: str = "see docs/schemas.md") -> dict[str, Any]:
    return {
        status: {
            "description": text,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
        }
    }


def _op(
    op_id: str,
    summary: str,
    params: list[dict[str, Any]],
    responses: dict[str, Any],
    errors: tuple[str, ...],
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "parameters": params,
        "responses": {**responses, **error_responses(*errors)},
    }
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    log_type = path_param("log_type")
    version = path_param("version")
    topic = path_param("topic")
    unsupported = {"415": {"description": "the body is not application/json"}}
    unsupported["415"]["content"] = error_responses("400")["400"]["content"]
    return {
        "/v1/schemas": {
            "get": _op(
                "list_schemas",
                "Structured log types this token may write",
                [],
                _ok("SchemaLogTypes"),
                ("503",),
            )
        },
        "/v1/schemas/{log_type}": {
            "get": _op(
                "describe_schemas",
                "A structured log type's compatibility mode and versions",
                [log_type],
                _ok("SchemaSummary"),
                ("400", "404", "503"),
            )
        },
        "/v1/schemas/{log_type}/versions": {
            "post": _op(
                "register_schema",
                "Register a schema version (201), or answer the version the same schema has",
                [log_type],
                {
                    **_ok("SchemaRegistered", "201", "a new version"),
                    **_ok("SchemaRegistered", "200", "the schema was registered already"),
                    **unsupported,
                },
                ("400", "409", "413", "503"),
                body={"$ref": "#/components/schemas/SchemaRequest"},
            )
        },
        "/v1/schemas/{log_type}/versions/{version}": {
            "get": _op(
                "schema_version",
                "One version of a log type's schema (a number, or 'latest')",
                [log_type, version],
                _ok("SchemaVersion"),
                ("400", "404", "503"),
            )
        },
        "/v1/schemas/{log_type}/compatibility": {
            "put": _op(
                "set_compatibility",
                "Set the compatibility mode later versions are checked under",
                [log_type],
                {**_ok("SchemaSummary"), **unsupported},
                ("400", "413", "503"),
                body={"$ref": "#/components/schemas/CompatibilityRequest"},
            )
        },
        "/v1/topics/{topic}/schemas": {
            "get": _op(
                "topic_schemas",
                "Every schema version of a structured topic, for its readers",
                [topic],
                _ok("TopicSchemas"),
                ("400", "404", "503"),
            )
        },
    }


def openapi_schemas(ctx: GatewayContext) -> dict[str, Any]:
    version_props: dict[str, Any] = {
        "log_type": {"type": "string"},
        "version": {"type": "integer", "minimum": 1},
        "id": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
        "registered_ms": {"type": "integer"},
    }
    version_required = ["log_type", "version", "id", "registered_ms"]
    mode = {"type": "string", "enum": list(MODES)}
    return {
        "SchemaLogTypes": {
            "type": "object",
            "required": ["log_types"],
            "properties": {"log_types": {"type": "array", "items": {"type": "string"}}},
        },
        "SchemaRequest": {
            "type": "object",
            "required": ["schema"],
            "additionalProperties": False,
            "properties": {
                "schema": {
                    "description": "an Avro record schema, as JSON or as a string of JSON",
                    "oneOf": [OBJECT, {"type": "string"}],
                }
            },
        },
        "CompatibilityRequest": {
            "type": "object",
            "required": ["compatibility"],
            "additionalProperties": False,
            "properties": {"compatibility": mode},
        },
        "SchemaRegistered": {
            "type": "object",
            "required": [*version_required, "created"],
            "properties": {**version_props, "created": {"type": "boolean"}},
        },
        "SchemaVersion": {
            "type": "object",
            "required": [*version_required, "schema"],
            "properties": {**version_props, "schema": OBJECT},
        },
        "SchemaSummary": {
            "type": "object",
            "required": ["log_type", "compatibility", "versions"],
            "properties": {
                "log_type": {"type": "string"},
                "compatibility": mode,
                "versions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": version_required,
                        "properties": version_props,
                    },
                },
            },
        },
        "TopicSchemas": {
            "type": "object",
            "required": ["topic", "log_type", "compatibility", "versions"],
            "properties": {
                "topic": {"type": "string"},
                "log_type": {"type": "string"},
                "compatibility": mode,
                "versions": {
                    "type": "array",
                    "items": {"$ref": "#/components/schemas/SchemaVersion"},
                },
            },
        },
    }
