"""Pins and seqnos belong to a topic's identity; adding partitions never moves a source."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ingest_api.framing import encode_binary
from log_store import TopicConfig, open_store
from session_dedup.exactly_once import TOPIC_REFRESH_S
from tests.gateway.conftest import chunk_data, meta, source_seqnos


def test_recreated_topic_starts_with_fresh_pins_and_seqnos(gateway: Any, client_for: Any) -> None:
    client = client_for(gateway.url)
    client.acks("old-source", list(range(1, 11)))
    store = open_store(gateway.data_dir)
    old_id = store.describe_topic("dc1.app").topic_id
    store.delete_topic("dc1.app")
    store.create_topic("dc1.app", TopicConfig(partitions=2))
    new_id = store.describe_topic("dc1.app").topic_id
    store.close()
    assert new_id != old_id

    session = client.session("old-source")
    assert session["last_seqno"] == 0, "a re-created topic inherited the old seqno"
    assert session["partition"] in (0, 1), "a re-created topic inherited the old pin"
    acks = client.acks("old-source", [1, 2, 3])
    assert [a["status"] for a in acks] == ["written"] * 3
    partitions, seqnos = source_seqnos(gateway.data_dir, "dc1.app", "old-source")
    assert seqnos == [1, 2, 3] and partitions == {session["partition"]}


def test_deleted_topic_is_created_again_by_the_next_write(gateway: Any, client_for: Any) -> None:
    client = client_for(gateway.url)
    client.acks("s", [5, 6])
    store = open_store(gateway.data_dir)
    store.delete_topic("dc1.app")
    store.close()
    acks = client.acks("s", [5, 6, 7])
    assert [a["status"] for a in acks] == ["written"] * 3
    assert source_seqnos(gateway.data_dir, "dc1.app", "s")[1] == [5, 6, 7]
    assert client.session("s")["last_seqno"] == 7


def test_adding_partitions_keeps_existing_sources_where_they_are(
    start_gateway: Any, tmp_path: Path, client_for: Any
) -> None:
    gw = start_gateway(tmp_path / "data", "--partitions", "2")
    client = client_for(gw.url)
    sources = [f"src-{i}" for i in range(16)]
    before = {}
    for source in sources:
        client.acks(source, [1, 2])
        before[source] = client.session(source)["partition"]
    assert set(before.values()) == {0, 1}
    store = open_store(gw.data_dir)
    store.set_partitions("dc1.app", 8)
    store.close()
    time.sleep(TOPIC_REFRESH_S + 0.5)  # let the gateway notice the new partition count

    for source in sources:
        acks = client.acks(source, [2, 3])
        assert [a["status"] for a in acks] == ["duplicate", "written"]
        session = client.session(source)
        assert (session["partition"], session["last_seqno"]) == (before[source], 3)
        partitions, seqnos = source_seqnos(gw.data_dir, "dc1.app", source)
        assert partitions == {before[source]} and seqnos == [1, 2, 3]
    newcomers = {client.session(f"new-{i}")["partition"] for i in range(40)}
    assert newcomers & set(range(2, 8)), "new sources never use the added partitions"


def test_a_write_after_the_topic_came_back_with_fewer_partitions_is_written_once(
    gateway: Any, client_for: Any
) -> None:
    """Before: within the gateway's topic cache, sources pinned to partitions the new topic
    lacks made the whole request 404 ``unknown_partition`` while its other chunks were
    written (a resend answered them ``duplicate``): a 4xx that had written something."""
    client = client_for(gateway.url)
    http = client.http
    assert http.post("/v1/topics", json={"name": "dc1.app", "partitions": 4}).status_code == 201
    sources = [f"src-{i}" for i in range(12)]
    body = encode_binary([(meta(s), [(10, 0, chunk_data(10))]) for s in sources])
    assert client.post_binary(body).status_code == 200
    pins = {client.session(s)["partition"] for s in sources}
    assert pins & {2, 3}, "no source pinned beyond the new topic's partitions"

    assert http.delete("/v1/topics/dc1.app").status_code == 200
    assert http.post("/v1/topics", json={"name": "dc1.app", "partitions": 2}).status_code == 201
    answer = client.post_binary(body)
    assert answer.status_code == 200, answer.text
    statuses = [r["acks"][0]["status"] for r in answer.json()["results"]]
    assert statuses == ["written"] * len(sources)
    for source in sources:
        partitions, seqnos = source_seqnos(gateway.data_dir, "dc1.app", source)
        assert seqnos == [10] and partitions <= {0, 1}
