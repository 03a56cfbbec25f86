"""The destination side of ``logbroker mirror`` (``/v1/replica``): exactly-once appends of
another installation's records, as stored.

These routes need the ``replicate`` permission for the topic in the path, which no write or
read grant implies: a token that may write log type ``app`` cannot append raw records to
``anydc.app``.  Every record must be an envelope a gateway writes into that topic (see
:func:`delivery.mirror.check_replica_records`), and the topic is created or grown through the
same :class:`~log_store.topic_quota.TopicQuota` as any other (``max_topics``,
``max_partitions_per_topic``).

A topic of the gateway's own DC (``<dc>.*``) is refused (409 ``own_dc_topic``, nothing
written or read): its own push-clients write it, and mirrored records would be mixed into
it, or, copied back from an installation that mirrors it, would come round again for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from delivery.framing import BINARY_MEDIA_TYPE
from delivery.internal_state import is_internal
from delivery.mirror import (
    MirrorGap,
    ReplicaPosition,
    append_replica,
    check_replica_records,
    decode_replica_body,
    replica_position,
    skip_dropped_source,
)
from ingest_api.access import REPLICATE, RouteDeclaration, route
from ingest_api.body import read_body
from ingest_api.context import GatewayContext
from ingest_api.errors import ApiError
from ingest_api.openapi import operation, path_param, query_param
from ingest_api.params import int_param, json_response
from log_store.errors import BadRequest
from log_store.topic_names import validate_topic_name

_log = logging.getLogger(__name__)


def _position_json(position: ReplicaPosition) -> dict[str, Any]:
    return {
        "next_source_offset": position.next_source_offset,
        "next_dest_offset": position.next_dest_offset,
        "dropped_offsets": position.dropped_offsets,
        "gaps": [list(g) for g in position.gaps],
        "audit": {str(w): c for w, c in (position.audit or {}).items()},
    }


class ReplicaApi:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.quota = ctx.topic_quota
        self._mirror_dropped = ctx.metrics.counter(
            "logbroker_mirror_dropped_offsets_total",
            "source offsets a mirror reported dropped by the source's retention before copying",
        )

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    def _target(self, request: Request) -> tuple[str, int, str]:
        topic = validate_topic_name(request.path_params["topic"])
        if is_internal(topic):
            raise ApiError(400, "bad_request", "internal topics are not mirrored")
        source = request.query_params.get("source", "")
        if not source:
            raise ApiError(400, "bad_request", "source (the source topic's id) is required")
        # It is a state key and named in the gateway's log: no control characters.
        if len(source) > 200 or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in source):
            raise ApiError(
                400, "bad_request", "source must be 1-200 characters, no control characters"
            )
        dc = self.ctx.settings.dc
        if topic.startswith(dc + "."):
            raise ApiError(
                409,
                "own_dc_topic",
                f"{topic} is a topic of this installation's own DC ({dc}): its gateways write "
                "it, so a mirror may not append copies to it; mirror it into an installation "
                "of another DC",
            )
        return topic, request.path_params["partition"], source

    def _partitions(self, params: Mapping[str, str], partition: int) -> int:
        """The source topic's partition count a call names; ``partition`` must be in it."""
        partitions = int_param(params, "partitions", None, 1, 2**31)
        self.quota.check_partitions(partitions)
        if partition >= partitions:
            raise ApiError(400, "bad_request", f"partition {partition} >= partitions {partitions}")
        return partitions

    async def replica_position(self, request: Request) -> Response:
        """Where a mirror of ``source`` resumes: the next source offset this partition wants."""
        topic, partition, source = self._target(request)
        position = await self._run(replica_position, self.store, topic, partition, source)
        return json_response(_position_json(position))

    async def replica_append(self, request: Request) -> Response:
        """Append mirrored records exactly once (409 with the expected offset otherwise)."""
        topic, partition, source = self._target(request)
        params = request.query_params
        partitions = self._partitions(params, partition)
        start = int_param(params, "start", None, 0, 2**63 - 1)
        limits = self.ctx.settings.limits
        body = await read_body(request, limits)
        try:
            records = decode_replica_body(body)
        except BadRequest as exc:
            raise ApiError(400, "bad_framing", str(exc)) from None
        try:
            check_replica_records(topic, records, limits.max_chunk_bytes)
        except BadRequest as exc:
            raise ApiError(400, "bad_replica_record", str(exc)) from None
        try:
            next_offset, audit = await self._run(
                self._append, topic, partition, partitions, source, records, start
            )
        except MirrorGap as exc:
            raise ApiError(
                409, "mirror_gap", str(exc), extra={"expected_source_offset": exc.expected}
            ) from None
        return json_response(
            {
                "next_source_offset": next_offset,
                "appended": len(records),
                "audit": {str(w): c for w, c in audit.items()},
            }
        )

    def _append(
        self,
        topic: str,
        partition: int,
        partitions: int,
        source: str,
        records: list[tuple[int, bytes]],
        start: int,
    ) -> tuple[int, dict[int, list[int]]]:
        self.quota.ensure(topic, partitions)
        return append_replica(self.store, topic, partition, source, records, start)

    async def replica_dropped(self, request: Request) -> Response:
        """The source's retention dropped offsets below ``to`` before they were copied."""
        topic, partition, source = self._target(request)
        params = request.query_params
        partitions = self._partitions(params, partition)
        dropped_from = int_param(params, "from", None, 0, 2**63 - 1)
        to = int_param(params, "to", None, 0, 2**63 - 1)
        if dropped_from > to:
            raise ApiError(400, "bad_request", f"from {dropped_from} is past to {to}")
        after, skipped = await self._run(
            self._skip_dropped, topic, partition, partitions, source, dropped_from, to
        )
        if skipped:
            self._mirror_dropped.inc(skipped)
            _log.warning(
                "%s/%d: a mirror reports source offsets below %d dropped before they were "
                "copied (%d messages of source %s lost)",
                topic,
                partition,
                to,
                skipped,
                source,
            )
        return json_response({**_position_json(after), "skipped": skipped})

    def _skip_dropped(
        self, topic: str, partition: int, partitions: int, source: str, first: int, to: int
    ) -> tuple[ReplicaPosition, int]:
        # The first word about a source may be that its start was dropped: no copy exists yet.
        self.quota.ensure(topic, partitions)
        return skip_dropped_source(self.store, topic, partition, source, first, to)


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    api = ReplicaApi(ctx)
    partition = "/v1/replica/{topic}/partitions/{partition:int}"
    return [
        route("GET", partition, api.replica_position, REPLICATE, query=("source",)),
        route(
            "POST",
            partition,
            api.replica_append,
            REPLICATE,
            query=("source", "partitions", "start"),
        ),
        route(
            "POST",
            partition + "/dropped",
            api.replica_dropped,
            REPLICATE,
            query=("source", "partitions", "from", "to"),
        ),
    ]


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    topic = path_param("topic")
    partition = path_param("partition", "integer")
    source = query_param("source", "string", True)
    partitions = query_param("partitions", "integer", True)
    return {
        "/v1/replica/{topic}/partitions/{partition}": {
            "get": operation(
                "replica_position",
                "Where a mirror resumes",
                params=[topic, partition, source],
                errors=("400", "404", "409"),
            ),
            "post": {
                **operation(
                    "replica_append",
                    "Append mirrored records exactly once",
                    params=[
                        topic,
                        partition,
                        source,
                        partitions,
                        query_param("start", "integer", True),
                    ],
                    errors=("400", "404", "409", "413", "429"),
                ),
                "requestBody": {
                    "required": True,
                    "content": {
                        BINARY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}
                    },
                },
            },
        },
        "/v1/replica/{topic}/partitions/{partition}/dropped": {
            "post": operation(
                "replica_dropped",
                "Skip source offsets dropped by retention before they were copied",
                params=[
                    topic,
                    partition,
                    source,
                    partitions,
                    query_param("from", "integer", True),
                    query_param("to", "integer", True),
                ],
                errors=("400", "404", "409", "429"),
            )
        },
    }
