"""A gateway without tokens answers only its own names: no DNS rebinding, no page's request."""

from __future__ import annotations

from typing import Any

import httpx

from tests.gateway.conftest import end_offsets, meta

_ALLOWED = (
    "127.0.0.1",
    "localhost",
    "LOCALHOST.",
    "dashboard.localhost",
    "[::1]",
    "10.1.2.3",  # an address: nothing to rebind
    "gw1.example",  # allowed_hosts
    "corp.example",  # ".corp.example" in allowed_hosts: it and every name under it
    "a.b.corp.example",
    "peer-name.example",  # the advertised URL's host
)
_REFUSED = (
    "attacker.example",
    "gw1.example.attacker.example",
    "xcorp.example",
    "localhost.attacker.example",
)


def test_a_tokenless_gateway_refuses_a_host_name_that_is_not_its_own(start_gateway: Any) -> None:
    gateway = start_gateway(
        None,
        "--allowed-host",
        "gw1.example",
        "--allowed-host",
        ".corp.example",
        "--advertised-url",
        "http://peer-name.example:9999",
    )
    http = httpx.Client(base_url=gateway.url, timeout=30)
    for name in _ALLOWED:
        for host in (name, f"{name}:{gateway.port}"):
            answer = http.get("/v1/topics", headers={"host": host})
            assert answer.status_code == 200, (host, answer.text)
    before = end_offsets(gateway.data_dir)
    for name in _REFUSED:
        # what a page whose name was rebound to 127.0.0.1 sends: same origin to the browser
        host = f"{name}:{gateway.port}"
        listed = http.get("/v1/topics", headers={"host": host})
        assert listed.status_code == 421, listed.text
        assert listed.json()["error"] == "misdirected_host"
        assert "allowed_hosts" in listed.json()["reason"]
        sessions = http.post("/v1/sessions", json=meta("rebound"), headers={"host": host})
        assert sessions.status_code == 421
        subscribed = http.post(
            "/v1/subscriptions",
            json={"name": "exfil", "topics": ["dc1.*"], "endpoint": "https://attacker.example/"},
            headers={"host": host},
        )
        assert subscribed.status_code == 421
        staged = http.post(
            "/store", params={"log_type": "app"}, content=b"x\n", headers={"host": host}
        )
        assert staged.status_code == 421
    assert end_offsets(gateway.data_dir) == before
    assert http.get("/v1/subscriptions").json()["subscriptions"] == []
    # the public routes too: a rebound page learns nothing, not even that a gateway is there
    assert http.get("/healthz", headers={"host": "attacker.example"}).status_code == 421
    assert http.get("/ui", headers={"host": "localhost"}).status_code == 200
    http.close()


def test_a_page_of_another_origin_is_refused_on_a_tokenless_gateway(shared_gateway: Any) -> None:
    http = httpx.Client(base_url=shared_gateway.url, timeout=30)
    # a text/plain POST needs no preflight: the legacy /store takes any body, so only the
    # page's Origin shows where it comes from
    for origin in ("http://attacker.example", "null", "http://203.0.113.9", "https://x.y:1"):
        staged = http.post(
            "/store",
            params={"log_type": "app"},
            content=b"line\n",
            headers={"content-type": "text/plain", "origin": origin},
        )
        assert staged.status_code == 403, (origin, staged.text)
        assert staged.json()["error"] == "cross_origin"
        assert "allowed_hosts" in staged.json()["reason"]
    # the gateway's own pages (the dashboard) and clients that are no browser pass
    for origin in (shared_gateway.url, "http://localhost:3000", "http://[::1]", None):
        headers = {"content-type": "text/plain"}
        if origin is not None:
            headers["origin"] = origin
        staged = http.post("/store", params={"log_type": "app"}, content=b"x\n", headers=headers)
        assert staged.status_code == 200, (origin, staged.text)
    http.close()


def test_a_gateway_with_tokens_does_not_look_at_the_host(start_gateway: Any, tmp_path: Any) -> None:
    # a page has no token to send; names a balancer or a proxy gives stay usable
    config = tmp_path / "gateway.toml"
    config.write_text('[tokens.s3cr3t]\nread = ["dc1.*"]\n')
    config.chmod(0o600)
    gateway = start_gateway(None, "--config", str(config))
    answer = httpx.get(
        gateway.url + "/v1/topics",
        headers={"host": "logs.example", "authorization": "Bearer s3cr3t"},
    )
    assert answer.status_code == 200, answer.text
