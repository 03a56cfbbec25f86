"""Authorization on every route, by construction: the route table and /openapi.json are walked,
and each route is called without a token (401), with another tenant's token (403) and with
its owner's token (neither).  A route added without an example here fails the walk."""

from __future__ import annotations

import socket
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.responses import Response
from starlette.routing import Route

from ingest_api.access import GuardedRoute, UndeclaredRoute
from ingest_api.app import build_app
from ingest_api.context import GatewayContext
from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from ingest_api.openapi import openapi_path
from ingest_api.settings import load_settings
from log_store import open_store
from tests.conftest import GatewayProcess
from tests.gateway.conftest import end_offsets, meta
from tests.scripted_http import read_head

A_TOKEN = "tenant-a-secret"
B_TOKEN = "tenant-b-secret"
ADMIN_TOKEN = "operator-secret"
CONFIG = f"""
metrics_require_token = true
push_allow = ["127.0.0.1"]

[tokens.{A_TOKEN}]
name = "tenant-a"
write = ["app"]
read = ["dc1.app"]
replicate = ["dc9.app"]
metrics = true

[tokens.{B_TOKEN}]
name = "tenant-b"
write = ["b-*"]
read = ["dc1.b-*"]
replicate = ["dc9.b-*"]

[tokens.{ADMIN_TOKEN}]
name = "operator"
admin = true
"""

Call = tuple[str, dict[str, Any]]  # (url path, httpx request keyword arguments)
APP_SCHEMA = {"type": "record", "name": "App", "fields": [{"name": "line", "type": "string"}]}


class TenantA:
    """Objects tenant A made: a topic with data, a group with a member, a subscription, a
    staged legacy upload."""

    def __init__(self, http: httpx.Client) -> None:
        body = encode_binary([(meta("a-src"), [(1, 0, b"a line\n")])])
        written = http.post("/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE})
        assert written.status_code == 200, written.text
        self.partition = written.json()["results"][0]["partition"]
        joined = http.post("/v1/groups/ga/members", json={"topics": ["dc1.app"]})
        assert joined.status_code == 200, joined.text
        self.member = joined.json()["member_id"]
        created = http.post("/v1/subscriptions", json=subscription("sa", "dc1.app"))
        assert created.status_code == 201, created.text
        staged = http.post("/store", params={"log_type": "app"}, content=b"old\n")
        assert staged.status_code == 200, staged.text
        self.store_id = staged.json()["store_id"]


def subscription(name: str, topic: str) -> dict[str, Any]:
    return {"name": name, "endpoint": "http://127.0.0.1:9/hook", "topics": [topic]}


def push_client_file(log_type: str) -> dict[str, Any]:
    return {"path": "/var/log/a.log", "log_type": log_type, "size": 9, "acked": 4, "lag_bytes": 5}


def mirror_partition(topic: str) -> dict[str, Any]:
    return {"topic": topic, "partition": 0, "position": 3, "source_end_offset": 5}


def examples(a: TenantA) -> dict[tuple[str, str], Call]:
    """One request per route, naming tenant A's objects."""
    p = a.partition
    member = f"/v1/groups/ga/members/{a.member}"
    replica = "/v1/replica/dc9.app/partitions/0"
    binary = {"content-type": BINARY_MEDIA_TYPE}
    return {
        ("POST", "/v1/sessions"): ("/v1/sessions", {"json": meta("a-src")}),
        ("POST", "/v1/write"): (
            "/v1/write",
            {"content": encode_binary([(meta("a-src"), [(2, 0, b"x\n")])]), "headers": binary},
        ),
        ("GET", "/v1/topics"): ("/v1/topics", {}),
        ("GET", "/v1/topics/{topic}"): ("/v1/topics/dc1.app", {}),
        ("GET", "/v1/topics/{topic}/owners"): ("/v1/topics/dc1.app/owners", {}),
        ("PATCH", "/v1/topics/{topic}"): ("/v1/topics/dc1.app", {"json": {"retention_ms": None}}),
        ("POST", "/v1/topics"): ("/v1/topics", {"json": {"name": "dc1.made", "partitions": 1}}),
        ("DELETE", "/v1/topics/{topic}"): ("/v1/topics/dc1.made", {}),  # made by the POST
        ("GET", "/v1/owners"): ("/v1/owners", {"params": {"log_type": "app"}}),
        ("GET", "/v1/topics/{topic}/partitions/{partition}/messages"): (
            f"/v1/topics/dc1.app/partitions/{p}/messages",
            {"params": {"offset": 0}},
        ),
        ("POST", "/v1/fetch"): (
            "/v1/fetch",
            {"json": {"partitions": [{"topic": "dc1.app", "partition": p, "offset": 0}]}},
        ),
        ("GET", "/v1/groups/{group}"): ("/v1/groups/ga", {}),
        ("POST", "/v1/groups/{group}/members"): (
            "/v1/groups/ga/members",
            {"json": {"topics": ["dc1.app"]}},
        ),
        ("POST", "/v1/groups/{group}/members/{member}/heartbeat"): (member + "/heartbeat", {}),
        ("DELETE", "/v1/groups/{group}/members/{member}"): (member, {}),
        ("POST", "/v1/groups/{group}/offsets"): (
            "/v1/groups/ga/offsets",
            {"json": {"offsets": [{"topic": "dc1.app", "partition": p, "offset": 0}]}},
        ),
        ("POST", "/v1/subscriptions"): (
            "/v1/subscriptions",
            {"json": subscription("sa", "dc1.app")},
        ),
        ("GET", "/v1/subscriptions"): ("/v1/subscriptions", {}),
        ("GET", "/v1/subscriptions/{subscription}"): ("/v1/subscriptions/sa", {}),
        ("DELETE", "/v1/subscriptions/{subscription}"): ("/v1/subscriptions/sa", {}),
        ("GET", "/v1/replica/{topic}/partitions/{partition}"): (
            replica,
            {"params": {"source": "x"}},
        ),
        ("POST", "/v1/replica/{topic}/partitions/{partition}"): (
            replica,
            {"params": {"source": "x", "partitions": 1, "start": 0}, "content": b"LBR1"},
        ),
        ("POST", "/v1/replica/{topic}/partitions/{partition}/dropped"): (
            replica + "/dropped",
            {"params": {"source": "x", "partitions": 1, "from": 0, "to": 1}},
        ),
        ("POST", "/store"): ("/store", {"params": {"log_type": "app"}, "content": b"x\n"}),
        ("PUT", "/store"): ("/store", {"params": {"log_type": "app"}, "content": b"x\n"}),
        ("POST", "/commit_request"): ("/commit_request", {"params": {"store_id": a.store_id}}),
        ("POST", "/commit"): ("/commit", {"params": {"txn_id": a.store_id, "log_type": "app"}}),
        ("GET", "/v1/ui/overview"): ("/v1/ui/overview", {}),
        ("POST", "/v1/clients/status"): (
            "/v1/clients/status",
            {"json": {"client": "host-a", "files": [push_client_file("app")]}},
        ),
        ("POST", "/v1/mirrors/status"): (
            "/v1/mirrors/status",
            {"json": {"client": "mirror-a", "partitions": [mirror_partition("dc9.app")]}},
        ),
        ("GET", "/ui"): ("/ui", {}),
        ("GET", "/ui/static/{name}"): ("/ui/static/dashboard.js", {}),
        ("GET", "/v1/schemas"): ("/v1/schemas", {}),
        ("GET", "/v1/schemas/{log_type}"): ("/v1/schemas/app", {}),
        ("POST", "/v1/schemas/{log_type}/versions"): (
            "/v1/schemas/app/versions",
            {"json": {"schema": APP_SCHEMA}},
        ),
        ("GET", "/v1/schemas/{log_type}/versions/{version}"): (
            "/v1/schemas/app/versions/latest",
            {},
        ),
        ("PUT", "/v1/schemas/{log_type}/compatibility"): (
            "/v1/schemas/app/compatibility",
            {"json": {"compatibility": "backward"}},
        ),
        ("GET", "/v1/topics/{topic}/schemas"): ("/v1/topics/dc1.app/schemas", {}),
        ("GET", "/v1/audit/windows"): (
            "/v1/audit/windows",
            {"params": {"topic": "dc1.*", "since": 0}},
        ),
        ("GET", "/metrics"): ("/metrics", {}),
        ("GET", "/healthz"): ("/healthz", {}),
        ("GET", "/readyz"): ("/readyz", {}),
        ("GET", "/openapi.json"): ("/openapi.json", {}),
    }


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("tenants")
    config = base / "gateway.toml"
    config.write_text(CONFIG)
    gateway = GatewayProcess(base / "data", ["--config", str(config)], base / "gw.log").start()
    clients = {
        token: httpx.Client(
            base_url=gateway.url,
            timeout=30,
            headers={"Authorization": f"Bearer {token}"} if token else {},
        )
        for token in (None, A_TOKEN, B_TOKEN, ADMIN_TOKEN)
    }
    try:
        yield gateway, config, clients, TenantA(clients[A_TOKEN])
    finally:
        for client in clients.values():
            client.close()
        gateway.kill()


def declared_routes(config: Path, data_dir: Path) -> list[GuardedRoute]:
    """The route table as the app registers it (built in this process, on a scratch store)."""
    settings = load_settings(config_file=config, flags={"data_dir": str(data_dir)})
    store = open_store(data_dir)
    try:
        app = build_app(GatewayContext(store=store, settings=settings))
        routes = [r for r in app.router.routes if isinstance(r, GuardedRoute)]
        assert len(routes) == len(app.router.routes)
        return routes
    finally:
        store.close()


def test_every_route_refuses_a_missing_token_and_another_tenants_token(
    tenants: Any, tmp_path: Path
) -> None:
    gateway, config, clients, a = tenants
    routes = declared_routes(config, tmp_path / "scratch")
    documented = httpx.get(gateway.url + "/openapi.json").json()["paths"]
    from_router = {(r.declaration.method, openapi_path(r.path)): r for r in routes}
    from_openapi = {(m.upper(), path) for path, item in documented.items() for m in item}
    assert set(from_router) == from_openapi
    calls = examples(a)
    missing = set(from_router) - set(calls)
    assert not missing, f"routes without an example in this test: {missing}"
    # deletions last: the owner's own calls must not remove what later checks name
    order = sorted(from_router, key=lambda key: (key[0] == "DELETE", key))
    for method, path in order:
        route = from_router[(method, path)]
        operation = documented[path][method.lower()]
        url, kwargs = calls[(method, path)]
        what = f"{method} {path} ({route.permission.describe()})"
        if route.permission.public:
            assert operation["security"] == [], what
            assert clients[None].request(method, url, **kwargs).status_code == 200, what
            continue
        assert operation["security"] == [{"bearer": []}], what
        assert {"401", "403"} <= set(operation["responses"]), what
        anonymous = clients[None].request(method, url, **kwargs)
        assert anonymous.status_code == 401, (what, anonymous.text)
        assert anonymous.json()["error"] == "unauthorized", what
        other = clients[B_TOKEN].request(method, url, **kwargs)
        if route.permission.lists:
            assert other.status_code == 200, (what, other.text)
            assert "dc1.app" not in other.text and '"sa"' not in other.text, what
        else:
            assert other.status_code == 403, (what, other.text)
            assert other.json()["error"] == "forbidden", what
        if route.permission.kind == "admin":
            # tenant A's own topic, but an operator's change: only an admin token may
            refused = clients[A_TOKEN].request(method, url, **kwargs)
            assert refused.status_code == 403, (what, refused.text)
            owner = clients[ADMIN_TOKEN].request(method, url, **kwargs)
        else:
            owner = clients[A_TOKEN].request(method, url, **kwargs)
        assert owner.status_code not in (401, 403), (what, owner.text)


def test_another_tenant_cannot_take_over_a_group_or_subscription_name(tenants: Any) -> None:
    gateway, _, clients, _ = tenants
    b = clients[B_TOKEN]
    before = end_offsets(gateway.data_dir)
    # B may read dc1.b-logs, but the names belong to A
    taken = b.post("/v1/subscriptions", json=subscription("sa-taken", "dc1.b-logs"))
    assert taken.status_code == 201
    clients[A_TOKEN].post("/v1/subscriptions", json=subscription("sa-owned", "dc1.app"))
    refused = b.post("/v1/subscriptions", json=subscription("sa-owned", "dc1.b-logs"))
    assert (refused.status_code, refused.json()["error"]) == (403, "forbidden")
    clients[A_TOKEN].post("/v1/groups/ga-owned/members", json={"topics": ["dc1.app"]})
    join = b.post("/v1/groups/ga-owned/members", json={"topics": ["dc1.b-logs"]})
    assert join.status_code == 403
    listed = {s["name"] for s in b.get("/v1/subscriptions").json()["subscriptions"]}
    assert listed == {"sa-taken"}
    assert end_offsets(gateway.data_dir) == before


def test_a_request_without_a_token_is_refused_before_its_body_is_read(tenants: Any) -> None:
    gateway, _, _, _ = tenants
    head = (
        "POST /v1/write HTTP/1.1\r\nHost: gw\r\n"
        f"Content-Type: {BINARY_MEDIA_TYPE}\r\nContent-Length: {1 << 34}\r\n"
    )
    # With "Expect: 100-continue" a server asks for the body only when it reads it: the
    # answer must be the 401 itself, never a "100 Continue".
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall((head + "Expect: 100-continue\r\n\r\n").encode())
        answer = read_head(sock)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:100]
    # Without it, 16 GiB are announced and 1 MiB sent: the 401 comes without the rest.
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall((head + "\r\n").encode() + b"\0" * (1 << 20))
        started = time.monotonic()
        answer = read_head(sock)
        assert time.monotonic() - started < 5
    assert answer.startswith(b"HTTP/1.1 401"), answer[:100]


def test_the_app_refuses_to_start_with_a_route_that_declares_no_permission(
    tmp_path: Path,
) -> None:
    async def rogue(request: Any) -> Response:
        return Response("secret")

    module = types.ModuleType("rogue_routes")
    routes: Callable[[Any], list[Any]] = lambda ctx: [Route("/rogue", rogue)]  # noqa: E731
    module.routes = routes  # type: ignore[attr-defined]
    settings = load_settings(flags={"data_dir": str(tmp_path / "d")})
    store = open_store(tmp_path / "d")
    try:
        with pytest.raises(UndeclaredRoute, match="/rogue"):
            build_app(GatewayContext(store=store, settings=settings), modules=[module])
    finally:
        store.close()
