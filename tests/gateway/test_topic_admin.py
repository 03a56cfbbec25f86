"""``POST /v1/topics``, ``PATCH`` and ``DELETE /v1/topics/{topic}``: an operator's new topic, a
retention change taken back to unlimited, a deleted topic that leaves nothing to the next of
its name; what they refuse changes nothing.  On this gateway without tokens (loopback only)
anyone is the operator; with tokens: test_limits.py and test_route_authorization.py."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import httpx

from delivery.internal_state import INTERNAL_TOPIC
from log_store import TopicConfig, open_store
from tests.conftest import logbroker_cmd
from tests.gateway.conftest import Client, source_seqnos


def _retention(data_dir: Any, topic: str) -> tuple[int | None, int | None]:
    with open_store(data_dir) as store:
        config = store.describe_topic(topic).config
    return config.retention_ms, config.retention_bytes


def test_a_topics_retention_is_set_and_taken_back_to_unlimited(shared_gateway: Any) -> None:
    writer = Client(shared_gateway.url)
    assert writer.acks("kept-src", [1], log_type="kept")[0]["status"] == "written"
    writer.close()
    http = httpx.Client(base_url=shared_gateway.url, timeout=30)
    url = "/v1/topics/dc1.kept"
    limited = http.patch(url, json={"retention_ms": 3_600_000, "retention_bytes": 5000})
    assert limited.status_code == 200, limited.text
    assert limited.json() | {"topic_id": ""} == {
        "name": "dc1.kept",
        "topic_id": "",
        "partitions": 4,
        "retention_ms": 3_600_000,
        "retention_bytes": 5000,
        "segment_bytes": limited.json()["segment_bytes"],
    }
    unlimited = http.patch(url, json={"retention_ms": None})
    assert unlimited.status_code == 200, unlimited.text
    assert (unlimited.json()["retention_ms"], unlimited.json()["retention_bytes"]) == (None, 5000)
    assert _retention(shared_gateway.data_dir, "dc1.kept") == (None, 5000)
    cli = subprocess.run(
        logbroker_cmd(
            "topics", "alter", "dc1.kept", "--server", shared_gateway.url,
            "--retention-bytes", "unlimited",
        ),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert "retention_ms=unlimited  retention_bytes=unlimited" in cli.stdout  # as typed
    assert _retention(shared_gateway.data_dir, "dc1.kept") == (None, None)
    # what a careless or hostile caller may send: refused, and nothing changes
    for body, status in (
        ({"retention_ms": -5}, 400),
        ({"retention_ms": "72h"}, 400),
        ({"retention_bytes": True}, 400),
        ({"partitions": 2}, 400),  # never shrinks
        ({"partitions": 0}, 400),
        ({"segment_bytes": 1}, 400),
        ({"retention_ms": 1, "partitions": 3}, 400),  # the shrink refuses the whole change
        ({"retention": None}, 400),
        ({}, 400),
    ):
        refused = http.patch(url, json=body)
        assert refused.status_code == status, (body, refused.text)
        assert set(refused.json()) >= {"error", "reason"}, body
    assert _retention(shared_gateway.data_dir, "dc1.kept") == (None, None)
    as_text = http.patch(
        url, content=b'{"retention_ms": 1}', headers={"content-type": "text/plain"}
    )
    assert as_text.status_code == 415
    assert http.patch("/v1/topics/dc1.nothing", json={"retention_ms": 1}).status_code == 404
    internal = http.patch(f"/v1/topics/{INTERNAL_TOPIC}", json={"retention_ms": 1})
    assert internal.status_code == 400 and "internal" in internal.json()["reason"]
    assert _retention(shared_gateway.data_dir, "dc1.kept") == (None, None)
    http.close()


def test_the_audit_topic_is_bounded_by_retention_not_deleted(shared_gateway: Any) -> None:
    """Before: the route deleted it, while ``logbroker topics delete`` refused to."""
    http = httpx.Client(base_url=shared_gateway.url, timeout=30)
    audit_topic = "dc1.logbroker-audit"
    if http.get(f"/v1/topics/{audit_topic}").status_code == 404:
        created = http.post("/v1/topics", json={"name": audit_topic, "partitions": 1})
        assert created.status_code == 201, created.text
    refused = http.delete(f"/v1/topics/{audit_topic}")
    assert refused.status_code == 400, refused.text
    assert "retention" in refused.json()["reason"]
    assert audit_topic in _catalog(shared_gateway.data_dir)
    bounded = http.patch(f"/v1/topics/{audit_topic}", json={"retention_ms": 86_400_000})
    assert bounded.status_code == 200, bounded.text
    http.close()


def _catalog(data_dir: Any) -> dict[str, tuple[str, TopicConfig]]:
    with open_store(data_dir) as store:
        return {info.name: (info.topic_id, info.config) for info in store.list_topics()}


def test_an_operator_creates_a_topic_and_writes_go_into_it(shared_gateway: Any) -> None:
    http = httpx.Client(base_url=shared_gateway.url, timeout=30)
    created = http.post(
        "/v1/topics",
        json={
            "name": "dc1.made",
            "partitions": 3,
            "retention_ms": 3_600_000,
            "retention_bytes": None,
        },
    )
    assert created.status_code == 201, created.text
    made = created.json()
    assert made | {"topic_id": ""} == {
        "name": "dc1.made",
        "topic_id": "",
        "partitions": 3,
        "retention_ms": 3_600_000,
        "retention_bytes": None,
        "segment_bytes": TopicConfig().segment_bytes,
    }
    writer = Client(shared_gateway.url)
    assert writer.acks("made-src", [1, 2], log_type="made")[0]["status"] == "written"
    writer.close()
    described = http.get("/v1/topics/dc1.made").json()
    assert described["topic_id"] == made["topic_id"]  # the write used it, did not make another
    assert len(described["partitions"]) == 3
    assert sum(p["end_offset"] for p in described["partitions"]) == 2
    # a setting left out is the gateway's: its partitions (4), no retention
    default = http.post("/v1/topics", json={"name": "dc1.made-default"})
    assert default.status_code == 201, default.text
    assert (default.json()["partitions"], default.json()["retention_ms"]) == (4, None)
    cli = subprocess.run(
        logbroker_cmd("topics", "--server", shared_gateway.url, "create", "dc1.made-by-cli",
                      "--partitions", "2", "--retention-hours", "1", "--json"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) | {"topic_id": ""} == {
        "name": "dc1.made-by-cli",
        "topic_id": "",
        "partitions": 2,
        "retention_ms": 3_600_000,
        "retention_bytes": None,
        "segment_bytes": TopicConfig().segment_bytes,
    }
    again = subprocess.run(
        logbroker_cmd("topics", "--server", shared_gateway.url, "create", "dc1.made"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert again.returncode == 2
    assert "topic 'dc1.made' exists (409 topic_exists)" in again.stderr
    http.close()


def test_a_refused_creation_creates_and_changes_nothing(shared_gateway: Any) -> None:
    http = httpx.Client(base_url=shared_gateway.url, timeout=30)
    assert http.post("/v1/topics", json={"name": "dc1.taken", "partitions": 2}).status_code == 201
    before = _catalog(shared_gateway.data_dir)
    for body, status in (
        ({"name": "dc1.taken", "partitions": 3}, 409),  # neither recreated nor grown
        ({"name": "dc1.taken"}, 409),
        ({"name": "../dc1.up"}, 400),
        ({"name": "dc1/web"}, 400),
        ({"name": "Dc1.Web"}, 400),
        ({"name": "a" * 202}, 400),
        ({"name": ""}, 400),
        ({"name": 7}, 400),
        ({"partitions": 2}, 400),
        ({}, 400),
        ({"name": INTERNAL_TOPIC}, 400),
        ({"name": "dc1.new", "partitions": -1}, 400),
        ({"name": "dc1.new", "partitions": 0}, 400),
        ({"name": "dc1.new", "partitions": 2**63}, 400),
        ({"name": "dc1.new", "partitions": 65}, 429),  # max_partitions_per_topic (64)
        ({"name": "dc1.new", "partitions": 2**63 - 1}, 429),
        ({"name": "dc1.new", "partitions": "2"}, 400),
        ({"name": "dc1.new", "partitions": 2.0}, 400),
        ({"name": "dc1.new", "retention_ms": -1}, 400),
        ({"name": "dc1.new", "segment_bytes": 1}, 400),
        ({"name": "dc1.new", "colour": "red"}, 400),
    ):
        refused = http.post("/v1/topics", json=body)
        assert refused.status_code == status, (body, refused.text)
        assert set(refused.json()) >= {"error", "reason"}, body
        if status == 429:
            assert refused.json()["limit"] == "max_partitions_per_topic", body
    for content, media, status in (
        (b'{"name": "dc1.new"}', "text/plain", 415),
        (b'{"name": "dc1.new"', "application/json", 400),
        (b'["dc1.new"]', "application/json", 400),
    ):
        refused = http.post("/v1/topics", content=content, headers={"content-type": media})
        assert refused.status_code == status, (content, refused.text)
    assert _catalog(shared_gateway.data_dir) == before
    http.close()


def test_an_operator_deletes_a_topic_and_nothing_of_it_passes_to_the_next(
    shared_gateway: Any,
) -> None:
    http = httpx.Client(base_url=shared_gateway.url, timeout=30)
    writer = Client(shared_gateway.url)
    assert [a["status"] for a in writer.acks("doomed-src", [1, 2, 3], log_type="doomed")] == [
        "written"
    ] * 3
    pinned = writer.session("doomed-src", log_type="doomed")["partition"]
    old_id = http.get("/v1/topics/dc1.doomed").json()["topic_id"]
    item = {"topic": "dc1.doomed", "partition": pinned, "offset": 2}
    committed = http.post("/v1/groups/doomed-readers/offsets", json={"offsets": [item]})
    assert committed.status_code == 200, committed.text
    before = _catalog(shared_gateway.data_dir)
    for path, status in (
        (f"/v1/topics/{INTERNAL_TOPIC}", 400),
        ("/v1/topics/Dc1.doomed", 400),
        ("/v1/topics/dc1.never-made", 404),
    ):
        refused = http.delete(path)
        assert refused.status_code == status, (path, refused.text)
    assert _catalog(shared_gateway.data_dir) == before

    deleted = http.delete("/v1/topics/dc1.doomed")
    assert deleted.status_code == 200, deleted.text
    assert (deleted.json()["name"], deleted.json()["topic_id"]) == ("dc1.doomed", old_id)
    assert http.get("/v1/topics/dc1.doomed").status_code == 404
    assert f"topic dc1.doomed (id {old_id}) and its data deleted" in shared_gateway.log()
    assert not (shared_gateway.data_dir / "topics" / "dc1.doomed" / old_id).exists()
    assert _catalog(shared_gateway.data_dir) == {
        name: kept for name, kept in before.items() if name != "dc1.doomed"
    }
    # the next write makes the topic again: a new id, the source's seqnos start afresh
    assert writer.session("doomed-src", log_type="doomed")["last_seqno"] == 0
    assert writer.acks("doomed-src", [1], log_type="doomed")[0]["status"] == "written"
    writer.close()
    assert http.get("/v1/topics/dc1.doomed").json()["topic_id"] != old_id
    assert source_seqnos(shared_gateway.data_dir, "dc1.doomed", "doomed-src")[1] == [1]
    stale = http.post(
        "/v1/groups/doomed-readers/offsets", json={"offsets": [item | {"topic_id": old_id}]}
    )
    assert stale.status_code == 409 and stale.json()["error"] == "topic_recreated", stale.text

    cli = subprocess.run(
        logbroker_cmd("topics", "--server", shared_gateway.url, "delete", "dc1.doomed"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.startswith("deleted dc1.doomed (id ")
    again = subprocess.run(
        logbroker_cmd("topics", "--server", shared_gateway.url, "delete", "dc1.doomed"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert again.returncode == 2 and "404 unknown_topic" in again.stderr, again.stderr
    http.close()
