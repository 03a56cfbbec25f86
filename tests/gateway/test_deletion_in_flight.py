"""What a client is told when its write or read raced the deletion of its topic.

The gateway runs in this process (the app over its own store handle) and the deletion is made
by another handle of the same data dir, as by another gateway worker or ``logbroker topics
delete``, at one chosen point of the request: in the middle of the commit for a write, between
the look at the catalog and the opening of the partition for a read.  A write is answered 503
``topic_deleted`` (retry: the retry makes the topic again), a read 404 ``unknown_topic`` saying
that the topic was deleted; never a 500 nor SQLite's own words.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    # Starlette would have its test client on httpx2; on httpx it works as it always did.
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

from ingest_api.app import build_app
from ingest_api.context import GatewayContext
from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from ingest_api.settings import load_settings
from log_store import SqliteLogStore, open_store
from log_store.sqlite_partition import PartitionLog
from tests.gateway.conftest import chunk_data, meta


@pytest.fixture
def gateway_and_deleter(tmp_path: Path) -> Iterator[tuple[TestClient, SqliteLogStore]]:
    data_dir = tmp_path / "data"
    settings = load_settings(flags={"data_dir": str(data_dir), "partitions": 1})
    store = open_store(data_dir)
    deleter = open_store(data_dir)
    app = build_app(GatewayContext(store=store, settings=settings), close_store=True)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            yield client, deleter
    finally:
        deleter.close()


def _write(client: TestClient, source_id: str, seqnos: list[int]) -> Any:
    body = encode_binary([(meta(source_id), [(s, 0, chunk_data(s)) for s in seqnos])])
    return client.post("/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE})


def test_a_write_whose_topic_is_deleted_during_its_commit_is_answered_503_topic_deleted(
    gateway_and_deleter: tuple[TestClient, SqliteLogStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, deleter = gateway_and_deleter
    assert _write(client, "s", [1]).status_code == 200
    commit = PartitionLog._commit
    deletions: list[str] = []

    def deleted_during_the_commit(log: PartitionLog, group: Any) -> None:
        # the write made again (it retries once on a topic it finds gone) meets it too
        topic_id = deleter.describe_topic("dc1.app").topic_id
        deleter.delete_topic("dc1.app")
        deletions.append(topic_id)
        commit(log, group)

    monkeypatch.setattr(PartitionLog, "_commit", deleted_during_the_commit)
    answer = _write(client, "s", [2])
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"]
    body = answer.json()
    assert body["error"] == "topic_deleted"
    assert "'dc1.app' was deleted while this write was in flight" in body["reason"]
    assert "disk" not in body["reason"] and "database" not in body["reason"]
    assert len(deletions) == 2
    monkeypatch.undo()
    # the client's retry makes the topic again; the source starts over in it
    retried = _write(client, "s", [2])
    assert retried.status_code == 200, retried.text
    assert [a["status"] for a in retried.json()["results"][0]["acks"]] == ["written"]
    assert [r.offset for r in deleter.read("dc1.app", 0, 0).records] == [0]


@pytest.mark.parametrize("how", ["partition", "fetch"])
def test_a_read_whose_topic_is_deleted_as_it_opens_the_partition_is_answered_404(
    gateway_and_deleter: tuple[TestClient, SqliteLogStore],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    client, deleter = gateway_and_deleter
    deleter.create_topic("dc1.app")
    deleter.append("dc1.app", 0, [b"not read"])
    client.get("/v1/topics")  # the gateway knows the topic, has not opened its partition
    open_partition = SqliteLogStore._open_partition
    deleted: list[bool] = []

    def deleted_first(store: SqliteLogStore, info: Any, partition: int) -> PartitionLog:
        if store is not deleter and not deleted:
            deleted.append(True)
            deleter.delete_topic("dc1.app")
        return open_partition(store, info, partition)

    monkeypatch.setattr(SqliteLogStore, "_open_partition", deleted_first)
    if how == "partition":
        answer = client.get("/v1/topics/dc1.app/partitions/0/messages", params={"offset": 0})
    else:
        answer = client.post(
            "/v1/fetch", json={"partitions": [{"topic": "dc1.app", "partition": 0, "offset": 0}]}
        )
    assert deleted
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"] == "unknown_topic"
    assert "deleted while" in answer.json()["reason"]
