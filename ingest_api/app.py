"""The gateway's Starlette application, assembled from route modules.

Extension point
---------------
Every module named in :data:`ROUTE_MODULES` contributes to the app.  A module exposes:

``routes(ctx: GatewayContext) -> list[RouteDeclaration]``
    required; called once per worker process with the shared :class:`GatewayContext`.  Each
    entry is :func:`ingest_api.access.route` (method, path, handler, permission): the app
    refuses to start with anything else (:class:`~ingest_api.access.UndeclaredRoute`).
``async def on_startup(ctx)`` / ``async def on_shutdown(ctx)``
    optional; run in the app's lifespan (start in ``ROUTE_MODULES`` order, stop in reverse),
    e.g. to start and stop background workers such as push delivery.  ``on_shutdown`` runs
    after uvicorn has finished the in-flight requests of a graceful stop (SIGTERM).
``openapi_paths(ctx) -> dict``
    optional; OpenAPI 3.1 path items merged into ``/openapi.json``.
``openapi_schemas(ctx) -> dict``
    optional; component schemas those path items ``$ref`` as ``#/components/schemas/<Name>``.

A module in :data:`ROUTE_MODULES` that is not installed is skipped (only a
``ModuleNotFoundError`` for exactly that module; an import error inside it is raised).
Errors: raise :class:`ingest_api.errors.ApiError`, ``BadRequest`` or ``StoreUnavailable`` and
the app answers JSON ``{"error", "reason"}``.  Auth: the route's permission is checked before
its handler runs; a handler decides names found in the body with
``ingest_api.access.access_of(request)`` (``require_read``, ``may_write``, ``owner``).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from types import ModuleType

from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingest_api.access import GuardedRoute, UndeclaredRoute, guarded_routes
from ingest_api.context import GatewayContext, open_context
from ingest_api.errors import exception_handlers
from ingest_api.host_check import HostCheck, HostNames
from ingest_api.settings import GatewaySettings

ROUTE_MODULES: tuple[str, ...] = (
    "ingest_api.write_api",
    "ingest_api.schemas_api",
    "ingest_api.read_api",
    "ingest_api.topic_admin_api",
    "ingest_api.owners_api",
    "ingest_api.groups_api",
    "ingest_api.subscriptions_api",
    "ingest_api.replica_api",
    "ingest_api.legacy_api",
    "ingest_api.admin_api",
    "ingest_api.peer_api",
    "ingest_api.ui_api",
    "ingest_api.audit_api",
)

SETTINGS_ENV = "LOGBROKER_GATEWAY_SETTINGS_JSON"
"""How ``logbroker serve`` hands its settings to uvicorn's worker processes."""
SUPERVISOR_PID_ENV = "LOGBROKER_GATEWAY_SUPERVISOR_PID"

_PR_SET_PDEATHSIG = 1
_log = logging.getLogger("ingest_api")


_YOUNG_COLLECTION_ALLOCATIONS = 50_000


def load_route_modules(names: tuple[str, ...] = ROUTE_MODULES) -> list[ModuleType]:
    """Import the route modules that exist; a missing one is skipped, a broken one raises."""
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            _log.info("route module %s is not installed; skipping it", name)
    return modules


class _RequestMetrics:
    """Counts requests by endpoint and status and observes their latency (pure ASGI)."""

    def __init__(self, app: ASGIApp, ctx: GatewayContext) -> None:
        self.app = app
        self._requests = ctx.metrics.counter(
            "logbroker_http_requests_total",
            "HTTP requests answered, by endpoint and status",
            ("endpoint", "status"),
        )
        self._latency = ctx.metrics.histogram(
            "logbroker_http_request_seconds", "HTTP request latency", ("endpoint",)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            endpoint = scope.get("endpoint")
            name = getattr(endpoint, "__name__", "unmatched") if endpoint else "unmatched"
            self._requests.inc(1, (name, str(status[0])))
            self._latency.observe(time.perf_counter() - started, (name,))


def build_app(
    ctx: GatewayContext,
    *,
    close_store: bool = False,
    modules: list[ModuleType] | None = None,
) -> Starlette:
    """The gateway app over ``ctx``; ``close_store`` closes the store when the app stops.

    Raises :class:`UndeclaredRoute` if a route module offers a route without a permission.
    """
    modules = load_route_modules() if modules is None else modules
    ctx.extensions["route_modules"] = modules
    declared = [entry for module in modules for entry in module.routes(ctx)]
    settings = ctx.settings
    routes = guarded_routes(
        declared, ctx.auth, settings.metrics_need_token, ctx.extensions, ctx.limit_refusals
    )
    ctx.extensions["guarded_routes"] = routes

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        started: list[ModuleType] = []
        try:
            for module in modules:
                hook = getattr(module, "on_startup", None)
                if hook is not None:
                    await hook(ctx)
                started.append(module)
            # Objects made at start-up live as long as the process; frozen, they are not
            # walked by every full collection (a ~10 ms pause that would show in ack p99).
            gc.freeze()
            # A request allocates an object or more per chunk, nearly all freed with it: with
            # the default (700) young collections took a third of the CPU of a request of
            # 5,000 new sources.
            gc.set_threshold(_YOUNG_COLLECTION_ALLOCATIONS, 10, 10)
            yield
        finally:
            ctx.begin_stop()
            for module in reversed(started):
                hook = getattr(module, "on_shutdown", None)
                if hook is not None:
                    try:
                        await hook(ctx)
                    except Exception:
                        _log.exception("on_shutdown of %s failed", module.__name__)
            if close_store:
                close_within = getattr(ctx.store, "close_within", None)
                if close_within is not None:
                    close_within(ctx.stop_time_left(float("inf")))
                else:
                    ctx.store.close()

    app = Starlette(
        routes=routes,
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    if not settings.auth_enabled:
        # every request may do everything: a web page must not reach it by DNS rebinding
        app.add_middleware(HostCheck, names=HostNames.of(settings))
    app.add_middleware(_RequestMetrics, ctx=ctx)
    unguarded = [r for r in app.router.routes if not isinstance(r, GuardedRoute)]
    if unguarded:
        raise UndeclaredRoute(f"routes without a declared permission: {unguarded}")
    return app


def create_app() -> Starlette:
    """uvicorn factory: settings from ``$LOGBROKER_GATEWAY_SETTINGS_JSON``, store opened here.

    Each uvicorn worker process calls it once, so each worker has its own store handle.
    """
    text = os.environ.get(SETTINGS_ENV)
    if not text:
        raise RuntimeError(f"{SETTINGS_ENV} is not set; start the gateway with `logbroker serve`")
    settings = GatewaySettings.from_json(text)
    _die_with_parent()
    return build_app(open_context(settings), close_store=True)


def _die_with_parent() -> None:
    """Ask the kernel to stop this worker (SIGTERM) when its supervisor dies.

    A supervisor killed by SIGKILL cannot stop its workers; without this they would keep
    the port and the store open, and a restarted gateway could not bind.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return  # not Linux: workers outlive a killed supervisor, as uvicorn's do
    supervisor = os.environ.get(SUPERVISOR_PID_ENV)
    if supervisor is not None and os.getppid() != int(supervisor):
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor died before we asked
