"""Push delivery follows the subscription owner's current read grant: a topic its owner may no
longer read (grant narrowed, token removed, gateway restarted with the new tokens) is
suspended, and resumes exactly where it stopped once the grant is back."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from ingest_api.auth import Authorizer
from ingest_api.delivery_parts import TokenGrants
from ingest_api.settings import TokenGrant
from tests.delivery.conftest import PUSH_TO_LOOPBACK, Writer, wait_until

_WRITER = '[tokens.tw]\nwrite = ["*"]\n\n[tokens.ta]\nadmin = true\n\n'


def _config(tmp_path: Path, name: str, reader_read: list[str] | None) -> Path:
    """Tokens: a writer, an admin, and (unless ``reader_read`` is None) ``tr`` named reader."""
    text = _WRITER
    if reader_read is not None:
        globs = ", ".join(f'"{g}"' for g in reader_read)
        text += f'[tokens.tr]\nname = "reader"\nread = [{globs}]\n'
    path = tmp_path / name
    path.write_text(text)
    return path


def _as(url: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30.0)


def _pushed(endpoint: Any) -> Counter[tuple[str, int, int]]:
    return Counter((m["topic"], m["partition"], m["offset"]) for m in endpoint.messages())


def _of(endpoint: Any, topic: str) -> int:
    return sum(1 for m in endpoint.messages() if m["topic"] == topic)


def _suspended_gauge(url: str) -> float:
    scrape = httpx.get(url + "/metrics", headers={"Authorization": "Bearer ta"})  # the admin
    scrape.raise_for_status()
    for line in scrape.text.splitlines():
        if line.startswith("logbroker_push_suspended_topics "):
            return float(line.split()[1])
    raise AssertionError("no logbroker_push_suspended_topics in /metrics")


def test_push_stops_when_owner_loses_read_and_resumes_where_it_stopped(
    tmp_path: Path, start_gateway: Any, push_endpoint: Any
) -> None:
    data = tmp_path / "data"
    full = _config(tmp_path, "full.toml", ["dc1.other", "dc1.kept"])
    narrowed = _config(tmp_path, "narrowed.toml", ["dc1.kept"])
    removed = _config(tmp_path, "removed.toml", None)
    endpoint = push_endpoint(lambda n: ("ok", 200))
    seqno = {"other": 0, "kept": 0}

    def write(url: str, log_type: str, count: int) -> None:
        writer = Writer(url, token="tw")
        first = seqno[log_type] + 1
        seqno[log_type] += count
        writer.write(f"{log_type}-src", range(first, first + count), log_type=log_type)
        writer.close()

    gw = start_gateway(data, "--config", str(full), *PUSH_TO_LOOPBACK)
    sub = {
        "name": "s8",
        "endpoint": endpoint.url,
        "topics": ["dc1.other", "dc1.kept"],
        "linger_ms": 20,
    }
    assert _as(gw.url, "tr").post("/v1/subscriptions", json=sub).status_code == 201
    write(gw.url, "other", 3)
    write(gw.url, "kept", 3)
    wait_until(lambda: len(endpoint.messages()) == 6, 15, "the first 6 messages")
    assert _as(gw.url, "ta").get("/v1/subscriptions/s8").json()["suspended"] == []
    gw.stop()

    # The read of dc1.other is taken away: dc1.kept goes on, dc1.other waits.
    gw = start_gateway(data, "--config", str(narrowed), *PUSH_TO_LOOPBACK)
    write(gw.url, "other", 3)
    write(gw.url, "kept", 3)
    wait_until(lambda: _of(endpoint, "dc1.kept") == 6, 15, "dc1.kept's next 3")
    time.sleep(0.5)  # dc1.other's would have come in the same batch, or the next
    assert _of(endpoint, "dc1.other") == 3
    wait_until(lambda: _suspended_gauge(gw.url) == 1, 5, "the gauge to count dc1.other")
    status = _as(gw.url, "ta").get("/v1/subscriptions/s8").json()
    assert status["owner"] == "reader"
    assert [s["topic"] for s in status["suspended"]] == ["dc1.other"]
    assert "may not read topic 'dc1.other'" in status["suspended"][0]["reason"]
    assert "push s8: suspended for topic dc1.other" in gw.log()
    gw.stop()

    # The token is removed: nothing is delivered at all.
    gw = start_gateway(data, "--config", str(removed), *PUSH_TO_LOOPBACK)
    write(gw.url, "other", 2)
    write(gw.url, "kept", 2)
    time.sleep(1.0)  # delivery takes a few ms here
    assert len(endpoint.messages()) == 9
    wait_until(lambda: _suspended_gauge(gw.url) == 2, 5, "the gauge to count both topics")
    status = _as(gw.url, "ta").get("/v1/subscriptions/s8").json()
    assert [s["topic"] for s in status["suspended"]] == ["dc1.kept", "dc1.other"]
    assert all("no configured token is named 'reader'" in s["reason"] for s in status["suspended"])
    assert _as(gw.url, "tr").get("/v1/subscriptions/s8").status_code == 401
    gw.stop()
    assert len(endpoint.messages()) == 9  # nothing came through while the token was gone

    # The grant is back: what was held back comes, once, and nothing else.
    gw = start_gateway(data, "--config", str(full), *PUSH_TO_LOOPBACK)
    wait_until(lambda: len(endpoint.messages()) == 16, 15, "the held-back messages")
    pushed = _pushed(endpoint)
    assert max(pushed.values()) == 1, "a message was pushed twice"
    assert _of(endpoint, "dc1.other") == 8 and _of(endpoint, "dc1.kept") == 8
    status = _as(gw.url, "ta").get("/v1/subscriptions/s8").json()
    assert status["suspended"] == []
    assert all(p["lag"] == 0 for p in status["partitions"])
    assert "push s8: resumed for topic dc1.other" in gw.log()


def test_subscription_made_without_auth_is_suspended_once_tokens_are_on(
    tmp_path: Path, start_gateway: Any, push_endpoint: Any
) -> None:
    data = tmp_path / "data"
    endpoint = push_endpoint(lambda n: ("ok", 200))
    gw = start_gateway(data, *PUSH_TO_LOOPBACK)
    sub = {"name": "open", "endpoint": endpoint.url, "topics": ["dc1.app"], "linger_ms": 20}
    assert httpx.post(gw.url + "/v1/subscriptions", json=sub).status_code == 201
    Writer(gw.url).write("a", [1, 2])
    wait_until(lambda: len(endpoint.messages()) == 2, 15, "the first 2 messages")
    gw.stop()

    config = _config(tmp_path, "tokens.toml", ["dc1.*"])
    gw = start_gateway(data, "--config", str(config), *PUSH_TO_LOOPBACK)
    Writer(gw.url, token="tw").write("a", [3, 4])
    time.sleep(1.0)
    assert len(endpoint.messages()) == 2
    wait_until(lambda: _suspended_gauge(gw.url) == 1, 5, "the gauge to count dc1.app")
    status = _as(gw.url, "ta").get("/v1/subscriptions/open").json()
    assert status["owner"] is None
    assert "made while auth was off" in status["suspended"][0]["reason"]
    gw.stop()

    gw = start_gateway(data, *PUSH_TO_LOOPBACK)  # auth off again: it goes on where it stopped
    wait_until(lambda: len(endpoint.messages()) == 4, 15, "the held-back messages")
    assert max(_pushed(endpoint).values()) == 1


def test_token_grants_name_why_an_owner_may_not_read() -> None:
    reader = TokenGrant(read_topics=("dc1.web-*",), owner="reader", name="reader")
    admin = TokenGrant(admin=True, owner="ops", name="ops")
    grants = TokenGrants(Authorizer({"t1": reader, "t2": reader, "t3": admin}))
    assert grants.refusal("reader", "dc1.web-access") is None
    assert grants.refusal("ops", "dc1.anything") is None
    assert "may not read topic 'dc1.app'" in str(grants.refusal("reader", "dc1.app"))
    assert "no configured token is named 'gone'" in str(grants.refusal("gone", "dc1.web-a"))
    assert "made while auth was off" in str(grants.refusal(None, "dc1.web-a"))
    assert TokenGrants(Authorizer({})).refusal(None, "dc1.app") is None  # auth off
