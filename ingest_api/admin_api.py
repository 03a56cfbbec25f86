"""Operational endpoints: ``/healthz``, ``/readyz``, ``/metrics`` (Prometheus text),
``/openapi.json``.

``/healthz`` says the gateway process answers (liveness: restart it if not); on Kafka it
names the process (``instance``, the id its ownership claims carry).  ``installation`` names
the log behind the gateway, the same at every gateway of it (a digest of
:meth:`~log_store.interface.LogStore.installation_id`: it tells whether two URLs reach one
installation, nothing about the installation); ``logbroker mirror`` compares its two ends'.
It is null while the store has not said it yet (Kafka away since the gateway started): asked
again in the background, never waited for.  ``/readyz`` says
whether it can take writes now: the embedded store's data dir is writable and not full, or
Kafka answers; 503 with the reason otherwise.  The push-client's prober of a failed-over
installation asks ``/readyz``, so a DC whose Kafka is still away is not taken back.  A
damaged partition of the embedded store leaves the gateway ready (the others take writes);
``damaged_partitions`` then counts them, and names each with its reason only for a caller
whose bearer token has ``metrics`` or ``admin``, or when no tokens are configured: the route
is public, and topic names and the reasons are tenants' business.

``/metrics`` needs a token with ``metrics = true`` when tokens are configured (metric labels
name every topic, which a tenant may not know of), unless ``metrics_require_token = false``
makes it public; without tokens everything is public.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import threading
import time
from typing import Any

import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import Response

from ingest_api.access import METRICS, PUBLIC, RouteDeclaration, route
from ingest_api.auth import Authorizer
from ingest_api.context import GatewayContext
from ingest_api.errors import RETRY_AFTER_S, ApiError, error_response
from ingest_api.metrics import MetricsRegistry
from ingest_api.openapi import build_openapi
from log_store.errors import LogbrokerError
from log_store.interface import DamageReport, LogStore

_log = logging.getLogger(__name__)


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    from ingest_api.owners_api import owner_directory

    openapi_doc: list[bytes] = []
    alive: dict[str, str] = {"status": "ok", "dc": ctx.settings.dc}
    directory = owner_directory(ctx)
    if directory is not None:
        # the id its ownership claims carry: a gateway starting with this one's URL by
        # mistake finds another gateway there (see ops.advertised_url)
        alive["instance"] = directory.instance
    installation = _InstallationId(ctx.store)
    alive_body: list[bytes] = []

    async def healthz(request: Request) -> Response:
        if alive_body:
            return Response(alive_body[0], media_type="application/json")
        digest = installation.known()
        body = orjson.dumps({**alive, "installation": digest})
        if digest is not None:
            alive_body.append(body)
        return Response(body, media_type="application/json")

    readiness = _Readiness(ctx)

    async def readyz(request: Request) -> Response:
        reason = await readiness.look()
        if reason is not None:
            return error_response(
                503, "not_ready", reason, headers={"Retry-After": str(RETRY_AFTER_S)}
            )
        ready: dict[str, Any] = {"status": "ready", "dc": ctx.settings.dc}
        if isinstance(ctx.store, DamageReport):
            # Ready all the same: the other partitions take writes (a balancer must not take
            # the gateway out for one partition), but an operator reads which one cannot.
            damaged = ctx.store.damaged_partitions()
            if damaged and _may_see_details(ctx.auth, request):
                ready["damaged_partitions"] = [
                    {"topic": topic, "partition": partition, "reason": reason}
                    for (topic, partition), reason in sorted(damaged.items())
                ]
            elif damaged:
                # the route is public: tenants' topic names and the reasons are not
                ready["damaged_partitions"] = len(damaged)
        return Response(orjson.dumps(ready), media_type="application/json")

    render_limiter: list[anyio.CapacityLimiter] = []

    async def metrics(request: Request) -> Response:
        # callbacks read the worker's state in its own thread; gauges read from the store
        # (disk, offsets, lag) may block, so the text is rendered off the event loop, under a
        # limiter of its own: reads stuck on a hung disk may hold every token of the default
        if not render_limiter:
            render_limiter.append(anyio.CapacityLimiter(2))
        ctx.metrics.refresh()
        text = await anyio.to_thread.run_sync(ctx.metrics.render, False, limiter=render_limiter[0])
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
        # probes and scrapers: what a monitor adds (a cache buster) changes nothing here
        route("GET", "/healthz", healthz, PUBLIC, unknown_query="ignore"),
        route("GET", "/readyz", readyz, PUBLIC, unknown_query="ignore"),
        route("GET", "/metrics", metrics, METRICS, unknown_query="ignore"),
        route("GET", "/openapi.json", openapi, PUBLIC),
    ]


def _may_see_details(auth: Authorizer, request: Request) -> bool:
    """Whether ``/readyz`` names the damaged partitions to this caller: without tokens
    configured (the gateway listens on loopback only), or to a token with ``metrics`` or
    ``admin``.  Anyone else, a missing or unknown token included, gets their count: the route
    stays public and its status code is the same for every caller (a balancer sends none)."""
    if not auth.enabled:
        return True
    if not request.headers.get("authorization"):
        return False
    try:
        grant = auth.grant(request)
    except ApiError:
        return False  # unknown token: the public answer, never a 401 from a readiness probe
    return grant is not None and (grant.metrics or grant.admin)


class _InstallationId:
    """The store's installation id as ``/healthz`` shows it: looked up when the routes are
    made (the embedded store's catalog answers at once; on Kafka the gateway has just heard
    the cluster), else in a thread of its own, at most once per ``_INSTALLATION_RETRY_S``,
    so that a liveness probe never waits for the store."""

    def __init__(self, store: LogStore) -> None:
        self._store = store
        self._digest: str | None = None
        self._looking = threading.Lock()
        self._next_look = 0.0
        self._look()

    def _look(self) -> None:
        if not self._looking.acquire(blocking=False):
            return
        try:
            self._next_look = time.monotonic() + _INSTALLATION_RETRY_S
            raw = self._store.installation_id()
        except LogbrokerError as exc:
            _log.warning("the store cannot say its installation id yet: %s", exc)
        else:
            self._digest = hashlib.sha256(raw.encode()).hexdigest()[:32]
        finally:
            self._looking.release()

    def known(self) -> str | None:
        if self._digest is None and time.monotonic() >= self._next_look:
            self._next_look = time.monotonic() + _INSTALLATION_RETRY_S
            threading.Thread(target=self._look, name="logbroker-installation", daemon=True).start()
        return self._digest


_INSTALLATION_RETRY_S = 5.0


class _Readiness:
    """The store's readiness, looked at once per ``_READY_CACHE_S`` however many probes ask
    (a balancer and every push-client's prober): one look in flight at a time.

    A look runs in a thread of its own, not in the pool that reads and writes use (a hung
    disk may hold all of those), and is waited for ``_READY_TIMEOUT_S`` at most: a look
    that does not answer is itself the answer, not ready.  A stuck look is not started again.
    """

    def __init__(self, ctx: GatewayContext, timeout_s: float | None = None) -> None:
        self._ctx = ctx
        self._timeout_s = _READY_TIMEOUT_S if timeout_s is None else timeout_s
        self._at = 0.0
        self._reason: str | None = None
        self._lock = asyncio.Lock()
        self._in_flight: concurrent.futures.Future[str | None] | None = None

    async def look(self) -> str | None:
        async with self._lock:
            now = time.monotonic()
            if now - self._at >= _READY_CACHE_S:
                look = self._start_look()
                try:
                    self._reason = await asyncio.wait_for(
                        asyncio.shield(asyncio.wrap_future(look)), self._timeout_s
                    )
                except TimeoutError:
                    self._reason = (
                        f"the store did not answer within {self._timeout_s:g} s (its disk may hang)"
                    )
                except Exception as exc:  # a store that cannot even say: not ready
                    self._reason = f"the store's readiness is unknown: {exc}"
                self._at = time.monotonic()
            return self._reason

    def _start_look(self) -> concurrent.futures.Future[str | None]:
        if self._in_flight is not None and not self._in_flight.done():
            return self._in_flight  # still stuck: wait for that one again
        look: concurrent.futures.Future[str | None] = concurrent.futures.Future()
        store = self._ctx.store

        def run() -> None:
            try:
                look.set_result(store.readiness())
            except BaseException as exc:
                look.set_exception(exc)

        threading.Thread(target=run, name="logbroker-readiness", daemon=True).start()
        self._in_flight = look
        return look


_READY_CACHE_S = 1.0
_READY_TIMEOUT_S = 2.0
_REFRESHER = "ingest_api.admin_api.refresher"


async def on_startup(ctx: GatewayContext) -> None:
    # Callback gauges are read in the event loop that owns their state, and stored: other
    # workers' scrapes read them from the shared files, the Graphite sender from the registry.
    ctx.extensions[_REFRESHER] = asyncio.create_task(ctx.metrics.refresh_forever())
    if isinstance(ctx.store, DamageReport):
        threading.Thread(
            target=_look_for_damage, args=(ctx.store,), name="logbroker-damage-look", daemon=True
        ).start()


def _look_for_damage(store: LogStore) -> None:
    """Describe every topic once, in the background: a partition damaged while the gateway
    was down is then named by ``/readyz`` (and logged) before any write or read of it."""
    try:
        for topic in store.list_topics():
            with contextlib.suppress(LogbrokerError):  # deleted since the listing
                store.describe_topic(topic.name)
    except Exception as exc:  # the disk's trouble: /readyz and the writes say it
        _log.warning("could not look for damaged partitions: %s", exc)


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


def _status_response(description: str, status: str) -> dict[str, Any]:
    """``{"status": <status>, "dc": ...}``, the answer of ``/healthz`` and ``/readyz``."""
    schema = {
        "type": "object",
        "required": ["status"],
        "properties": {
            "status": {"type": "string", "enum": [status]},
            "dc": {"type": "string"},
            "instance": {
                "type": "string",
                "description": "on Kafka (/healthz): this gateway process's id, new at every "
                "start, as its ownership claims carry it",
            },
            "damaged_partitions": {
                "description": "(/readyz, embedded store) partitions this gateway found "
                "damaged: each refuses writes (503) and reads until restored from a copy, "
                "while the others are served.  Named with their reasons to a bearer token "
                "with metrics or admin (or when no tokens are configured); only counted for "
                "anyone else",
                "oneOf": [
                    {"type": "integer", "minimum": 1},
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "topic": {"type": "string"},
                                "partition": {"type": "integer"},
                                "reason": {"type": "string"},
                            },
                        },
                    },
                ],
            },
            "installation": {
                "type": ["string", "null"],
                "description": "(/healthz) the log behind this gateway, the same at all its "
                "gateways and after restarts (an opaque digest); null while the store has not "
                "said it yet",
            },
        },
    }
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    return {
        "/healthz": {
            "get": {
                "summary": "Liveness",
                "operationId": "healthz",
                "responses": {"200": _status_response("the gateway is up", "ok")},
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness: whether the gateway can take writes now",
                "description": "Its store is there: the embedded store's data dir is writable "
                "and not full, or Kafka answers (looked at once a second at most).",
                "operationId": "readyz",
                "responses": {
                    "200": _status_response("the gateway can take writes", "ready"),
                    "503": {
                        "description": "not now, and why (``error`` is ``not_ready``); "
                        "``Retry-After`` says when to ask again",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                        },
                    },
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
