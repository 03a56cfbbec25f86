"""A prefix group or subscription needs a read glob that covers every topic under the prefix,
judged on the glob's structure: ``dc1.ap?`` matches the literal string ``dc1.ap*`` but reads
only 7-character names, so it must not open the prefix ``dc1.ap`` (and ``dc1.apple-secret``'s
name, partitions and end offsets with it).  What a group answers is filtered by the token's
read grant as well."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from tests.conftest import GatewayProcess
from tests.gateway.conftest import meta

WRITER = "tok-writer"
ONE_CHAR = "tok-one-char"
BY_PREFIX = "tok-by-prefix"
BROAD = "tok-broad"
CONFIG = f"""
partitions = 2
push_allow = ["127.0.0.1"]

[tokens.{WRITER}]
name = "writer"
write = ["*"]

[tokens.{ONE_CHAR}]
name = "one-char"
read = ["dc1.ap?", "dc1.a[p]*"]

[tokens.{BY_PREFIX}]
name = "by-prefix"
read = ["dc1.ap*"]

[tokens.{BROAD}]
name = "broad"
read = {{broad_read}}
"""


def _start(base: Path, broad_read: str = '["dc1.*"]') -> GatewayProcess:
    config = base / "gateway.toml"
    config.write_text(CONFIG.format(broad_read=broad_read))
    return GatewayProcess(base / "data", ["--config", str(config)], base / "gw.log").start()


def _http(gateway: GatewayProcess, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.url, timeout=30, headers={"Authorization": f"Bearer {token}"}
    )


def _write_topics(gateway: GatewayProcess, *log_types: str) -> None:
    body = encode_binary([(meta("s", log_type), [(1, 0, b"x\n")]) for log_type in log_types])
    written = _http(gateway, WRITER).post(
        "/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE}
    )
    assert written.status_code == 200, written.text


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    started = _start(tmp_path_factory.mktemp("prefix-grants"))
    _write_topics(started, "apple-secret", "apx")
    yield started
    started.kill()


def test_a_glob_with_one_character_wildcards_does_not_open_a_prefix(
    gateway: GatewayProcess,
) -> None:
    one_char = _http(gateway, ONE_CHAR)
    join = one_char.post("/v1/groups/gq/members", json={"prefix": "dc1.ap", "reset": "earliest"})
    assert join.status_code == 403, join.text
    assert "every topic under the prefix 'dc1.ap'" in join.json()["reason"]
    subscription = {"name": "sq", "endpoint": "http://127.0.0.1:9/h", "prefix": "dc1.ap"}
    assert one_char.post("/v1/subscriptions", json=subscription).status_code == 403
    # nothing was made: the group does not exist, so the token may create it by topic
    assert one_char.get("/v1/groups/gq").status_code == 404
    by_topic = one_char.post("/v1/groups/gq/members", json={"topics": ["dc1.apx"]})
    assert by_topic.status_code == 200, by_topic.text
    assert {a["topic"] for a in by_topic.json()["assignment"]} == {"dc1.apx"}


def test_a_glob_ending_in_a_star_opens_every_prefix_it_covers(gateway: GatewayProcess) -> None:
    by_prefix = _http(gateway, BY_PREFIX)
    for prefix in ("dc1.ap", "dc1.app"):
        join = by_prefix.post(f"/v1/groups/gp-{prefix}/members", json={"prefix": prefix})
        assert join.status_code == 200, join.text
    joined = by_prefix.post("/v1/groups/gp/members", json={"prefix": "dc1.ap", "reset": "earliest"})
    assert {a["topic"] for a in joined.json()["assignment"]} == {"dc1.apple-secret", "dc1.apx"}
    # a shorter prefix reaches topics the glob does not cover
    assert by_prefix.post("/v1/groups/gp2/members", json={"prefix": "dc1.a"}).status_code == 403
    assert by_prefix.post("/v1/groups/gp3/members", json={"prefix": "dc1."}).status_code == 403


def test_a_group_answers_only_with_topics_its_token_may_read(tmp_path: Path) -> None:
    gateway = _start(tmp_path)
    try:
        _write_topics(gateway, "apple-secret", "apx")
        join = _http(gateway, BROAD).post(
            "/v1/groups/gb/members",
            json={"prefix": "dc1.ap", "reset": "earliest", "session_timeout_ms": 300_000},
        )
        assert join.status_code == 200, join.text
        member = join.json()["member_id"]
        assert {a["topic"] for a in join.json()["assignment"]} == {"dc1.apple-secret", "dc1.apx"}
    finally:
        gateway.stop()
    # the operator narrows the token's grant; the group it made stays
    gateway = _start(tmp_path, broad_read='["dc1.apx"]')
    try:
        broad = _http(gateway, BROAD)
        beat = broad.post(f"/v1/groups/gb/members/{member}/heartbeat", json={})
        assert beat.status_code == 200, beat.text
        assert {a["topic"] for a in beat.json()["assignment"]} == {"dc1.apx"}
        described = broad.get("/v1/groups/gb")
        assert described.status_code == 200, described.text
        assert {p["topic"] for p in described.json()["partitions"]} == {"dc1.apx"}
    finally:
        gateway.kill()
