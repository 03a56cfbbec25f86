"""A write of new sources whose pins' partition has no reachable owner names those sources.

On Kafka a source's first write through a gateway reads (or makes) its pin, in the partition
that holds it (a hash of its key).  When that partition has no reachable owner, the write is
answered 503 ``partition_unavailable``; the answer used to name the partition only, and a
push-client, which knows no partition of a file not routed yet, held back every file of the
request.  Now it names the sources that wait, as for a routed source's write, so a client
holds back those alone.

The gateway runs in this process over the embedded store, whose pin reads are made to fail
as the Kafka store's do (:class:`~log_store.errors.PartitionUnavailable`, with the keys that
wait when it knows them).
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Iterator, Sequence
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
from log_store.errors import PartitionUnavailable
from push_client.transport import PartitionsUnavailable
from session_dedup.pinning import pin_key
from tests.gateway.conftest import chunk_data, meta

TOPIC = "dc1.app"
CUT = 3
"""The partition said to hold the pins and to have no reachable owner."""


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[TestClient, SqliteLogStore]]:
    data_dir = tmp_path / "data"
    settings = load_settings(flags={"data_dir": str(data_dir), "partitions": 4})
    store = open_store(data_dir)
    app = build_app(GatewayContext(store=store, settings=settings), close_store=True)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client, store


def _write(client: TestClient, source_ids: Sequence[str], seqno: int) -> Any:
    body = encode_binary([(meta(s), [(seqno, 0, chunk_data(seqno))]) for s in source_ids])
    return client.post("/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE})


def _pins_unreachable(
    store: SqliteLogStore, monkeypatch: pytest.MonkeyPatch, waiting: Collection[str] | None
) -> None:
    """Reads of topic-level state fail as the Kafka store's do when the partition holding
    them has no reachable owner: for the keys ``waiting`` (None: it does not say which)."""

    def unreachable(topic: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        reason = f"no gateway owns {topic}/{CUT} right now (none)"
        if waiting is None:
            raise PartitionUnavailable(reason, topic, CUT)
        raise PartitionUnavailable(reason, topic, CUT, keys=waiting)

    monkeypatch.setattr(store, "get_topic_state_many", unreachable)


def test_new_sources_waiting_for_their_pins_partition_are_named_and_the_others_held_not(
    gateway: tuple[TestClient, SqliteLogStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, store = gateway
    assert _write(client, ["routed"], 1).status_code == 200  # its route is cached now
    _pins_unreachable(store, monkeypatch, None)
    refused = _write(client, ["routed", "new-a", "new-b"], 2)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"]
    answer = refused.json()
    assert answer["error"] == "partition_unavailable"
    assert _named(answer) == [
        {"topic": TOPIC, "partition": CUT, "source_ids": ["new-a", "new-b"], "pins": True}
    ]
    assert f"{TOPIC}/{CUT}" in answer["reason"]
    # the push-client holds back the files of the sources named, not the routed one (it
    # knows no partition of a new file: an answer naming no source held back every file)
    held = PartitionsUnavailable.from_body(answer)
    assert held is not None
    assert held.affects("new-a", "", -1) and held.affects("new-b", "", -1)
    assert not held.affects("routed", TOPIC, 0)
    assert held.pins == {(TOPIC, CUT)}  # the partition of their pins, not of their data
    monkeypatch.undo()
    retried = _write(client, ["routed", "new-a", "new-b"], 2)
    assert retried.status_code == 200, retried.text
    assert [r["acks"][0]["status"] for r in retried.json()["results"]] == ["written"] * 3


def test_only_the_sources_whose_pins_the_partition_holds_are_named(
    gateway: tuple[TestClient, SqliteLogStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Kafka store says which keys of the read live in the partition: of the new
    sources, those whose pins are there wait; the others are sent again at once."""
    client, store = gateway
    assert _write(client, ["routed"], 1).status_code == 200
    topic_id = store.describe_topic(TOPIC).topic_id
    _pins_unreachable(store, monkeypatch, [pin_key(topic_id, "new-b")])
    refused = _write(client, ["new-a", "routed", "new-b"], 2)
    assert refused.status_code == 503, refused.text
    answer = refused.json()
    assert _named(answer) == [
        {"topic": TOPIC, "partition": CUT, "source_ids": ["new-b"], "pins": True}
    ]


def _named(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The partitions a 503 names, without their reasons (each names its own partition)."""
    for named in answer["partitions"]:
        assert f"{named['topic']}/{named['partition']}" in named["reason"], named
    return [{k: v for k, v in named.items() if k != "reason"} for named in answer["partitions"]]
