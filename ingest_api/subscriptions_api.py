"""Push subscriptions over HTTP (``/v1/subscriptions``), and the push delivery they start.

A subscription belongs to the token that created it: the routes naming one are declared
``read(owns="subscription")``, the list shows only the token's own, and each token holds at
most ``max_subscriptions_per_token``.  Its endpoint must be an address push delivery may
reach (public, or in ``push_allow``; see :mod:`delivery.push_targets`), checked here when it
is created and again on every connection delivery makes.  The owner's read grant is checked
again while delivering (:class:`~ingest_api.delivery_parts.TokenGrants`): a topic it may no
longer read is suspended, shown in the subscription's status (``suspended``), the gateway's
log and ``logbroker_push_suspended_topics``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from delivery.consumer_group import check_subscribed_topics
from delivery.push import PushSubscription
from delivery.push_targets import TargetRefused
from ingest_api.access import (
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
from ingest_api.groups_api import require_prefix
from ingest_api.openapi import OBJECT, operation, path_param
from ingest_api.params import json_filter, json_response
from ingest_api.read_api import json_request, readable_topic


class SubscriptionsApi:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self.push = delivery_parts(ctx).push
        self.registry = self.push.registry
        register_owner_lookup(ctx.extensions, "subscription", self._owner_of)
        self._refused = ctx.metrics.counter(
            "logbroker_push_targets_refused_total",
            "subscriptions refused because their endpoint is not an allowed address",
        )
        push = self.push
        ctx.metrics.gauge(
            "logbroker_push_suspended_topics",
            "topics push delivery holds back because the subscription's owner may not read "
            "them now (token removed, read grant narrowed)",
            read=lambda: float(push.suspended_topics()),
        )

    def _owner_of(self, name: str) -> Owned:
        exists, owner = self.registry.owner_of(name)
        return Owned(exists, owner)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    async def create_subscription(self, request: Request) -> Response:
        access = access_of(request)
        body = await json_request(request, self.ctx.settings.limits)
        json_filter(body.get("filter"))  # its integers are JSON integers, not strings
        sub = PushSubscription.from_json(body)
        check_subscribed_topics(sub.topics)
        for topic in sub.topics:
            readable_topic(request, topic)
        require_prefix(request, sub.prefix)
        try:
            await self.push.targets.check_url(sub.endpoint)
        except TargetRefused as exc:
            self._refused.inc()
            raise ApiError(400, "endpoint_refused", str(exc)) from None
        created = await self._run(self.registry.create, sub, access.owner)
        self.push.poke()
        return json_response(
            {"subscription": sub.to_json(), "created": created}, 201 if created else 200
        )

    async def list_subscriptions(self, request: Request) -> Response:
        access = access_of(request)
        owned = await self._run(self.registry.list_owned)
        return json_response(
            {"subscriptions": [sub.to_json() for sub, owner in owned if access.owns(owner)]}
        )

    async def subscription_status(self, request: Request) -> Response:
        return json_response(
            await self._run(self.registry.status, request.path_params["subscription"])
        )

    async def delete_subscription(self, request: Request) -> Response:
        await self._run(self.registry.delete, request.path_params["subscription"])
        self.push.poke()
        return json_response({"deleted": True})


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    api = SubscriptionsApi(ctx)
    owner = read(owns="subscription")
    return [
        route("POST", "/v1/subscriptions", api.create_subscription, read()),
        route("GET", "/v1/subscriptions", api.list_subscriptions, read(lists=True)),
        route("GET", "/v1/subscriptions/{subscription}", api.subscription_status, owner),
        route("DELETE", "/v1/subscriptions/{subscription}", api.delete_subscription, owner),
    ]


async def on_startup(ctx: GatewayContext) -> None:
    await delivery_parts(ctx).push.start()


async def on_shutdown(ctx: GatewayContext) -> None:
    parts = delivery_parts(ctx)
    await parts.push.stop()
    parts.watch.close()


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    name = path_param("subscription")
    return {
        "/v1/subscriptions": {
            "get": operation("list_subscriptions", "This token's push subscriptions", errors=()),
            "post": operation(
                "create_subscription",
                "Create a push subscription",
                body=OBJECT,
                ok="201",
                errors=("400", "404", "409", "413", "429"),
            ),
        },
        "/v1/subscriptions/{subscription}": {
            "get": operation("subscription_status", "Positions, lag and last error", params=[name]),
            "delete": operation("delete_subscription", "Delete a push subscription", params=[name]),
        },
    }
