"""Everything a client can make the gateway hold has a limit: each one reached here, answered
429 with the limit's name (never a 5xx), counted in /metrics, and nothing written past it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.mirror import encode_replica_body
from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from log_store import open_store
from session_dedup.envelope import EnvelopeWriter
from tests.conftest import GatewayProcess, logbroker_cmd
from tests.gateway.conftest import end_offsets, meta

TOKEN = "limited-token"
ADMIN = "limited-admin"
CONFIG = f"""
partitions = 1
push_allow = ["127.0.0.1"]

[limits]
max_topics = {{max_topics}}
max_topics_per_token = {{max_topics}}  # the global limit's test (the share has tests of its own)
max_partitions_per_topic = 2
max_sources_per_partition = 2
max_subscriptions_per_token = 2
max_groups_per_token = 2
max_schema_versions = 2
max_structured_log_types = 2
max_fetch_positions = 2
auth_cache_entries = 4
max_staged_bytes = 1000
max_staged_bytes_per_token = 2000  # the global limit's test (the share has tests of its own)

[tokens.{TOKEN}]
write = ["*"]
read = ["*"]
replicate = ["*"]
metrics = true
[tokens.{ADMIN}]
admin = true
"""


def _start(base: Path, max_topics: int = 100) -> GatewayProcess:
    config = base / "gateway.toml"
    config.write_text(CONFIG.format(max_topics=max_topics))
    return GatewayProcess(base / "data", ["--config", str(config)], base / "gw.log").start()


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, httpx.Client]]:
    gateway = _start(tmp_path_factory.mktemp("limited"))
    http = httpx.Client(
        base_url=gateway.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    try:
        yield gateway, http
    finally:
        http.close()
        gateway.kill()


def _refusals(http: httpx.Client, limit: str) -> int:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(f'logbroker_limit_refusals_total{{limit="{limit}"}} '):
            return int(float(line.split()[-1]))
    return 0


def _write(http: httpx.Client, sections: list[tuple[dict[str, Any], list[int]]]) -> Any:
    body = encode_binary([(m, [(s, 0, b"x\n") for s in seqnos]) for m, seqnos in sections])
    return http.post("/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE})


def _assert_limit(response: httpx.Response, limit: str, maximum: int) -> None:
    assert response.status_code == 429, response.text
    assert response.json() | {"reason": ""} == {
        "error": "limit_reached",
        "reason": "",
        "limit": limit,
        "max": maximum,
    }


def test_a_partition_full_of_sources_refuses_a_new_source_alone(limited: Any) -> None:
    gateway, http = limited
    ok = _write(http, [(meta("src-1", "full"), [1]), (meta("src-2", "full"), [1])])
    assert ok.status_code == 200, ok.text
    before = end_offsets(gateway.data_dir)
    # a third source is refused on its own; the known ones go on writing in the same request
    mixed = _write(http, [(meta("src-3", "full"), [1]), (meta("src-1", "full"), [2])])
    assert mixed.status_code == 200, mixed.text
    refused, written = mixed.json()["results"]
    assert refused | {"reason": ""} == {
        "source_id": "src-3",
        "status": 429,
        "error": "limit_reached",
        "reason": "",
        "limit": "max_sources_per_partition",
        "max": 2,
    }
    assert [a["status"] for a in written["acks"]] == ["written"]
    assert end_offsets(gateway.data_dir)[("dc1.full", 0)] == before[("dc1.full", 0)] + 1
    # a fencing session would give the new source state: refused too, alone in a batch
    _assert_limit(
        http.post("/v1/sessions", json={**meta("src-4", "full"), "fence": True}),
        "max_sources_per_partition",
        2,
    )
    batch = http.post(
        "/v1/sessions",
        json={"sessions": [{**meta("src-4", "full"), "fence": True}, meta("src-1", "full")]},
    ).json()["sessions"]
    assert (batch[0]["status"], batch[0]["limit"]) == (429, "max_sources_per_partition")
    assert batch[1]["last_seqno"] == 2
    assert _refusals(http, "max_sources_per_partition") == 3


def test_too_many_subscriptions_of_one_token(limited: Any) -> None:
    _, http = limited
    for name in ("sub-1", "sub-2"):
        body = {"name": name, "endpoint": "http://127.0.0.1:9/h", "topics": ["dc1.x"]}
        assert http.post("/v1/subscriptions", json=body).status_code == 201
    third = {"name": "sub-3", "endpoint": "http://127.0.0.1:9/h", "topics": ["dc1.x"]}
    _assert_limit(http.post("/v1/subscriptions", json=third), "max_subscriptions_per_token", 2)
    names = {s["name"] for s in http.get("/v1/subscriptions").json()["subscriptions"]}
    assert names == {"sub-1", "sub-2"}
    assert _refusals(http, "max_subscriptions_per_token") == 1


def test_too_many_consumer_groups_of_one_token(limited: Any) -> None:
    _, http = limited
    assert _write(http, [(meta("g", "grouped"), [1])]).status_code == 200
    join = {"topics": ["dc1.grouped"], "reset": "earliest"}
    assert http.post("/v1/groups/g-1/members", json=join).status_code == 200
    # a commit without a member creates a group too
    offsets = {"offsets": [{"topic": "dc1.grouped", "partition": 0, "offset": 1}]}
    assert http.post("/v1/groups/g-2/offsets", json=offsets).status_code == 200
    _assert_limit(http.post("/v1/groups/g-3/members", json=join), "max_groups_per_token", 2)
    _assert_limit(http.post("/v1/groups/g-4/offsets", json=offsets), "max_groups_per_token", 2)
    assert http.get("/v1/groups/g-3").status_code == 404
    # the groups it holds go on working
    assert http.post("/v1/groups/g-1/members", json=join).status_code == 200
    assert http.post("/v1/groups/g-2/offsets", json=offsets).status_code == 200
    assert _refusals(http, "max_groups_per_token") == 2


def test_a_fetch_of_too_many_partitions(limited: Any) -> None:
    _, http = limited
    assert _write(http, [(meta("f", "fetched"), [1])]).status_code == 200
    # (the topic has one partition: the others are answered as not there)
    positions = [{"topic": "dc1.fetched", "partition": p, "offset": 0} for p in range(3)]
    _assert_limit(http.post("/v1/fetch", json={"partitions": positions}), "max_fetch_positions", 2)
    assert http.post("/v1/fetch", json={"partitions": positions[:2]}).status_code == 200
    assert _refusals(http, "max_fetch_positions") == 1


def test_a_replica_topic_over_the_partition_limit(limited: Any) -> None:
    gateway, http = limited
    value = EnvelopeWriter(source_id="s", server="h", file="f", log_type="app").encode(
        1, 0, 0, b"x\n"
    )
    response = http.post(
        "/v1/replica/dc9.app/partitions/0",
        params={"source": "src-topic-id", "partitions": 3, "start": 0},
        content=encode_replica_body([(0, value)]),
        headers={"content-type": "application/x-logbroker-records"},
    )
    _assert_limit(response, "max_partitions_per_topic", 2)
    assert ("dc9.app", 0) not in end_offsets(gateway.data_dir)
    assert _refusals(http, "max_partitions_per_topic") == 1


def _settings(data_dir: Path, topic: str) -> tuple[int, int | None, int | None]:
    with open_store(data_dir) as store:
        config = store.describe_topic(topic).config
    return config.partitions, config.retention_ms, config.retention_bytes


def test_an_operator_cannot_grow_a_topic_over_the_partition_limit(limited: Any) -> None:
    gateway, http = limited
    assert _write(http, [(meta("g", "grown"), [1])]).status_code == 200  # 1 partition
    admin = httpx.Client(
        base_url=gateway.url, timeout=30, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    before = _refusals(http, "max_partitions_per_topic")
    assert http.patch("/v1/topics/dc1.grown", json={"partitions": 2}).status_code == 403
    _assert_limit(
        admin.patch("/v1/topics/dc1.grown", json={"partitions": 3, "retention_ms": 1000}),
        "max_partitions_per_topic",
        2,
    )
    assert _settings(gateway.data_dir, "dc1.grown") == (1, None, None)  # nothing changed
    cli = subprocess.run(
        logbroker_cmd(
            "topics", "alter", "dc1.grown", "--server", gateway.url, "--token", ADMIN,
            "--partitions", "3", "--retention-hours", "1",
        ),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 2, cli.stderr
    assert "max_partitions_per_topic" in cli.stderr and "429 limit_reached" in cli.stderr
    assert _settings(gateway.data_dir, "dc1.grown") == (1, None, None)
    assert _refusals(http, "max_partitions_per_topic") == before + 2
    grown = admin.patch("/v1/topics/dc1.grown", json={"partitions": 2})
    assert grown.status_code == 200, grown.text
    assert grown.json()["partitions"] == 2
    shrunk = admin.patch("/v1/topics/dc1.grown", json={"partitions": 1})
    assert shrunk.status_code == 400 and "never shrink" in shrunk.json()["reason"]
    admin.close()


def test_an_operator_cannot_create_a_topic_over_the_partition_limit(limited: Any) -> None:
    gateway, http = limited
    admin = httpx.Client(
        base_url=gateway.url, timeout=30, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    before = _refusals(http, "max_partitions_per_topic")
    body = {"name": "dc1.planned", "partitions": 3}
    assert http.post("/v1/topics", json=body).status_code == 403  # a writer's token
    _assert_limit(admin.post("/v1/topics", json=body), "max_partitions_per_topic", 2)
    cli = subprocess.run(
        logbroker_cmd(
            "topics", "create", "dc1.planned", "--server", gateway.url, "--token", ADMIN,
            "--partitions", "3",
        ),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 2, cli.stderr
    assert "max_partitions_per_topic" in cli.stderr and "429 limit_reached" in cli.stderr
    assert ("dc1.planned", 0) not in end_offsets(gateway.data_dir)
    assert _refusals(http, "max_partitions_per_topic") == before + 2
    created = admin.post("/v1/topics", json=body | {"partitions": 2})
    assert created.status_code == 201, created.text
    assert _settings(gateway.data_dir, "dc1.planned") == (2, None, None)
    admin.close()


def test_legacy_uploads_stop_at_the_staging_limit(limited: Any) -> None:
    _, http = limited
    assert http.post("/store", params={"log_type": "old"}, content=b"x" * 600).status_code == 200
    over = http.post("/store", params={"log_type": "old"}, content=b"x" * 600)
    _assert_limit(over, "max_staged_bytes", 1000)
    assert _refusals(http, "max_staged_bytes") == 1


def test_the_auth_cache_is_bounded(limited: Any) -> None:
    _, http = limited
    for i in range(10):
        http.post("/v1/sessions", json=meta("s", f"cache-{i}"))
    text = http.get("/metrics").text
    assert "logbroker_auth_cache_resets_total " in text
    resets = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("logbroker_auth_cache_resets_total ")
    )
    entries = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("logbroker_auth_cache_entries ")
    )
    assert resets >= 2 and entries <= 4


def test_topics_stop_at_the_limit(tmp_path: Path) -> None:
    # the store's internal topic is one of the three
    gateway = _start(tmp_path, max_topics=3)
    try:
        http = httpx.Client(
            base_url=gateway.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert _write(http, [(meta("s", "one"), [1]), (meta("s", "two"), [1])]).status_code == 200
        _assert_limit(_write(http, [(meta("s", "three"), [1])]), "max_topics", 3)
        # beside a section of a topic that exists, the new log type's is refused alone
        mixed = _write(http, [(meta("s", "three"), [1]), (meta("s", "one"), [2])])
        assert mixed.status_code == 200, mixed.text
        refused, written = mixed.json()["results"]
        assert (refused["status"], refused["limit"], refused["max"]) == (429, "max_topics", 3)
        assert written["acks"][0]["status"] == "written"
        legacy = http.post("/store", params={"log_type": "four"}, content=b"x\n")
        staged = legacy.json()["store_id"]
        _assert_limit(http.post("/commit_request", params={"store_id": staged}), "max_topics", 3)
        topics = {name for name, _ in end_offsets(gateway.data_dir)}
        assert {t for t in topics if t.startswith("dc1.")} == {"dc1.one", "dc1.two"}
        assert end_offsets(gateway.data_dir)[("dc1.one", 0)] == 2
        assert _refusals(http, "max_topics") == 3
        # an operator's creation is held to the same limit
        admin = {"Authorization": f"Bearer {ADMIN}"}
        created = http.post("/v1/topics", json={"name": "dc1.five"}, headers=admin)
        _assert_limit(created, "max_topics", 3)
        cli = subprocess.run(
            logbroker_cmd("topics", "create", "dc1.five", "--server", gateway.url,
                          "--token", ADMIN),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 2 and "max_topics" in cli.stderr, cli.stderr
        assert {name for name, _ in end_offsets(gateway.data_dir)} == topics
        assert _refusals(http, "max_topics") == 5
        http.close()
    finally:
        gateway.kill()


def test_serve_refuses_a_partition_count_over_the_limit(tmp_path: Path) -> None:
    result = subprocess.run(
        logbroker_cmd(
            "serve", "--data-dir", str(tmp_path / "d"), "--partitions", "65", "--port", "0"
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "max_partitions_per_topic" in result.stderr


def _messages(http: httpx.Client, topic: str, partition: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    offset = 0
    while True:
        response = http.get(
            f"/v1/topics/{topic}/partitions/{partition}/messages", params={"offset": offset}
        )
        assert response.status_code == 200, response.text
        batch = response.json()
        messages.extend(batch["messages"])
        if batch["next_offset"] == offset:
            return messages
        offset = batch["next_offset"]


def test_many_more_partitions_than_open_files_allow(tmp_path: Path) -> None:
    # 30 topics of 2 partitions through a gateway that may keep 4 partitions open and may
    # open 160 files: every partition open at once would need several times that.
    config = tmp_path / "gateway.toml"
    config.write_text("partitions = 2\n[limits]\nmax_open_partitions = 4\n")
    gateway = GatewayProcess(
        tmp_path / "data", ["--config", str(config)], tmp_path / "gw.log", max_open_files=160
    ).start()
    topics = [f"many-{i}" for i in range(30)]
    sources = [f"src-{i}" for i in range(4)]
    try:
        http = httpx.Client(base_url=gateway.url, timeout=60)
        for first, last in ((1, 3), (1, 6)):  # the second round resends the first: duplicates
            for log_type in topics:
                body = _write(
                    http, [(meta(s, log_type), list(range(first, last + 1))) for s in sources]
                )
                assert body.status_code == 200, body.text
                statuses = [a["status"] for r in body.json()["results"] for a in r["acks"]]
                assert statuses == (
                    ["written"] * 3
                    if first == 1 and last == 3
                    else ["duplicate"] * 3 + ["written"] * 3
                ) * len(sources)
        for log_type in topics:
            seqnos: dict[str, list[int]] = {}
            for partition in (0, 1):
                for message in _messages(http, f"dc1.{log_type}", partition):
                    seqnos.setdefault(message["source_id"], []).append(message["seqno"])
            assert seqnos == {s: [1, 2, 3, 4, 5, 6] for s in sources}, log_type
        opened = next(
            float(line.split()[-1])
            for line in http.get("/metrics").text.splitlines()
            if line.startswith("logbroker_open_partitions ")
        )
        assert opened <= 4
        http.close()
    finally:
        gateway.kill()
    assert "Too many open files" not in gateway.log()


def _schema(*fields: str) -> dict[str, Any]:
    return {
        "schema": {
            "type": "record",
            "name": "Line",
            "fields": [{"name": "a", "type": "string"}]
            + [{"name": f, "type": "string", "default": ""} for f in fields],
        }
    }


def test_too_many_schema_versions_of_one_log_type(limited: Any) -> None:
    _, http = limited
    assert http.post("/v1/schemas/versioned/versions", json=_schema()).status_code == 201
    assert http.post("/v1/schemas/versioned/versions", json=_schema("b")).status_code == 201
    _assert_limit(
        http.post("/v1/schemas/versioned/versions", json=_schema("b", "c")),
        "max_schema_versions",
        2,
    )
    described = http.get("/v1/schemas/versioned").json()
    assert [v["version"] for v in described["versions"]] == [1, 2]
    # a schema the log type already has is still answered with its version
    again = http.post("/v1/schemas/versioned/versions", json=_schema("b"))
    assert (again.status_code, again.json()["version"]) == (200, 2)
    assert _refusals(http, "max_schema_versions") == 1


def test_too_many_structured_log_types(limited: Any) -> None:
    _, http = limited
    known = set(http.get("/v1/schemas").json()["log_types"])
    for log_type in ("typed-1", "typed-2"):
        if len(known) < 2:
            assert http.post(f"/v1/schemas/{log_type}/versions", json=_schema()).status_code == 201
            known.add(log_type)
    refused = {"compatibility": "none"}
    _assert_limit(
        http.put("/v1/schemas/typed-3/compatibility", json=refused),
        "max_structured_log_types",
        2,
    )
    _assert_limit(
        http.post("/v1/schemas/typed-3/versions", json=_schema()), "max_structured_log_types", 2
    )
    assert http.get("/v1/schemas/typed-3").status_code == 404
    assert set(http.get("/v1/schemas").json()["log_types"]) == known
    # the log types it holds take new versions
    name = sorted(known)[0]
    assert http.post(f"/v1/schemas/{name}/versions", json=_schema()).status_code in (200, 201)
