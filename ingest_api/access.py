"""Who may call a route: declared with the route, checked before its body is read.

Every route of the gateway is declared with :func:`route` in the route table of its concept
(``write_api.routes``, ``read_api.routes``, ``groups_api.routes``, ...): method, path, handler
and permission on one line.  :func:`ingest_api.app.build_app` accepts nothing else, so a route
without a permission cannot be registered (:class:`UndeclaredRoute`), and the OpenAPI document
states each operation's security from the same declaration.

The declared permission is checked by the route itself before its handler runs, and so before
anything reads the request's body:

``PUBLIC``
    anyone: health and the API description.
``read(...)``
    a token that may read some topic.  ``topic="topic"``: the topic in the path.
    ``owns="group"`` (or ``"subscription"``): the object named in the path must belong to the
    token (it belongs to the token that created it).  ``lists=True``: the answer lists only
    what the token may read.  Topics named in a body are checked by the handler, each with
    :meth:`Access.require_read`.
``write(...)``
    a token that may write some log type.  ``log_type="log_type"``: the log type in the path
    parameter or query parameter of that name.  ``lists=True``: the answer lists only the log
    types the token may write.
    The write endpoints decide each section's log type with :meth:`Access.may_write`, and its
    source id with :func:`source_refusal`: a token with ``sources`` globs writes only the
    sources they match (sessions and fencing included; the legacy API's ``legacy:<txn_id>``).
``REPLICATE``
    a token whose ``replicate`` globs cover the topic in the path (a mirror's destination).
``METRICS``
    anyone, or, when the metrics need a token (``metrics_require_token``, true by default
    with tokens), a token with ``metrics = true``.
``ADMIN``
    an ``admin`` token: operators' changes (``PATCH /v1/topics/{topic}``).
``PEER``
    another gateway of the same cluster (the Kafka backend's internal calls): the
    ``peer_token`` as bearer.  No client token passes, not even an admin's; with no
    ``peer_token`` configured (only allowed while auth is off) every request passes.

An ``admin`` token passes every check and may use every client's objects.  With no tokens
configured every request passes (and the gateway listens on loopback only).

Query parameters
----------------
A route also declares the query parameters it takes (``query=``; none unless it says so, and
``repeatable=`` those that take alternatives).  Once the permission passed, and before the
handler runs, any other parameter, or one that is not repeatable given twice, is 400
``bad_request`` naming it and listing those the route takes: a misspelt option (``?sinse=``,
``?ofset=``) would otherwise be dropped and change what the request does.  A caller without
the permission gets its 401 or 403 first and learns nothing of the route's parameters.  Only
the legacy Archive API declares ``unknown_query="ignore"``: its old clients send extras (cache
busters) and always have.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anyio.to_thread
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ingest_api.auth import Authorizer, forbidden
from ingest_api.errors import ApiError
from ingest_api.metrics import Counter
from ingest_api.params import refuse_unknown
from ingest_api.settings import TokenGrant
from log_store.errors import LimitReached
from log_store.topic_names import TOPIC_NAME_PATTERN

Handler = Callable[[Request], Awaitable[Response]]
Kind = Literal["public", "read", "write", "replicate", "metrics", "admin", "peer"]
_SCOPE_KEY = "logbroker.access"
_OWNER_LOOKUPS = "ingest_api.access.owner_lookups"


class UndeclaredRoute(RuntimeError):
    """A route module offered a route without a permission: the app refuses to start."""


@dataclass(frozen=True)
class Permission:
    """What a route needs; build with :data:`PUBLIC`, :func:`read`, :func:`write`, ..."""

    kind: Kind
    topic_param: str | None = None
    """Path parameter holding the topic the token must read (or replicate)."""
    log_type_param: str | None = None
    """Path (or else query) parameter holding the log type the token must write."""
    owns: str | None = None
    """Kind of object (``group``, ``subscription``) named by the path parameter of that name,
    which must belong to the token."""
    lists: bool = False
    """The answer lists only what the token may see (it never names a forbidden object)."""

    @property
    def public(self) -> bool:
        return self.kind == "public"

    def describe(self) -> str:
        """How the route table reads, e.g. ``read(topic)`` or ``write(log_type per section)``."""
        if self.kind in ("public", "metrics", "replicate", "admin", "peer"):
            return self.kind
        parts = []
        if self.topic_param:
            parts.append("topic")
        if self.log_type_param:
            parts.append("log_type")
        if self.owns:
            parts.append(f"owner of the {self.owns}")
        if self.lists:
            parts.append("lists what it may see")
        if not parts:
            parts.append("topics in the body" if self.kind == "read" else "log type per section")
        return f"{self.kind}({', '.join(parts)})"


PUBLIC = Permission("public")
METRICS = Permission("metrics")
PEER = Permission("peer")
ADMIN = Permission("admin")
REPLICATE = Permission("replicate", topic_param="topic")


def read(*, topic: str | None = None, owns: str | None = None, lists: bool = False) -> Permission:
    return Permission("read", topic_param=topic, owns=owns, lists=lists)


def write(*, log_type: str | None = None, lists: bool = False) -> Permission:
    return Permission("write", log_type_param=log_type, lists=lists)


@dataclass(frozen=True)
class QueryParameters:
    """The query parameters a route takes; any other is refused before its handler runs."""

    names: frozenset[str] = frozenset()
    repeatable: frozenset[str] = frozenset()
    """Those of ``names`` that take alternatives (a read's filters); any other given twice is
    refused: which of the two is meant?"""
    ignore_unknown: bool = False
    """Others are ignored, not refused: only the legacy Archive API, whose old clients send
    extras (cache busters)."""

    def check(self, request: Request) -> None:
        """400 for a parameter the route does not take, or one it takes once given twice."""
        if not request.scope.get("query_string"):
            return
        params = request.query_params
        if self.ignore_unknown:
            self._check_repeated_values(params.multi_items())
            return
        refuse_unknown(params.keys(), self.names, "query parameters")
        seen: set[str] = set()
        for name, _ in params.multi_items():
            if name in seen and name not in self.repeatable:
                raise ApiError(400, "bad_request", f"query parameter {name} is given twice")
            seen.add(name)

    def _check_repeated_values(self, items: list[tuple[str, str]]) -> None:
        """The legacy API's rule: the same value given twice is one (an old client's retry may
        append its parameters again); two values of a parameter it takes once are 400, not
        the last taken (which of them is meant?)."""
        first: dict[str, str] = {}
        for name, value in items:
            if name not in self.names or name in self.repeatable:
                continue
            given = first.setdefault(name, value)
            if given != value:
                raise ApiError(
                    400,
                    "bad_request",
                    f"query parameter {name} is given twice, with different values "
                    f"({given[:100]!r}, {value[:100]!r}): nothing was done",
                )


@dataclass(frozen=True)
class RouteDeclaration:
    """One line of a route table: method, path, handler, permission, query parameters."""

    method: str
    path: str
    handler: Handler
    permission: Permission
    name: str | None = None
    include_in_schema: bool = True
    query: QueryParameters = QueryParameters()


def route(
    method: str,
    path: str,
    handler: Handler,
    permission: Permission,
    *,
    query: Iterable[str] = (),
    repeatable: Iterable[str] = (),
    unknown_query: Literal["refuse", "ignore"] = "refuse",
    name: str | None = None,
    include_in_schema: bool = True,
) -> RouteDeclaration:
    """Declare a route: nothing else can be registered with the gateway.

    ``query`` names the query parameters the route takes (none by default) and ``repeatable``
    those of them that may be given more than once; any other is 400 before the handler runs.
    """
    where = f"{method} {path}"
    if isinstance(query, str) or isinstance(repeatable, str):
        raise UndeclaredRoute(f"{where}: query and repeatable are collections of names")
    names = frozenset(query)
    alternatives = frozenset(repeatable)
    if not alternatives <= names:
        extra = ", ".join(sorted(alternatives - names))
        raise UndeclaredRoute(f"{where}: repeatable {extra} is not among the query parameters")
    accepted = QueryParameters(names, alternatives, ignore_unknown=unknown_query == "ignore")
    return RouteDeclaration(method, path, handler, permission, name, include_in_schema, accepted)


@dataclass(frozen=True)
class Owned:
    """What an owner lookup found: whether the object exists and whose it is (``None``: made
    while auth was off; only an admin token may use it)."""

    exists: bool
    owner: str | None = None


OwnerLookup = Callable[[str], Owned]
"""Blocking: called in a worker thread with the object's name."""


def register_owner_lookup(extensions: dict[str, Any], kind: str, lookup: OwnerLookup) -> None:
    """Say how to find who owns an object of ``kind`` (for permissions with ``owns=kind``)."""
    extensions.setdefault(_OWNER_LOOKUPS, {})[kind] = lookup


@dataclass(frozen=True)
class Access:
    """What the request's token may do, as the route's guard established it."""

    auth: Authorizer
    grant: TokenGrant | None
    permission: Permission

    @property
    def owner(self) -> str | None:
        """The token's owner id: objects this request creates belong to it (None: auth off)."""
        return self.grant.owner if self.grant is not None else None

    @property
    def is_admin(self) -> bool:
        return not self.auth.enabled or (self.grant is not None and self.grant.admin)

    def may_read(self, topic: str) -> bool:
        return self.auth.may_read(self.grant, topic)

    def require_read(self, topic: str) -> None:
        if not self.may_read(topic):
            raise forbidden(f"this token may not read topic {topic!r}")

    def may_write(self, log_type: str) -> bool:
        return self.auth.may_write(self.grant, log_type)

    def require_write(self, log_type: str) -> None:
        if not self.may_write(log_type):
            raise forbidden(f"this token may not write log type {log_type!r}")

    def require_write_source(self, source_id: str) -> None:
        refusal = source_refusal(self.auth, self.grant, source_id)
        if refusal is not None:
            raise refusal

    def require_read_prefix(self, prefix: str) -> None:
        """403 unless the token may read every topic whose name starts with ``prefix``."""
        if not self.auth.may_read_prefix(self.grant, prefix):
            raise forbidden(
                f"this token may not read every topic under the prefix {prefix!r}: that needs a "
                f"read glob {prefix + '*'!r} or one ending in '*' that starts with less of it"
            )

    def owns(self, owner: str | None) -> bool:
        """Whether an object owned by ``owner`` may be used by this request."""
        return self.is_admin or (owner is not None and owner == self.owner)

    def require_owner(self, owner: str | None, what: str) -> None:
        if not self.owns(owner):
            raise forbidden(f"{what} belongs to another token")


def source_refusal(auth: Authorizer, grant: TokenGrant | None, source_id: str) -> ApiError | None:
    """The 403 for writing ``source_id`` with ``grant`` (outside its ``sources``), or None.

    Checked before anything of the section (session, legacy transaction) is written: without
    it a token of the same log type could end another token's source (a seqno of 2**63-1
    turns its every later chunk into a ``duplicate``), fence it, or write under its name."""
    if auth.may_write_source(grant, source_id):
        return None
    assert grant is not None  # with no grant (auth off) every source may be written
    globs = ", ".join(map(repr, grant.write_sources or ()))
    allowed = f"only the sources {globs}" if globs else "no source (sources = [])"
    return forbidden(f"this token may not write source {source_id!r}: it writes {allowed}")


def access_of(conn: HTTPConnection) -> Access:
    """The request's :class:`Access`; only routes declared with :func:`route` have one."""
    access = conn.scope.get(_SCOPE_KEY)
    if not isinstance(access, Access):
        raise RuntimeError(f"{conn.url.path}: not a declared route; its access is unknown")
    return access


class GuardedRoute(Route):
    """A Starlette route whose endpoint checks its :class:`Permission` first."""

    def __init__(
        self,
        declaration: RouteDeclaration,
        auth: Authorizer,
        metrics_require_token: bool,
        owner_lookups: dict[str, OwnerLookup],
        limit_refusals: Counter,
    ) -> None:
        self.declaration = declaration
        permission = declaration.permission
        if permission.owns is not None and permission.owns not in owner_lookups:
            raise UndeclaredRoute(
                f"{declaration.method} {declaration.path}: nothing says who owns a "
                f"{permission.owns!r} (register_owner_lookup)"
            )
        if permission.kind == "metrics" and not metrics_require_token:
            permission = PUBLIC
        self.permission = permission
        handler = declaration.handler
        query = declaration.query

        @functools.wraps(handler)
        async def endpoint(request: Request) -> Response:
            request.scope[_SCOPE_KEY] = await _authorize(request, permission, auth, owner_lookups)
            # after the permission: a caller without it learns nothing of the parameters
            query.check(request)
            try:
                return await handler(request)
            except LimitReached as exc:
                limit_refusals.inc(1, (exc.limit,))
                raise

        super().__init__(
            declaration.path,
            endpoint,
            methods=[declaration.method],
            name=declaration.name or handler.__name__,
            include_in_schema=declaration.include_in_schema,
        )


def guarded_routes(
    declared: Sequence[object],
    auth: Authorizer,
    metrics_require_token: bool,
    extensions: dict[str, Any],
    limit_refusals: Counter,
) -> list[BaseRoute]:
    """Starlette routes of route-table entries; anything but a declaration is refused."""
    lookups: dict[str, OwnerLookup] = extensions.get(_OWNER_LOOKUPS, {})
    routes: list[BaseRoute] = []
    for item in declared:
        if not isinstance(item, RouteDeclaration):
            where = getattr(item, "path", repr(item))
            raise UndeclaredRoute(
                f"route {where} was not declared with ingest_api.access.route(method, path, "
                "handler, permission); the gateway does not register it"
            )
        routes.append(GuardedRoute(item, auth, metrics_require_token, lookups, limit_refusals))
    return routes


async def _authorize(
    request: Request,
    permission: Permission,
    auth: Authorizer,
    owner_lookups: dict[str, OwnerLookup],
) -> Access:
    """401/403 unless the request's token has what ``permission`` asks for."""
    if permission.public:
        return Access(auth, None, permission)
    if permission.kind == "peer":
        auth.require_peer(request)  # 401 without the peer token
        return Access(auth, None, permission)
    grant = auth.grant(request)  # 401 without a known token
    access = Access(auth, grant, permission)
    if grant is None or grant.admin:
        return access
    kind = permission.kind
    if kind == "admin":
        raise forbidden("only an admin token may do this (admin = true)")
    if kind == "metrics" and not grant.metrics:
        raise forbidden("this token may not read /metrics (give it metrics = true)")
    if kind == "read":
        if not grant.read_topics:
            raise forbidden("this token may read no topic")
        topic = _path_name(request, permission.topic_param)
        if topic is not None and not auth.may_read(grant, topic):
            raise forbidden(f"this token may not read topic {topic!r}")
    elif kind == "write":
        if not grant.write_log_types:
            raise forbidden("this token may write no log type")
        log_type = (
            request.path_params.get(permission.log_type_param)
            or request.query_params.get(permission.log_type_param)
            if permission.log_type_param
            else None
        )
        if log_type is not None and not auth.may_write(grant, log_type):
            raise forbidden(f"this token may not write log type {log_type!r}")
    elif kind == "replicate":
        topic = _path_name(request, permission.topic_param)
        if topic is not None and not auth.may_replicate(grant, topic):
            raise forbidden(f"this token may not replicate into topic {topic!r}")
        if not grant.replicate_topics:  # a route of no one topic (a mirror's report)
            raise forbidden("this token may replicate into no topic (it has no replicate globs)")
    if permission.owns is not None:
        name = request.path_params.get(permission.owns)
        if isinstance(name, str):
            owned = await anyio.to_thread.run_sync(owner_lookups[permission.owns], name)
            if owned.exists:
                access.require_owner(owned.owner, f"{permission.owns} {name!r}")
    return access


def _path_name(request: Request, param: str | None) -> str | None:
    """The path parameter ``param`` if it can be a topic name (others are refused later)."""
    if param is None:
        return None
    value = request.path_params.get(param)
    if not isinstance(value, str):
        return None
    if not TOPIC_NAME_PATTERN.fullmatch(value):
        raise ApiError(400, "bad_request", f"invalid topic name {value[:60]!r}")
    return value
