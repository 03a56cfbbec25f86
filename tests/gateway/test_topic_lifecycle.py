"""Pins and seqnos belong to a topic's identity; adding partitions never moves a source."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from log_store import TopicConfig, open_store
from session_dedup.exactly_once import TOPIC_REFRESH_S
from tests.gateway.conftest import source_seqnos


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
