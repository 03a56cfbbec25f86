"""A topic deletion cut short by a crash is finished, not left half done.

Before, a DELETE killed after it had marked some partitions left the topic in the catalog for
good: the marked partitions refused every read and write ("a retry makes the topic again",
which it never did), the others kept taking writes, and describe/list showed all of them.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from log_store import TopicConfig, UnknownTopic, open_store
from log_store.sqlite_partition import PartitionLog
from tests.conftest import GatewayProcess
from tests.gateway.conftest import Client, source_seqnos


def _sources_on_every_partition(client: Client, partitions: int) -> dict[int, str]:
    """Write seqnos 1..3 of sources until each partition holds one: partition -> source."""
    found: dict[int, str] = {}
    for i in range(200):
        response = client.write(f"s{i}", [1, 2, 3])
        assert response.status_code == 200, response.text
        found.setdefault(response.json()["results"][0]["partition"], f"s{i}")
        if len(found) == partitions:
            return found
    raise AssertionError(f"sources reached partitions {sorted(found)} only")


@pytest.mark.fault
def test_a_delete_killed_after_its_first_mark_is_finished_when_the_gateway_starts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    monkeypatch.setenv("LOGBROKER_STORE_CRASH_AT", "topic-deletion-marked")
    first = GatewayProcess(data_dir, ["--partitions", "4"], tmp_path / "first.log").start()
    monkeypatch.delenv("LOGBROKER_STORE_CRASH_AT")
    client = Client(first.url)
    try:
        on = _sources_on_every_partition(client, 4)
        old_id = client.http.get("/v1/topics/dc1.app").json()["topic_id"]
        with pytest.raises(httpx.TransportError):
            client.http.delete("/v1/topics/dc1.app")
        assert first.proc is not None and first.proc.wait(60) == -9
    finally:
        client.close()
        first.kill()
    assert (data_dir / "topics" / "dc1.app" / old_id).is_dir()  # cut short, not finished

    second = GatewayProcess(data_dir, ["--partitions", "4"], tmp_path / "second.log").start()
    client = Client(second.url)
    try:
        assert client.http.get("/v1/topics/dc1.app").status_code == 404
        assert "dc1.app" not in {t["name"] for t in client.http.get("/v1/topics").json()["topics"]}
        # every source, whichever partition it was on, starts again in a new topic
        for source in on.values():
            assert client.session(source)["last_seqno"] == 0
            acks = client.acks(source, [1])
            assert [a["status"] for a in acks] == ["written"], acks
        new_id = client.http.get("/v1/topics/dc1.app").json()["topic_id"]
    finally:
        client.close()
        second.kill()
    assert new_id != old_id
    assert not (data_dir / "topics" / "dc1.app" / old_id).exists()
    for source in on.values():
        assert source_seqnos(data_dir, "dc1.app", source)[1] == [1]


def _mark_as_an_older_release_did(data_dir: Path, topic: str, partition: int) -> str:
    """Leave ``topic`` as an older release's deletion killed after one mark left it: the
    partition marked deleted, the topic in the catalog, no record of the deletion."""
    store = open_store(data_dir)
    try:
        info = store.describe_topic(topic)
    finally:
        store.close()
    path = data_dir / "topics" / topic / info.topic_id / str(partition)
    log = PartitionLog(path, info.config.segment_bytes, lambda: True)
    try:
        log.mark_deleted()
    finally:
        log.close()
    return info.topic_id


def _some_writes(store: Any, topic: str, partitions: int) -> None:
    store.create_topic(topic)
    for p in range(partitions):
        store.append(topic, p, [b"x"])


def test_a_store_of_an_older_release_with_a_deletion_cut_short_is_finished_when_adopted(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path)
    try:
        _some_writes(store, "dc1.app", 4)
        _some_writes(store, "dc1.kept", 4)
    finally:
        store.close()
    topic_id = _mark_as_an_older_release_did(tmp_path, "dc1.app", 2)
    with sqlite3.connect(tmp_path / "catalog.db") as catalog:
        catalog.execute("DROP TABLE IF EXISTS data_dir")  # what an older release wrote: no record
    catalog.close()
    store = open_store(tmp_path)
    try:
        assert [t.name for t in store.list_topics()] == ["dc1.kept"]
        assert store.describe_topic("dc1.kept").partitions[3].end_offset == 1
    finally:
        store.close()
    assert not (tmp_path / "topics" / "dc1.app" / topic_id).exists()


@pytest.mark.parametrize("meets", ["append", "read"])
def test_a_write_or_read_that_meets_a_marked_partition_of_a_topic_still_there_finishes_it(
    tmp_path: Path, meets: str
) -> None:
    store = open_store(tmp_path)
    try:
        _some_writes(store, "dc1.app", 2)
    finally:
        store.close()
    _mark_as_an_older_release_did(tmp_path, "dc1.app", 1)
    store = open_store(tmp_path)  # recorded: not scanned at open
    try:
        assert store.describe_topic("dc1.app")
        with pytest.raises(UnknownTopic):
            if meets == "append":
                store.append("dc1.app", 1, [b"y"])
            else:
                store.read("dc1.app", 1, 0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if "dc1.app" not in {t.name for t in store.list_topics()}:
                break
            time.sleep(0.05)
        assert "dc1.app" not in {t.name for t in store.list_topics()}
        # the same as a finished DELETE: the next write makes the topic again
        store.create_topic("dc1.app")
        assert store.append("dc1.app", 1, [b"z"]).first_offset == 0
    finally:
        store.close()


def test_a_deletion_met_by_a_reader_of_the_same_process_is_not_taken_for_one_cut_short(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader (a following `read`, a push subscription) of the gateway's own process met
    the partitions marked by an ordinary DELETE before the catalog row went, took it for a
    deletion cut short and started a second one beside it ("cut short by a process that
    stopped" logged for 18 of 26 deletions); once a write had made the topic again, that
    second deletion could fence the new topic's partitions."""
    store = open_store(tmp_path / "data")
    stop = False
    errors: list[BaseException] = []

    def follow() -> None:
        while not stop:
            for p in range(4):
                try:
                    store.read("dc1.race", p, 0, 65536)
                except UnknownTopic:
                    pass
                except BaseException as exc:
                    errors.append(exc)

    try:
        for round_ in range(6):
            store.create_topic("dc1.race", TopicConfig(partitions=4), exist_ok=True)
            for p in range(4):
                store.append("dc1.race", p, [b"old %d" % round_])
            stop = False
            reader = threading.Thread(target=follow)
            reader.start()
            time.sleep(0.05)
            store.delete_topic("dc1.race")
            store.create_topic("dc1.race", TopicConfig(partitions=4), exist_ok=True)
            for p in range(4):
                store.append("dc1.race", p, [b"new %d" % round_])
            time.sleep(0.1)  # a second deletion, if one was started, has had its time
            stop = True
            reader.join(10)
            for p in range(4):
                records = store.read("dc1.race", p, 0, 65536).records
                assert [r.value for r in records] == [b"new %d" % round_], (round_, p)
            store.delete_topic("dc1.race")
    finally:
        stop = True
        store.close()
    assert not errors, errors
    assert not [r for r in caplog.records if "cut short" in r.getMessage()]
