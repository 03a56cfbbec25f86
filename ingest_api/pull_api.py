"""Pull reads, consumer groups and push subscriptions over HTTP (``/v1/topics``, ``/v1/fetch``,
``/v1/groups``, ``/v1/subscriptions``), and the replica appends a mirror makes into this
installation (``/v1/replica``); the wire format is in docs/protocol.md.

Every long-poll waits on :class:`~delivery.append_watch.AppendWatch`, woken by appends, and
every store call runs in a worker thread so the event loop keeps serving other requests.
Nothing here keeps per-consumer state in the process: positions travel with the requests and
group state lives in the store, so any worker or gateway can serve any request.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from delivery.append_watch import AppendWatch
from delivery.consumer_group import (
    GroupCoordinator,
    NotPartitionOwner,
    Subscription,
    SubscriptionConflict,
    TopicRecreated,
    UnknownGroup,
    UnknownMember,
)
from delivery.filters import BadFilter, MessageFilter, filter_from_json, parse_filter
from delivery.framing import (
    BINARY_MEDIA_TYPE,
    encode_binary,
    encode_json_multi,
    encode_json_single,
)
from delivery.internal_state import InternalState, is_internal
from delivery.mirror import (
    MirrorGap,
    ReplicaPosition,
    append_replica,
    decode_replica_body,
    ensure_replica_topic,
    replica_position,
    skip_dropped_source,
)
from delivery.partition_reader import (
    DEFAULT_MAX_BYTES,
    PartitionBatch,
    PartitionReader,
    check_max_bytes,
)
from delivery.push import (
    PushDelivery,
    PushSubscription,
    SubscriptionExists,
    UnknownSubscription,
)
from ingest_api.body import read_body
from ingest_api.context import GatewayContext
from ingest_api.errors import ApiError
from log_store.errors import BadRequest, UnknownTopic
from log_store.topic_names import validate_topic_name

MAX_WAIT_MS = 60_000
MAX_FETCH_PARTITIONS = 10_000
_JSON_BODY_LIMIT = 4 * 1024 * 1024
_log = logging.getLogger(__name__)

_ERROR_CODES: tuple[tuple[type[BadRequest], int, str], ...] = (
    (UnknownGroup, 404, "unknown_group"),
    (UnknownMember, 404, "unknown_member"),
    (NotPartitionOwner, 409, "not_owner"),
    (SubscriptionConflict, 409, "subscription_conflict"),
    (TopicRecreated, 409, "topic_recreated"),
    (UnknownSubscription, 404, "unknown_subscription"),
    (SubscriptionExists, 409, "subscription_exists"),
    (BadFilter, 400, "bad_filter"),
)

Handler = Callable[[Request], Awaitable[Response]]


def _translated(handler: Handler) -> Handler:
    """Map delivery's errors to their status codes; the app maps the rest."""

    @functools.wraps(handler)
    async def wrapper(request: Request) -> Response:
        try:
            return await handler(request)
        except BadRequest as exc:
            for kind, status, code in _ERROR_CODES:
                if isinstance(exc, kind):
                    raise ApiError(status, code, str(exc)) from None
            raise

    return wrapper


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _int_param(
    params: Mapping[str, str], name: str, default: int | None, low: int, high: int
) -> int:
    raw = params.get(name)
    if raw is None:
        if default is None:
            raise ApiError(400, "bad_request", f"query parameter {name} is required")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "bad_request", f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ApiError(400, "bad_request", f"{name} must be in {low}..{high}, got {value}")
    return value


def _json_int(raw: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = raw.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, "bad_request", f"{name} must be an integer")
    if not low <= value <= high:
        raise ApiError(400, "bad_request", f"{name} must be in {low}..{high}, got {value}")
    return value


def _str_field(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str):
        raise ApiError(400, "bad_request", f"{name} must be a string")
    return value


def _wants_binary(request: Request, explicit: str | None) -> bool:
    if explicit is not None:
        if explicit not in ("json", "binary"):
            raise ApiError(400, "bad_request", "format must be json or binary")
        return explicit == "binary"
    return BINARY_MEDIA_TYPE in request.headers.get("accept", "")


def _max_bytes(value: int) -> int:
    try:
        return check_max_bytes(value)
    except BadRequest as exc:
        raise ApiError(400, "max_bytes_out_of_range", str(exc)) from None


class PullApi:
    """The read side of the gateway; one per worker process."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.state = InternalState(ctx.store)
        self.reader = PartitionReader(ctx.store)
        self.groups = GroupCoordinator(ctx.store, self.state)
        self.watch = AppendWatch(ctx.store)
        self.push = PushDelivery(ctx.store, self.state, self.watch, self.reader)
        self._read_bytes = ctx.metrics.counter(
            "logbroker_pull_bytes_total", "bytes of message values sent to pull readers"
        )
        self._read_messages = ctx.metrics.counter(
            "logbroker_pull_messages_total", "messages sent to pull readers"
        )
        self._mirror_dropped = ctx.metrics.counter(
            "logbroker_mirror_dropped_offsets_total",
            "source offsets a mirror reported dropped by the source's retention before copying",
        )

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    def _count(self, batches: Sequence[PartitionBatch]) -> None:
        self._read_bytes.inc(sum(b.value_bytes for b in batches))
        self._read_messages.inc(sum(len(b.messages) for b in batches))

    # -- topics ---------------------------------------------------------------------------------
    async def list_topics(self, request: Request) -> Response:
        prefix = request.query_params.get("prefix", "")
        grant = self.ctx.grant(request)
        infos = await self._run(self.store.list_topics)
        topics = [
            {"name": t.name, "partitions": t.config.partitions}
            for t in sorted(infos, key=lambda t: t.name)
            if t.name.startswith(prefix)
            and not is_internal(t.name)
            and self.ctx.auth.may_read(grant, t.name)
        ]
        return _json({"topics": topics})

    async def describe_topic(self, request: Request) -> Response:
        topic = self._topic(request, request.path_params["topic"])
        info = await self._run(self.store.describe_topic, topic)
        return _json(
            {
                "name": info.name,
                "topic_id": info.topic_id,
                "partitions": [
                    {
                        "partition": p.partition,
                        "start_offset": p.start_offset,
                        "end_offset": p.end_offset,
                        "size_bytes": p.size_bytes,
                    }
                    for p in info.partitions
                ],
            }
        )

    def _topic(self, request: Request, name: str) -> str:
        validate_topic_name(name)
        if is_internal(name):
            raise UnknownTopic(f"no topic named {name!r}")
        self.ctx.require_read(request, name)
        return name

    def _require_prefix(self, request: Request, prefix: str | None) -> None:
        """A prefix subscription reads every topic under it: the token must allow all of them.

        ``prefix*`` taken literally matches a token's read glob exactly when that glob covers
        every name starting with ``prefix`` (``dc1.*`` covers ``dc1.``; ``dc1.nginx-*`` does
        not).
        """
        if prefix is not None:
            self.ctx.require_read(request, prefix + "*")

    # -- reads ----------------------------------------------------------------------------------
    async def read_partition(self, request: Request) -> Response:
        """``GET /v1/topics/{topic}/partitions/{partition}/messages``: one partition, long-poll."""
        params = request.query_params
        topic = self._topic(request, request.path_params["topic"])
        partition: int = request.path_params["partition"]
        offset = _int_param(params, "offset", None, 0, 2**63 - 1)
        max_bytes = _max_bytes(_int_param(params, "max_bytes", DEFAULT_MAX_BYTES, -(2**63), 2**63))
        wait_ms = _int_param(params, "wait_ms", 0, 0, MAX_WAIT_MS)
        window = _int_param(params, "txn_window_ms", self.reader.txn_window_ms, 0, 86_400_000)
        raw = params.get("raw", "0") in ("1", "true")
        binary = _wants_binary(request, params.get("format"))
        filt = parse_filter({k: params.getlist(k) for k in params})
        batches = await self._fetch(
            [(topic, partition, offset)], max_bytes, wait_ms, filt, raw, window
        )
        self._count(batches)
        if binary:
            return Response(encode_binary(batches), media_type=BINARY_MEDIA_TYPE)
        return Response(encode_json_single(batches[0]), media_type="application/json")

    async def fetch(self, request: Request) -> Response:
        """``POST /v1/fetch``: several partitions at once, each from its own offset."""
        body = await self._json_body(request)
        parts = body.get("partitions")
        if not isinstance(parts, list) or not parts:
            raise ApiError(400, "bad_request", "partitions must be a non-empty list")
        if len(parts) > MAX_FETCH_PARTITIONS:
            raise ApiError(400, "bad_request", f"at most {MAX_FETCH_PARTITIONS} partitions")
        positions: list[tuple[str, int, int]] = []
        for item in parts:
            if not isinstance(item, dict):
                raise ApiError(400, "bad_request", "each partition is {topic, partition, offset}")
            topic = self._topic(request, _str_field(item, "topic"))
            partition = _json_int(item, "partition", -1, 0, 1_000_000)
            offset = _json_int(item, "offset", -1, 0, 2**63 - 1)
            positions.append((topic, partition, offset))
        max_bytes = body.get("max_bytes", DEFAULT_MAX_BYTES)
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool):
            raise ApiError(400, "bad_request", "max_bytes must be an integer")
        _max_bytes(max_bytes)
        wait_ms = _json_int(body, "wait_ms", 0, 0, MAX_WAIT_MS)
        window = _json_int(body, "txn_window_ms", self.reader.txn_window_ms, 0, 86_400_000)
        raw = body.get("raw", False) is True
        filt = filter_from_json(body.get("filter"))
        binary = _wants_binary(request, body.get("format"))
        batches = await self._fetch(positions, max_bytes, wait_ms, filt, raw, window)
        self._count(batches)
        if binary:
            return Response(encode_binary(batches), media_type=BINARY_MEDIA_TYPE)
        return Response(encode_json_multi(batches), media_type="application/json")

    async def _fetch(
        self,
        positions: Sequence[tuple[str, int, int]],
        max_bytes: int,
        wait_ms: int,
        filt: MessageFilter,
        raw: bool,
        window_ms: int,
    ) -> list[PartitionBatch]:
        deadline = time.monotonic() + wait_ms / 1000
        current = list(positions)
        while True:
            batches: list[PartitionBatch] = await self._run(
                self._read_all, current, max_bytes, filt, raw, window_ms
            )
            remaining = deadline - time.monotonic()
            if any(b.messages for b in batches) or remaining <= 0:
                return batches
            # Filtered-out records were scanned: wait from where the scan ended.
            current = [(b.topic, b.partition, b.next_offset) for b in batches]
            if not await self.watch.wait_any(current, remaining):
                return await self._run(self._read_all, current, max_bytes, filt, raw, window_ms)

    def _read_all(
        self,
        positions: Sequence[tuple[str, int, int]],
        max_bytes: int,
        filt: MessageFilter,
        raw: bool,
        window_ms: int,
    ) -> list[PartitionBatch]:
        # An even share per partition, so a backlog in the first partition listed does not
        # starve the others; each still returns at least one message if it has one.
        share = max(1, max_bytes // len(positions))
        return [
            self.reader.read(
                topic, partition, offset, share, filt, raw=raw, txn_window_ms=window_ms
            )
            for topic, partition, offset in positions
        ]

    async def _json_body(self, request: Request) -> dict[str, Any]:
        raw = await read_body(request, self.ctx.settings.limits, max_bytes=_JSON_BODY_LIMIT)
        try:
            body = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, "bad_json", f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "bad_json", "the body must be a JSON object")
        return body

    # -- consumer groups ------------------------------------------------------------------------
    async def join(self, request: Request) -> Response:
        group = request.path_params["group"]
        body = await self._json_body(request)
        topics = body.get("topics") or []
        prefix = body.get("prefix")
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise ApiError(400, "bad_request", "topics must be a list of topic names")
        if prefix is not None and not isinstance(prefix, str):
            raise ApiError(400, "bad_request", "prefix must be a string")
        for topic in topics:
            self._topic(request, topic)
        subscription = Subscription(tuple(topics), prefix)
        self._require_prefix(request, prefix)
        timeout_ms = _json_int(body, "session_timeout_ms", 10_000, 0, 2**31)
        reset = body.get("reset", "latest")
        if not isinstance(reset, str):
            raise ApiError(400, "bad_request", "reset must be earliest or latest")
        member = await self._run(
            functools.partial(
                self.groups.join, group, subscription, session_timeout_ms=timeout_ms, reset=reset
            )
        )
        return _json(member.to_json())

    async def heartbeat(self, request: Request) -> Response:
        group = request.path_params["group"]
        member_id = request.path_params["member"]
        body = await self._json_body(request)
        release = []
        for item in body.get("release") or []:
            if not isinstance(item, dict):
                raise ApiError(400, "bad_request", "release is a list of {topic, partition}")
            release.append((str(item.get("topic")), _json_int(item, "partition", -1, 0, 2**31)))
        member = await self._run(self.groups.heartbeat, group, member_id, release)
        return _json(member.to_json())

    async def leave(self, request: Request) -> Response:
        await self._run(
            self.groups.leave, request.path_params["group"], request.path_params["member"]
        )
        return _json({"left": True})

    async def commit(self, request: Request) -> Response:
        group = request.path_params["group"]
        body = await self._json_body(request)
        member_id = body.get("member_id")
        if member_id is not None and not isinstance(member_id, str):
            raise ApiError(400, "bad_request", "member_id must be a string")
        items = body.get("offsets")
        if not isinstance(items, list) or not items:
            raise ApiError(400, "bad_request", "offsets must be a non-empty list")
        offsets = []
        topic_ids: dict[str, str] = {}
        for item in items:
            if not isinstance(item, dict):
                raise ApiError(400, "bad_request", "each offset is {topic, partition, offset}")
            topic = self._topic(request, _str_field(item, "topic"))
            if item.get("topic_id") is not None:
                topic_ids[topic] = _str_field(item, "topic_id")
            offsets.append(
                (
                    topic,
                    _json_int(item, "partition", -1, 0, 2**31),
                    _json_int(item, "offset", -1, 0, 2**63 - 1),
                )
            )
        await self._run(self.groups.commit, group, member_id, offsets, topic_ids)
        return _json({"committed": len(offsets)})

    async def describe_group(self, request: Request) -> Response:
        return _json(await self._run(self.groups.describe, request.path_params["group"]))

    # -- push subscriptions ---------------------------------------------------------------------
    async def create_subscription(self, request: Request) -> Response:
        body = await self._json_body(request)
        sub = PushSubscription.from_json(body)
        for topic in sub.topics:
            self._topic(request, topic)
        self._require_prefix(request, sub.prefix)
        created = await self._run(self.push.registry.create, sub)
        self.push.poke()
        return _json({"subscription": sub.to_json(), "created": created}, 201 if created else 200)

    async def list_subscriptions(self, request: Request) -> Response:
        subs = await self._run(self.push.registry.list)
        return _json({"subscriptions": [s.to_json() for s in subs]})

    async def subscription_status(self, request: Request) -> Response:
        return _json(await self._run(self.push.registry.status, request.path_params["name"]))

    async def delete_subscription(self, request: Request) -> Response:
        await self._run(self.push.registry.delete, request.path_params["name"])
        self.push.poke()
        return _json({"deleted": True})

    # -- replica appends (the destination side of `logbroker mirror`) ----------------------------
    def _replica_target(self, request: Request) -> tuple[str, int, str]:
        topic = validate_topic_name(request.path_params["topic"])
        if is_internal(topic):
            raise ApiError(400, "bad_request", "internal topics are not mirrored")
        self.ctx.require_write(request, topic.split(".", 1)[-1])
        source = request.query_params.get("source", "")
        if not source or len(source) > 200:
            raise ApiError(400, "bad_request", "source (the source topic's id) is required")
        return topic, request.path_params["partition"], source

    async def replica_position(self, request: Request) -> Response:
        """Where a mirror of ``source`` resumes: the next source offset this partition wants."""
        topic, partition, source = self._replica_target(request)
        position = await self._run(replica_position, self.store, topic, partition, source)
        return _json(_position_json(position))

    async def replica_append(self, request: Request) -> Response:
        """Append mirrored records exactly once (409 with the expected offset otherwise)."""
        topic, partition, source = self._replica_target(request)
        params = request.query_params
        partitions = _replica_partitions(params, partition)
        start = _int_param(params, "start", None, 0, 2**63 - 1)
        body = await read_body(request, self.ctx.settings.limits)
        try:
            records = decode_replica_body(body)
        except BadRequest as exc:
            raise ApiError(400, "bad_framing", str(exc)) from None
        try:
            next_offset = await self._run(
                self._append_replica, topic, partition, partitions, source, records, start
            )
        except MirrorGap as exc:
            raise ApiError(
                409, "mirror_gap", str(exc), extra={"expected_source_offset": exc.expected}
            ) from None
        return _json({"next_source_offset": next_offset, "appended": len(records)})

    def _append_replica(
        self,
        topic: str,
        partition: int,
        partitions: int,
        source: str,
        records: list[tuple[int, bytes]],
        start: int,
    ) -> int:
        ensure_replica_topic(self.store, topic, partitions)
        return append_replica(self.store, topic, partition, source, records, start)

    async def replica_dropped(self, request: Request) -> Response:
        """The source's retention dropped offsets below ``to`` before they were copied."""
        topic, partition, source = self._replica_target(request)
        params = request.query_params
        partitions = _replica_partitions(params, partition)
        dropped_from = _int_param(params, "from", None, 0, 2**63 - 1)
        to = _int_param(params, "to", None, 0, 2**63 - 1)
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
        return _json({**_position_json(after), "skipped": skipped})

    def _skip_dropped(
        self, topic: str, partition: int, partitions: int, source: str, first: int, to: int
    ) -> tuple[ReplicaPosition, int]:
        # The first word about a source may be that its start was dropped: no copy exists yet.
        ensure_replica_topic(self.store, topic, partitions)
        return skip_dropped_source(self.store, topic, partition, source, first, to)


def _position_json(position: ReplicaPosition) -> dict[str, Any]:
    return {
        "next_source_offset": position.next_source_offset,
        "next_dest_offset": position.next_dest_offset,
        "dropped_offsets": position.dropped_offsets,
        "gaps": [list(g) for g in position.gaps],
    }


def routes(ctx: GatewayContext) -> list[BaseRoute]:
    api = PullApi(ctx)
    ctx.extensions[__name__] = api
    return [
        Route("/v1/topics", _translated(api.list_topics), methods=["GET"], name="list_topics"),
        Route(
            "/v1/topics/{topic}",
            _translated(api.describe_topic),
            methods=["GET"],
            name="describe_topic",
        ),
        Route(
            "/v1/topics/{topic}/partitions/{partition:int}/messages",
            _translated(api.read_partition),
            methods=["GET"],
            name="read_partition",
        ),
        Route("/v1/fetch", _translated(api.fetch), methods=["POST"], name="fetch"),
        Route(
            "/v1/groups/{group}",
            _translated(api.describe_group),
            methods=["GET"],
            name="describe_group",
        ),
        Route(
            "/v1/groups/{group}/members", _translated(api.join), methods=["POST"], name="join_group"
        ),
        Route(
            "/v1/groups/{group}/members/{member}/heartbeat",
            _translated(api.heartbeat),
            methods=["POST"],
            name="heartbeat",
        ),
        Route(
            "/v1/groups/{group}/members/{member}",
            _translated(api.leave),
            methods=["DELETE"],
            name="leave_group",
        ),
        Route(
            "/v1/groups/{group}/offsets",
            _translated(api.commit),
            methods=["POST"],
            name="commit_offsets",
        ),
        Route(
            "/v1/replica/{topic}/partitions/{partition:int}",
            _translated(api.replica_position),
            methods=["GET"],
            name="replica_position",
        ),
        Route(
            "/v1/replica/{topic}/partitions/{partition:int}",
            _translated(api.replica_append),
            methods=["POST"],
            name="replica_append",
        ),
        Route(
            "/v1/replica/{topic}/partitions/{partition:int}/dropped",
            _translated(api.replica_dropped),
            methods=["POST"],
            name="replica_dropped",
        ),
        Route(
            "/v1/subscriptions",
            _translated(api.create_subscription),
            methods=["POST"],
            name="create_subscription",
        ),
        Route(
            "/v1/subscriptions",
            _translated(api.list_subscriptions),
            methods=["GET"],
            name="list_subscriptions",
        ),
        Route(
            "/v1/subscriptions/{name}",
            _translated(api.subscription_status),
            methods=["GET"],
            name="subscription_status",
        ),
        Route(
            "/v1/subscriptions/{name}",
            _translated(api.delete_subscription),
            methods=["DELETE"],
            name="delete_subscription",
        ),
    ]


async def on_startup(ctx: GatewayContext) -> None:
    api: PullApi = ctx.extensions[__name__]
    await api.push.start()


async def on_shutdown(ctx: GatewayContext) -> None:
    api: PullApi = ctx.extensions[__name__]
    await api.push.stop()
    api.watch.close()


# -- OpenAPI ------------------------------------------------------------------------------------
_OBJECT: dict[str, Any] = {"type": "object"}


def _error_responses(*statuses: str) -> dict[str, Any]:
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    texts = {
        "400": "bad input; nothing changed",
        "401": "missing or unknown bearer token",
        "403": "the token may not read this topic",
        "404": "unknown topic, partition, group, member or subscription",
        "409": "conflict (not the owner, another subscription, a mirror gap)",
        "413": "body over the limit",
        "416": "offset out of range; the body has start_offset and end_offset",
        "503": "the log store is unavailable",
    }
    return {s: {"description": texts[s], "content": ref} for s in statuses}


def _op(
    op_id: str,
    summary: str,
    *,
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    ok: str = "200",
    ok_media: dict[str, Any] | None = None,
    errors: tuple[str, ...] = ("400", "404"),
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "responses": {
            ok: {
                "description": "see docs/protocol.md",
                "content": ok_media or {"application/json": {"schema": _OBJECT}},
            },
            **_error_responses(*errors),
        },
    }
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def _path_param(name: str, kind: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": kind}}


def _query(name: str, kind: str = "integer", required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": {"type": kind}}


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    topic = _path_param("topic")
    partition = _path_param("partition", "integer")
    group = _path_param("group")
    member = _path_param("member")
    name = _path_param("name")
    read_media = {
        "application/json": {"schema": _OBJECT},
        BINARY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
    }
    filters = [
        _query("source_id", "string"),
        _query("server", "string"),
        _query("file", "string"),
        _query("log_type", "string"),
        _query("hash_key", "string"),
        _query("hash_mod"),
        _query("hash_rem"),
    ]
    return {
        "/v1/topics": {
            "get": _op(
                "list_topics",
                "Topics, optionally by DC prefix",
                params=[_query("prefix", "string")],
                errors=(),
            )
        },
        "/v1/topics/{topic}": {
            "get": _op("describe_topic", "A topic's partitions and offsets", params=[topic])
        },
        "/v1/topics/{topic}/partitions/{partition}/messages": {
            "get": _op(
                "read_partition",
                "Long-poll read of one partition from an offset",
                params=[
                    topic,
                    partition,
                    _query("offset", required=True),
                    _query("max_bytes"),
                    _query("wait_ms"),
                    _query("txn_window_ms"),
                    _query("format", "string"),
                    _query("raw", "string"),
                    *filters,
                ],
                ok_media=read_media,
                errors=("400", "404", "416"),
            )
        },
        "/v1/fetch": {
            "post": _op(
                "fetch",
                "Long-poll read of several partitions, each from its offset",
                body={
                    "type": "object",
                    "required": ["partitions"],
                    "properties": {
                        "partitions": {"type": "array", "items": _OBJECT},
                        "max_bytes": {"type": "integer"},
                        "wait_ms": {"type": "integer"},
                        "format": {"type": "string", "enum": ["json", "binary"]},
                        "filter": _OBJECT,
                        "raw": {"type": "boolean"},
                        "txn_window_ms": {"type": "integer"},
                    },
                },
                ok_media=read_media,
                errors=("400", "404", "413", "416"),
            )
        },
        "/v1/groups/{group}": {
            "get": _op("describe_group", "Members, committed offsets and lag", params=[group])
        },
        "/v1/groups/{group}/members": {
            "post": _op(
                "join_group",
                "Join a consumer group",
                params=[group],
                body=_OBJECT,
                errors=("400", "404", "409", "413"),
            )
        },
        "/v1/groups/{group}/members/{member}/heartbeat": {
            "post": _op(
                "heartbeat",
                "Stay alive, release revoked partitions",
                params=[group, member],
                body=_OBJECT,
                errors=("400", "404", "413"),
            )
        },
        "/v1/groups/{group}/members/{member}": {
            "delete": _op("leave_group", "Leave a consumer group", params=[group, member])
        },
        "/v1/groups/{group}/offsets": {
            "post": _op(
                "commit_offsets",
                "Commit positions (owner only)",
                params=[group],
                body=_OBJECT,
                errors=("400", "404", "409", "413", "416"),
            )
        },
        "/v1/subscriptions": {
            "get": _op("list_subscriptions", "Push subscriptions", errors=()),
            "post": _op(
                "create_subscription",
                "Create a push subscription",
                body=_OBJECT,
                ok="201",
                errors=("400", "404", "409", "413"),
            ),
        },
        "/v1/subscriptions/{name}": {
            "get": _op("subscription_status", "Positions, lag and last error", params=[name]),
            "delete": _op("delete_subscription", "Delete a push subscription", params=[name]),
        },
        "/v1/replica/{topic}/partitions/{partition}": {
            "get": _op(
                "replica_position",
                "Where a mirror resumes",
                params=[topic, partition, _query("source", "string", True)],
            ),
            "post": {
                **_op(
                    "replica_append",
                    "Append mirrored records exactly once",
                    params=[
                        topic,
                        partition,
                        _query("source", "string", True),
                        _query("partitions", "integer", True),
                        _query("start", "integer", True),
                    ],
                    errors=("400", "404", "409", "413"),
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
            "post": _op(
                "replica_dropped",
                "Skip source offsets dropped by retention before they were copied",
                params=[
                    topic,
                    partition,
                    _query("source", "string", True),
                    _query("partitions", "integer", True),
                    _query("from", "integer", True),
                    _query("to", "integer", True),
                ],
            )
        },
    }


def _replica_partitions(params: Mapping[str, str], partition: int) -> int:
    """The source topic's partition count a replica call names; ``partition`` must be in it."""
    partitions = _int_param(params, "partitions", None, 1, 100_000)
    if partition >= partitions:
        raise ApiError(400, "bad_request", f"partition {partition} >= partitions {partitions}")
    return partitions
