"""Query parameters on every route, by construction: the route table is walked, and each route
refuses a parameter it does not declare (400, before its handler runs, after its permission),
takes every one it declares, and says the same as /openapi.json and docs/protocol.md.

The gateway runs in this process (Starlette's test client) with tokens, over its own store;
every route's handler is counted, so "refused before the handler" is seen, not inferred.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response

with warnings.catch_warnings():
    # Starlette would have its test client on httpx2; on httpx it works as it always did.
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

from audit.records import is_audit_topic
from delivery.internal_state import is_internal
from ingest_api.access import PUBLIC, GuardedRoute, UndeclaredRoute, read, route
from ingest_api.app import build_app, load_route_modules
from ingest_api.context import GatewayContext
from ingest_api.openapi import openapi_path
from ingest_api.settings import load_settings
from log_store import open_store
from tests.gateway.test_route_authorization import (
    A_TOKEN,
    ADMIN_TOKEN,
    B_TOKEN,
    CONFIG,
    TenantA,
    examples,
)

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
UNKNOWN = "zz_unknown"
# A value each declared parameter can take in the examples' requests.
SAMPLES = {
    "offset": "0",
    "max_bytes": "1000",
    "wait_ms": "0",
    "format": "json",
    "txn_window_ms": "1000",
    "raw": "0",
    "topic_id": "0" * 32,
    "source_id": "a-src",
    "server": "host1",
    "file": "/f",
    "log_type": "app",
    "hash_key": "source_id",
    "hash_mod": "1",
    "hash_rem": "0",
    "prefix": "dc1.",
    "include_audit": "false",
    "topic": "dc1.*",
    "since": "0",
    "source": "x",
    "partitions": "1",
    "start": "0",
    "from": "0",
    "to": "1",
    "store_id": "0" * 32,
    "txn_id": "t-1",
}
RouteKey = tuple[str, str]  # (method, path as /openapi.json writes it)


@dataclasses.dataclass
class Gateway:
    client: TestClient
    routes: dict[RouteKey, GuardedRoute]
    calls: collections.Counter[RouteKey]
    tenant: TenantA
    store: Any

    def request(self, token: str | None, method: str, url: str, **kwargs: Any) -> Any:
        headers = {**kwargs.pop("headers", {})}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return self.client.request(method, url, headers=headers, **kwargs)

    def user_state(self) -> dict[str, Any]:
        """Every topic a client sees (not the internal or audit ones, which the gateway's own
        workers write in the background): its id, settings and end offsets."""
        state = {}
        for info in self.store.list_topics():
            if is_internal(info.name) or is_audit_topic(info.name):
                continue
            described = self.store.describe_topic(info.name)
            ends = tuple(p.end_offset for p in described.partitions)
            state[info.name] = (described.topic_id, info.config, ends)
        return state


def _counted(module: types.ModuleType, calls: collections.Counter[RouteKey]) -> types.ModuleType:
    """``module`` whose routes count their handlers' calls (everything else as it is)."""
    proxy = types.ModuleType(module.__name__)
    proxy.__dict__.update(module.__dict__)

    def counting(key: RouteKey, handler: Callable[[Request], Any]) -> Any:
        @functools.wraps(handler)
        async def counted(request: Request) -> Response:
            calls[key] += 1
            response: Response = await handler(request)
            return response

        return counted

    def routes(ctx: GatewayContext) -> list[Any]:
        return [
            dataclasses.replace(d, handler=counting((d.method, openapi_path(d.path)), d.handler))
            for d in module.routes(ctx)
        ]

    proxy.routes = routes  # type: ignore[attr-defined]
    return proxy


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    base = tmp_path_factory.mktemp("query-parameters")
    config = base / "gateway.toml"
    config.write_text(CONFIG)
    settings = load_settings(config_file=config, flags={"data_dir": str(base / "data")})
    store = open_store(base / "data")
    calls: collections.Counter[RouteKey] = collections.Counter()
    modules = [_counted(m, calls) for m in load_route_modules()]
    app = build_app(
        GatewayContext(store=store, settings=settings), close_store=True, modules=modules
    )
    routes = {
        (r.declaration.method, openapi_path(r.path)): r
        for r in app.router.routes
        if isinstance(r, GuardedRoute)
    }
    with TestClient(app, base_url="http://127.0.0.1") as client:
        client.headers["Authorization"] = f"Bearer {A_TOKEN}"
        tenant = TenantA(client)
        del client.headers["Authorization"]
        yield Gateway(client, routes, calls, tenant, store)


def _caller(gw: Gateway, key: RouteKey) -> str:
    return ADMIN_TOKEN if gw.routes[key].permission.kind == "admin" else A_TOKEN


def _names_its_object(guarded: GuardedRoute) -> bool:
    """Whether the route's permission alone refuses another tenant (the topic, log type or
    object in its path or query is not theirs); others decide on the body, in the handler."""
    permission = guarded.permission
    in_path = [
        p for p in (permission.topic_param, permission.owns) if p and "{" + p in guarded.path
    ]
    named = bool(in_path) or permission.log_type_param is not None
    return named or permission.kind in ("admin", "metrics")


def _is_refusal(response: Any) -> bool:
    """Whether the answer is the route's refusal of its query parameters."""
    if response.status_code != 400:
        return False
    reason = str(response.json().get("reason", ""))
    return reason.startswith("unknown query parameters") or reason.endswith("is given twice")


def _with_params(kwargs: dict[str, Any], extra: list[tuple[str, str]]) -> dict[str, Any]:
    params = [(k, str(v)) for k, v in dict(kwargs.get("params") or {}).items()]
    return {**kwargs, "params": params + extra}


def test_every_route_refuses_an_unknown_query_parameter_before_its_handler_runs(
    gateway: Gateway,
) -> None:
    gw = gateway
    calls = examples(gw.tenant)
    missing = set(gw.routes) - set(calls)
    assert not missing, (
        f"routes without an example (tests/gateway/test_route_authorization.py): {missing}"
    )
    before = gw.user_state()
    checked = 0
    for key, guarded in sorted(gw.routes.items()):
        method, path = key
        accepted = guarded.declaration.query
        if accepted.ignore_unknown:
            continue
        url, kwargs = calls[key]
        what = f"{method} {path}"
        handled = gw.calls[key]
        refused = gw.request(
            _caller(gw, key), method, url, **_with_params(kwargs, [(UNKNOWN, "1")])
        )
        assert refused.status_code == 400, (what, refused.text)
        body = refused.json()
        assert body["error"] == "bad_request", what
        known = ", ".join(sorted(accepted.names)) or "none"
        assert body["reason"] == f"unknown query parameters: {UNKNOWN}; known: {known}", what
        assert refused.headers["content-type"] == "application/json", what
        assert gw.calls[key] == handled, f"{what}: the handler ran"
        if not guarded.permission.public and guarded.permission.kind != "peer":
            # the permission first: nothing about the route's parameters without it
            anonymous = gw.request(None, method, url, **_with_params(kwargs, [(UNKNOWN, "1")]))
            assert anonymous.status_code == 401, (what, anonymous.text)
            if _names_its_object(guarded):
                other = gw.request(B_TOKEN, method, url, **_with_params(kwargs, [(UNKNOWN, "1")]))
                assert other.status_code == 403, (what, other.text)
        for name in sorted(accepted.names - accepted.repeatable):
            twice = _with_params(kwargs, [(name, SAMPLES[name]), (name, SAMPLES[name])])
            repeated = gw.request(_caller(gw, key), method, url, **twice)
            assert repeated.status_code == 400, (what, name, repeated.text)
            assert repeated.json()["reason"] == f"query parameter {name} is given twice", what
        assert gw.calls[key] == handled, f"{what}: the handler ran"
        checked += 1
    assert checked > 30  # the walk found the route table
    assert gw.user_state() == before


def test_every_declared_query_parameter_is_taken(gateway: Gateway) -> None:
    gw = gateway
    calls = examples(gw.tenant)
    # deletions last: they remove what later calls name (POST /v1/topics makes dc1.made)
    for key in sorted(gw.routes, key=lambda k: (k[0] == "DELETE", k)):
        accepted = gw.routes[key].declaration.query
        url, kwargs = calls[key]
        given = dict(kwargs.get("params") or {})
        extra = [(name, SAMPLES[name]) for name in sorted(accepted.names) if name not in given]
        extra += [(name, SAMPLES[name]) for name in sorted(accepted.repeatable)]  # twice
        if accepted.ignore_unknown:
            extra.append((UNKNOWN, "1"))  # old clients' cache busters
        response = gw.request(_caller(gw, key), key[0], url, **_with_params(kwargs, extra))
        assert not _is_refusal(response), (key, response.text)
        assert response.status_code < 500, (key, response.text)
    # and the examples' own calls still work with every declared parameter
    answer = gw.request(
        A_TOKEN,
        "GET",
        f"/v1/topics/dc1.app/partitions/{gw.tenant.partition}/messages",
        params=[(n, SAMPLES[n]) for n in ("offset", "max_bytes", "format", "raw", "server")]
        + [("server", "host9"), ("hash_key", "source_id"), ("hash_mod", "1"), ("hash_rem", "0")],
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["messages"], "the filters (server=host1 or host9) keep tenant A's line"


def test_the_legacy_api_ignores_parameters_it_does_not_know(gateway: Gateway) -> None:
    gw = gateway
    staged = gw.request(
        A_TOKEN, "POST", "/store", params={"log_type": "app", "_": "1764190000"}, content=b"x\n"
    )
    assert staged.status_code == 200, staged.text
    store_id = staged.json()["store_id"]
    asked = gw.request(
        A_TOKEN, "POST", "/commit_request", params={"store_id": store_id, "nocache": "1"}
    )
    assert asked.status_code == 200, asked.text
    committed = gw.request(
        A_TOKEN, "POST", "/commit", params={"txn_id": store_id, "log_type": "app", "x": "y"}
    )
    assert committed.status_code == 200, committed.text


def test_the_legacy_api_refuses_a_parameter_given_twice_with_two_values(gateway: Gateway) -> None:
    """Which of two log types (transaction ids) is meant? The last was taken, in silence: a
    /store naming log types zzz and app staged under app. The same value twice (an old
    client's retry appending its parameters again) is one."""
    gw = gateway
    before = gw.user_state()
    handled = collections.Counter(gw.calls)
    for path, params in [
        ("/store", [("log_type", "zzz"), ("log_type", "app")]),
        ("/commit_request", [("store_id", "0" * 32), ("store_id", "1" * 32)]),
        ("/commit", [("txn_id", "a"), ("txn_id", "b"), ("log_type", "app")]),
    ]:
        refused = gw.request(A_TOKEN, "POST", path, params=params, content=b"x\n")
        assert refused.status_code == 400, (path, refused.text)
        name = params[0][0]
        assert refused.json()["reason"].startswith(
            f"query parameter {name} is given twice, with different values"
        ), refused.text
    assert gw.calls == handled, "a handler ran"
    assert gw.user_state() == before
    same = [("log_type", "app"), ("log_type", "app"), ("_", "1"), ("_", "2")]
    staged = gw.request(A_TOKEN, "POST", "/store", params=same, content=b"x\n")
    assert staged.status_code == 200, staged.text
    store_id = staged.json()["store_id"]
    twice = [("store_id", store_id), ("store_id", store_id), ("txn_id", "t1"), ("txn_id", "t1")]
    asked = gw.request(A_TOKEN, "POST", "/commit_request", params=twice)
    assert asked.status_code == 200, asked.text
    twice = [("txn_id", "t1"), ("log_type", "app"), ("txn_id", "t1")]
    committed = gw.request(A_TOKEN, "POST", "/commit", params=twice)
    assert committed.json()["committed"] is True, committed.text


def test_probes_metrics_and_the_dashboards_page_ignore_a_cache_buster(gateway: Gateway) -> None:
    gw = gateway
    for path in ("/healthz", "/readyz", "/metrics", "/ui", "/ui/static/dashboard.js"):
        answer = gw.request(ADMIN_TOKEN, "GET", path, params={"_": "1764190000"})
        assert answer.status_code == 200, (path, answer.text)


def test_openapi_and_the_protocol_name_each_routes_parameters(gateway: Gateway) -> None:
    gw = gateway
    paths = gw.client.get("/openapi.json").json()["paths"]
    documented = _protocol_table()
    named = {k for k in documented if k != "*"}
    assert named <= set(gw.routes), (
        f"docs/protocol.md names routes that do not exist: {named - set(gw.routes)}"
    )
    for key, guarded in sorted(gw.routes.items()):
        method, path = key
        accepted = guarded.declaration.query
        operation = paths[path][method.lower()]
        in_openapi = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
        assert in_openapi == accepted.names, key
        if not accepted.ignore_unknown:
            assert "400" in operation["responses"], key
        row = documented.get(key, documented["*"])
        assert row == (accepted.names, accepted.repeatable, accepted.ignore_unknown), key


def _protocol_table() -> dict[Any, tuple[frozenset[str], frozenset[str], bool]]:
    """docs/protocol.md's table of query parameters: (method, path) (or ``"*"``, every other
    route) to the names taken, those repeatable, and whether others are ignored."""
    text = PROTOCOL.read_text()
    section = text.split("### Query parameters", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    table: dict[Any, tuple[frozenset[str], frozenset[str], bool]] = {}
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 4, line
        routes, names, repeatable, others = cells
        assert others in ("400", "ignored"), line
        entry = (_names(names), _names(repeatable), others == "ignored")
        if routes.startswith("every other route"):
            table["*"] = entry
            continue
        for one in re.findall(r"`([A-Z]+ /[^`]*)`", routes):
            method, path = one.split(" ", 1)
            table[(method, path)] = entry
    assert "*" in table
    return table


def _names(cell: str) -> frozenset[str]:
    return frozenset(re.findall(r"`([a-z_]+)`", cell))


def test_a_route_declared_without_parameters_takes_none(tmp_path: Path) -> None:
    async def page(request: Request) -> Response:
        return Response("ok")

    module = types.ModuleType("new_routes")
    module.routes = lambda ctx: [  # type: ignore[attr-defined]
        route("GET", "/v1/new", page, read()),
        route("GET", "/v1/new-with", page, PUBLIC, query=("a", "b"), repeatable=("b",)),
    ]
    settings = load_settings(flags={"data_dir": str(tmp_path / "d")})
    store = open_store(tmp_path / "d")
    app = build_app(
        GatewayContext(store=store, settings=settings), close_store=True, modules=[module]
    )
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert client.get("/v1/new").status_code == 200
        refused = client.get("/v1/new?a=1")
        assert (refused.status_code, refused.json()) == (
            400,
            {"error": "bad_request", "reason": "unknown query parameters: a; known: none"},
        )
        assert client.get("/v1/new-with?a=1&b=2&b=3").status_code == 200
        twice = client.get("/v1/new-with?a=1&a=2")
        assert twice.json()["reason"] == "query parameter a is given twice"
        odd = client.get("/v1/new-with?%00x=1&" + "&".join(f"n{i}=1" for i in range(30)))
        reason = odd.json()["reason"]
        assert reason.startswith("unknown query parameters: '\\x00x', n0, n1,"), reason
        assert reason.endswith("and 11 more; known: a, b"), reason
        # a look-alike letter (Cyrillic dze for s) shows as what it is
        alike = client.get("/v1/new-with", params={"\u0455ince": "1"}).json()["reason"]
        assert alike.startswith("unknown query parameters: '\\u0455ince';"), alike
    with pytest.raises(UndeclaredRoute, match="repeatable b"):
        route("GET", "/v1/x", page, PUBLIC, repeatable=("b",))
    with pytest.raises(UndeclaredRoute, match="collections of names"):
        route("GET", "/v1/x", page, PUBLIC, query="offset")


def test_the_protocols_permission_table_has_a_row_for_every_route(gateway: Gateway) -> None:
    """docs/protocol.md's "Who may call what" covers every route the gateway registers, with
    the permission the route declares; a route added without its row fails here."""
    section = PROTOCOL.read_text().split("### Who may call what", 1)[1].split("\n### ", 1)[0]
    intro, _, table = section.partition("| routes | permission |")
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    missing = []
    for (method, path), guarded in sorted(gateway.routes.items()):
        kind = guarded.permission.kind
        if kind == "public" and f"`{path}`" in intro:
            continue
        covering = [row for row in rows if _row_covers(row, method, path)]
        if not covering:
            missing.append(f"{method} {path} ({kind})")
            continue
        permission = covering[0].strip("|").split("|")[-1]
        assert re.search(rf"\b{kind}\b", permission), (method, path, kind, covering[0])
    assert not missing, f"docs/protocol.md has no permission row for: {', '.join(missing)}"


def _row_covers(row: str, method: str, path: str) -> bool:
    """Whether the routes cell of ``row`` names ``method path``: as `METHOD /path` (a query
    after it is an example), as `/path` or a prefix `/prefix...` or `/prefix/...` (every
    method), or as `.../tail` after `METHOD /base` (a route of that method under the base,
    ending in the tail)."""
    cell = row.strip("|").split("|")[0]
    base: tuple[str, str] | None = None
    for item in re.findall(r"`([^`]+)`", cell):
        one_method, _, rest = item.partition(" ")
        if not rest:
            one_method, rest = "", item
        rest = rest.split("?", 1)[0]
        if rest.startswith("/"):
            if rest.endswith("..."):
                if path.startswith(rest.removesuffix("...").removesuffix("/")):
                    return True
                continue
            if rest == path and one_method in ("", method):
                return True
            base = (one_method, rest)
        elif rest.startswith(".../") and base is not None:
            want = one_method or base[0]
            tail = rest.removeprefix("...")
            if want == method and path.startswith(base[1]) and path.endswith(tail):
                return True
    return False
