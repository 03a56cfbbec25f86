"""Consumer groups over HTTP: join, heartbeat, leave, commit, describe (``/v1/groups``).

A group belongs to the token whose join (or commit) created it: every route naming a group
is declared ``read(owns="group")``, so another client's token is refused (403) before the
body is read, and the join or commit that creates a group records its owner inside the same
atomic update that creates it.  State lives in the store (see
:mod:`delivery.consumer_group`), so any worker or gateway serves any member.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from delivery.consumer_group import Subscription, check_subscribed_topics
from delivery.internal_state import Doc, is_internal
from ingest_api.access import (
    Access,
    Owned,
    RouteDeclaration,
    access_of,
    read,
    register_owner_lookup,
    route,
)
from ingest_api.context import GatewayContext
from ingest_api.delivery_parts import delivery_parts
from ingest_api.errors import ApiError
from ingest_api.openapi import OBJECT, operation, path_param
from ingest_api.params import json_int, json_response, refuse_unknown, str_field
from ingest_api.read_api import json_request, readable_topic

_JOIN_FIELDS = frozenset(("topics", "prefix", "reset", "session_timeout_ms"))
_HEARTBEAT_FIELDS = frozenset(("release",))
_COMMIT_FIELDS = frozenset(("member_id", "offsets"))
_OFFSET_FIELDS = frozenset(("topic", "partition", "offset", "topic_id"))


def require_prefix(request: Request, prefix: str | None) -> None:
    """A prefix subscription reads every topic under it: the token must allow all of them.

    A read glob ``P*`` with ``P`` a prefix of ``prefix`` does (``dc1.*`` covers ``dc1.``;
    ``dc1.nginx-*`` does not); ``?`` and ``[...]`` never do, though ``dc1.ap?`` matches the
    literal ``dc1.ap*`` (:meth:`~ingest_api.auth.Authorizer.may_read_prefix`).
    """
    if prefix is not None:
        if is_internal(prefix):
            raise ApiError(
                400,
                "bad_request",
                f"prefix {prefix!r} names only the gateways' internal topics, which no one reads",
            )
        access_of(request).require_read_prefix(prefix)


def _readable_member(access: Access, member: Doc) -> Doc:
    """A join's or heartbeat's answer without the topics the token may not read.

    The prefix check should keep them out of the group; this keeps their names, partitions
    and offsets out of the answer should a group hold one anyway (its owner's grant was
    narrowed, an admin's group)."""
    if access.is_admin:
        return member
    return {
        **member,
        "missing_topics": [t for t in member["missing_topics"] if access.may_read(t)],
        "assignment": [a for a in member["assignment"] if access.may_read(a["topic"])],
        "revoke": [r for r in member["revoke"] if access.may_read(r["topic"])],
    }


class GroupsApi:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self.groups = delivery_parts(ctx).groups
        register_owner_lookup(ctx.extensions, "group", self._owner_of)

    def _owner_of(self, group: str) -> Owned:
        exists, owner = self.groups.owner_of(group)
        return Owned(exists, owner)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    async def join(self, request: Request) -> Response:
        group = request.path_params["group"]
        access = access_of(request)
        body = await json_request(request, self.ctx.settings.limits)
        refuse_unknown(body, _JOIN_FIELDS, "fields")
        topics = body.get("topics") or []
        prefix = body.get("prefix")
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise ApiError(400, "bad_request", "topics must be a list of topic names")
        if prefix is not None and not isinstance(prefix, str):
            raise ApiError(400, "bad_request", "prefix must be a string")
        check_subscribed_topics(topics)
        for topic in topics:
            readable_topic(request, topic)
        subscription = Subscription(tuple(topics), prefix)
        require_prefix(request, prefix)
        timeout_ms = json_int(body, "session_timeout_ms", 10_000, 0, 2**31)
        reset = body.get("reset", "latest")
        if not isinstance(reset, str):
            raise ApiError(400, "bad_request", "reset must be earliest or latest")
        member = await self._run(
            functools.partial(
                self.groups.join,
                group,
                subscription,
                session_timeout_ms=timeout_ms,
                reset=reset,
                owner=access.owner,
                check_owner=not access.is_admin,
            )
        )
        return json_response(_readable_member(access, member.to_json()))

    async def heartbeat(self, request: Request) -> Response:
        group = request.path_params["group"]
        member_id = request.path_params["member"]
        body = await json_request(request, self.ctx.settings.limits)
        refuse_unknown(body, _HEARTBEAT_FIELDS, "fields")
        release = []
        for item in body.get("release") or []:
            if not isinstance(item, dict):
                raise ApiError(400, "bad_request", "release is a list of {topic, partition}")
            release.append((str_field(item, "topic"), json_int(item, "partition", -1, 0, 2**31)))
        member = await self._run(self.groups.heartbeat, group, member_id, release)
        return json_response(_readable_member(access_of(request), member.to_json()))

    async def leave(self, request: Request) -> Response:
        await self._run(
            self.groups.leave, request.path_params["group"], request.path_params["member"]
        )
        return json_response({"left": True})

    async def commit(self, request: Request) -> Response:
        group = request.path_params["group"]
        access = access_of(request)
        body = await json_request(request, self.ctx.settings.limits)
        refuse_unknown(body, _COMMIT_FIELDS, "fields")
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
            refuse_unknown(item, _OFFSET_FIELDS, "fields of an offset")
            topic = readable_topic(request, str_field(item, "topic"))
            if item.get("topic_id") is not None:
                topic_ids[topic] = str_field(item, "topic_id")
            offsets.append(
                (
                    topic,
                    json_int(item, "partition", -1, 0, 2**31),
                    json_int(item, "offset", -1, 0, 2**63 - 1),
                )
            )
        await self._run(
            functools.partial(
                self.groups.commit,
                group,
                member_id,
                offsets,
                topic_ids,
                owner=access.owner,
                check_owner=not access.is_admin,
            )
        )
        return json_response({"committed": len(offsets)})

    async def describe_group(self, request: Request) -> Response:
        """Members, committed offsets and lag of the partitions the token may read."""
        access = access_of(request)
        described = await self._run(self.groups.describe, request.path_params["group"])
        if not access.is_admin:
            partitions = described["partitions"]
            described["partitions"] = [p for p in partitions if access.may_read(p["topic"])]
        return json_response(described)


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    api = GroupsApi(ctx)
    owner = read(owns="group")
    member = "/v1/groups/{group}/members/{member}"
    return [
        route("GET", "/v1/groups/{group}", api.describe_group, owner),
        route("POST", "/v1/groups/{group}/members", api.join, owner, name="join_group"),
        route("POST", member + "/heartbeat", api.heartbeat, owner),
        route("DELETE", member, api.leave, owner, name="leave_group"),
        route("POST", "/v1/groups/{group}/offsets", api.commit, owner, name="commit_offsets"),
    ]


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    group = path_param("group")
    member = path_param("member")
    return {
        "/v1/groups/{group}": {
            "get": operation("describe_group", "Members, committed offsets and lag", params=[group])
        },
        "/v1/groups/{group}/members": {
            "post": operation(
                "join_group",
                "Join a consumer group",
                params=[group],
                body=OBJECT,
                errors=("400", "404", "409", "413", "429"),
            )
        },
        "/v1/groups/{group}/members/{member}/heartbeat": {
            "post": operation(
                "heartbeat",
                "Stay alive, release revoked partitions",
                params=[group, member],
                body=OBJECT,
                errors=("400", "404", "413"),
            )
        },
        "/v1/groups/{group}/members/{member}": {
            "delete": operation("leave_group", "Leave a consumer group", params=[group, member])
        },
        "/v1/groups/{group}/offsets": {
            "post": operation(
                "commit_offsets",
                "Commit positions (owner only)",
                params=[group],
                body=OBJECT,
                errors=("400", "404", "409", "413", "416", "429"),
            )
        },
    }
