"""Push targets: the gateway never POSTs to loopback, private, link-local or metadata addresses
unless its operator allowed them, checked on the address it connects to; no redirects."""

from __future__ import annotations

import ipaddress
from typing import Any

import httpx
import pytest

from delivery.push_targets import PushTargetPolicy
from tests.delivery.conftest import PUSH_TO_LOOPBACK, wait_until


def _subscription(name: str, endpoint: str) -> dict[str, Any]:
    return {"name": name, "endpoint": endpoint, "topics": ["dc1.app"], "linger_ms": 10}


def _last_error(url: str, name: str) -> str:
    status = httpx.get(f"{url}/v1/subscriptions/{name}").json()
    return str((status.get("last_error") or {}).get("error", ""))


def test_subscriptions_to_internal_addresses_are_refused_and_nothing_is_sent(
    gateway: Any, writer_for: Any, push_endpoint: Any
) -> None:
    writer_for(gateway.url).write("s", [1, 2, 3])
    local = push_endpoint(lambda n: ("ok", 200))
    port = local.url.split(":")[2].split("/")[0]
    targets = [
        f"http://127.0.0.1:{port}/hook",
        f"http://localhost:{port}/hook",  # a name that resolves to loopback
        f"http://[::1]:{port}/hook",
        f"http://[::ffff:127.0.0.1]:{port}/hook",
        f"http://[2002:7f00:1::]:{port}/hook",  # 6to4 of 127.0.0.1
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://224.0.0.1/hook",
    ]
    for i, endpoint in enumerate(targets):
        response = httpx.post(
            f"{gateway.url}/v1/subscriptions", json=_subscription(f"s{i}", endpoint)
        )
        assert response.status_code == 400, (endpoint, response.text)
        assert response.json()["error"] == "endpoint_refused", endpoint
    assert httpx.get(f"{gateway.url}/v1/subscriptions").json() == {"subscriptions": []}
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert f"logbroker_push_targets_refused_total {len(targets)}" in metrics
    assert local.requests == 0


def test_a_refused_host_name_is_answered_without_the_address_it_resolves_to(
    gateway: Any,
) -> None:
    """Before: ``push endpoint host 'localhost' (127.0.0.1) is not a public address``: a
    client could map internal names to addresses through the gateway's DNS answers."""
    response = httpx.post(
        f"{gateway.url}/v1/subscriptions", json=_subscription("named", "http://localhost:9/hook")
    )
    assert response.status_code == 400, response.text
    reason = response.json()["reason"]
    assert reason == (
        "push endpoint host 'localhost' is not a public address and not in the gateway's "
        "push_allow networks"
    )
    # the operator's log has the addresses
    wait_until(
        lambda: any(
            "'localhost' refused: it resolves to" in line and "127.0.0.1" in line
            for line in gateway.log().splitlines()
        ),
        10,
        "the log line naming the addresses",
    )


def test_the_address_is_checked_again_on_every_connection(
    start_gateway: Any, writer_for: Any, push_endpoint: Any, tmp_path: Any
) -> None:
    endpoint = push_endpoint(lambda n: ("ok", 200))
    via_name = endpoint.url.replace("127.0.0.1", "localhost")
    allowed = start_gateway(tmp_path / "data", *PUSH_TO_LOOPBACK)
    writer_for(allowed.url).write("s", [1, 2])
    created = httpx.post(f"{allowed.url}/v1/subscriptions", json=_subscription("hook", via_name))
    assert created.status_code == 201, created.text
    wait_until(lambda: len(endpoint.messages()) == 2, 20, "delivery while loopback is allowed")
    allowed.stop()
    requests = endpoint.requests
    # the same subscription, now on a gateway whose operator does not allow loopback
    strict = start_gateway(tmp_path / "data")
    writer_for(strict.url).write("s", [3, 4])
    wait_until(
        lambda: "not a public address" in _last_error(strict.url, "hook"),
        20,
        "the refused connection to be reported",
    )
    assert endpoint.requests == requests  # nothing was sent


def test_redirects_are_not_followed(
    start_gateway: Any, writer_for: Any, push_endpoint: Any
) -> None:
    target = push_endpoint(lambda n: ("ok", 200))
    redirecting = push_endpoint(lambda n: ("redirect", 307))
    redirecting.location = target.url
    gw = start_gateway(None, *PUSH_TO_LOOPBACK)
    writer_for(gw.url).write("s", [1])
    created = httpx.post(f"{gw.url}/v1/subscriptions", json=_subscription("moved", redirecting.url))
    assert created.status_code == 201
    wait_until(
        lambda: "redirects are not followed" in _last_error(gw.url, "moved"),
        20,
        "the redirect to be reported",
    )
    assert redirecting.requests >= 1
    assert target.requests == 0


@pytest.mark.parametrize(
    "address",
    [
        "::ffff:127.0.0.1",
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
        "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
        "2001:0:7f00:1::80ff:fffe",  # Teredo, server 127.0.0.1, client 127.0.0.1
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, public server, client 10.0.0.1
        "2001:0:a00:1:8000:63bf:3fff:fdd2",  # Teredo, server 10.0.0.1, public client
    ],
)
def test_an_internal_ipv4_address_inside_ipv6_is_refused(address: str) -> None:
    policy = PushTargetPolicy.from_config([])
    assert not policy.allows(ipaddress.ip_address(address))


def test_an_embedded_address_the_operator_allows_is_allowed() -> None:
    policy = PushTargetPolicy.from_config(["127.0.0.1"])
    assert policy.allows(ipaddress.ip_address("2002:7f00:1::"))
    assert policy.allows(ipaddress.ip_address("::ffff:127.0.0.1"))
    assert not policy.allows(ipaddress.ip_address("2002:a00:1::1"))
    # a 6to4 address of a public IPv4 address stays public
    assert PushTargetPolicy().allows(ipaddress.ip_address("2002:808:808::1"))
