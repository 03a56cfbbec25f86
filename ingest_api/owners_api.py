"""Where each partition of a topic is written: its owner gateway's URL, for clients.

=========================================  ======================================================
``GET /v1/topics/{topic}/owners``          ``read(topic)``: for readers and operators
``GET /v1/owners?log_type=T``              ``write(log_type)``: for push-clients, which name log
                                           types, not topics (the topic is ``<dc>.<log_type>``)
=========================================  ======================================================

Both answer ``{"topic", "gateway", "partitions": [{"partition", "owner"}, ...]}``: ``gateway``
is the answering gateway's own URL, ``owner`` the URL the partition's owner announced (in
``__<ns>logbroker-owners``), or ``null`` while it has none (a rebalance, ``on_demand``
ownership: any gateway writes there).  On the embedded store every partition's owner is the
answering gateway itself.

The answer is a hint, like the owners' map it is read from: a client that sends a source's
sections to the owner saves the receiving gateway's forward, and a stale entry costs at worst
that forward again (any gateway accepts any write); fencing, not this map, decides who writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from delivery.internal_state import is_internal
from ingest_api.access import RouteDeclaration, read, route, write
from ingest_api.context import GatewayContext
from ingest_api.errors import ApiError
from ingest_api.openapi import operation, path_param, query_param
from ingest_api.params import json_response
from ingest_api.read_api import readable_topic
from log_store.errors import UnknownTopic
from log_store.kafka.gateway_group import GatewayGroup
from log_store.kafka.owner_directory import OwnerDirectory
from log_store.kafka.store import KafkaLogStore
from log_store.topic_names import LOG_TYPE_RULE, is_valid_log_type

FORWARDED_HEADER = "Logbroker-Forwarded"
"""On a write answer: how many sections this gateway wrote through another gateway."""


class PartitionOwners:
    """Answers which gateway owns each partition of a topic (one per worker process)."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self.self_url = ctx.settings.url
        self._directory = owner_directory(ctx)
        self._embedded = ctx.settings.store != "kafka"

    def owners_of(self, topic: str) -> dict[str, Any]:
        """Blocking: the topic's partitions and their owners' URLs (404 for an unknown topic)."""
        info = self.ctx.store.describe_topic(topic)
        announced = {} if self._directory is None else self._directory.snapshot()
        partitions = []
        for part in info.partitions:
            owner = self.self_url if self._embedded else announced.get((topic, part.partition))
            partitions.append({"partition": part.partition, "owner": owner})
        return {"topic": topic, "gateway": self.self_url, "partitions": partitions}

    async def topic_owners(self, request: Request) -> Response:
        """``GET /v1/topics/{topic}/owners``."""
        topic = readable_topic(request, request.path_params["topic"])
        return json_response(await anyio.to_thread.run_sync(self.owners_of, topic))

    async def log_type_owners(self, request: Request) -> Response:
        """``GET /v1/owners?log_type=T``: the owners of the topic that log type is written to."""
        log_type = request.query_params.get("log_type")
        if log_type is None:
            raise ApiError(400, "bad_request", "log_type is required (?log_type=...)")
        if not is_valid_log_type(log_type):
            raise ApiError(400, "bad_request", f"log_type {log_type[:60]!r}: use {LOG_TYPE_RULE}")
        topic = self.ctx.topic_for(log_type)
        if is_internal(topic):
            raise UnknownTopic(f"no topic named {topic!r}")
        return json_response(await anyio.to_thread.run_sync(self.owners_of, topic))


def owned_here(ctx: GatewayContext) -> Callable[[str, int], bool] | None:
    """Whether this gateway owns a partition now (None: there is no gateways' group, it
    writes every partition itself)."""
    store = ctx.store
    if isinstance(store, KafkaLogStore) and isinstance(store.placement, GatewayGroup):
        return store.placement.owns
    return None


def owner_directory(ctx: GatewayContext) -> OwnerDirectory | None:
    """The Kafka gateways' group's owners map, or None without one."""
    store = ctx.store
    if isinstance(store, KafkaLogStore) and isinstance(store.placement, GatewayGroup):
        return store.placement.directory
    return None


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    api = PartitionOwners(ctx)
    return [
        route("GET", "/v1/topics/{topic}/owners", api.topic_owners, read(topic="topic")),
        route(
            "GET",
            "/v1/owners",
            api.log_type_owners,
            write(log_type="log_type"),
            query=("log_type",),
        ),
    ]


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    return {
        "/v1/topics/{topic}/owners": {
            "get": operation(
                "topic_owners",
                "Each partition's owner gateway URL (null: none announced now)",
                params=[path_param("topic")],
            )
        },
        "/v1/owners": {
            "get": operation(
                "log_type_owners",
                "The owners of the topic a log type is written to, for push-clients",
                params=[query_param("log_type", "string", required=True)],
            )
        },
    }
