"""Refusals that name what is actually wrong: the partition, not the topic name; a topic id
that is not the topic's, whether the topic was made again or the id is wrong; the real range
of a topic's partitions."""

from __future__ import annotations

from typing import Any

import httpx

from tests.gateway.conftest import Client


def test_a_partition_that_is_not_a_number_is_named_not_the_topic(shared_gateway: Any) -> None:
    writer = Client(shared_gateway.url)
    assert writer.acks("src", [1], log_type="app")[0]["status"] == "written"
    writer.close()
    http = httpx.Client(base_url=shared_gateway.url, timeout=30)
    for partition in ("-1", "abc", "1.5"):
        path = f"/v1/topics/dc1.app/partitions/{partition}/messages"
        answer = http.get(path, params={"offset": 0})
        assert answer.status_code == 404, answer.text
        assert answer.json() == {
            "error": "not_found",
            "reason": f"no endpoint GET {path}; {partition!r} is not a partition number "
            "(0, 1, 2, ...)",
        }
    # a topic name that cannot be one is still said to be the topic name
    slashed = http.get("/v1/topics/dc1.a%2Fb/partitions/0/messages", params={"offset": 0})
    assert "a topic name is 1-201 characters of [a-z0-9._-]" in slashed.json()["reason"]
    # a valid name with a path that is no endpoint: no hint that would be false
    other = http.get("/v1/topics/dc1.app/nothing")
    assert other.json()["reason"] == "no endpoint GET /v1/topics/dc1.app/nothing"


def test_a_commit_naming_an_id_the_topic_never_had_is_told_it_truthfully(
    shared_gateway: Any,
) -> None:
    writer = Client(shared_gateway.url)
    assert writer.acks("src", [1], log_type="ids")[0]["status"] == "written"
    writer.close()
    http = httpx.Client(base_url=shared_gateway.url, timeout=30)
    topic_id = http.get("/v1/topics/dc1.ids").json()["topic_id"]
    item = {"topic": "dc1.ids", "partition": 0, "offset": 0}
    refused = http.post(
        "/v1/groups/g1/offsets", json={"offsets": [item | {"topic_id": "deadbeef"}]}
    )
    assert refused.status_code == 409, refused.text
    assert refused.json() == {
        "error": "topic_recreated",
        "reason": f"dc1.ids's topic id is {topic_id}, not deadbeef: either the topic was "
        "deleted and created again since these offsets were read (heartbeat to get the new "
        "topic's positions), or the id is wrong",
    }
    right = http.post("/v1/groups/g1/offsets", json={"offsets": [item | {"topic_id": topic_id}]})
    assert right.status_code == 200, right.text


def test_too_few_partitions_are_told_the_gateways_real_range(shared_gateway: Any) -> None:
    http = httpx.Client(base_url=shared_gateway.url, timeout=30)
    for partitions in (0, -3):
        refused = http.post("/v1/topics", json={"name": "dc1.none", "partitions": partitions})
        assert refused.status_code == 400, refused.text
        assert refused.json()["reason"] == (
            f"partitions must be in 1..64 (limits.max_partitions_per_topic), got {partitions}"
        )
    over = http.post("/v1/topics", json={"name": "dc1.none", "partitions": 65})
    assert over.status_code == 429 and over.json()["max"] == 64, over.text
    assert http.get("/v1/topics/dc1.none").status_code == 404
