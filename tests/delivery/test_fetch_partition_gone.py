"""``POST /v1/fetch`` naming a partition that is not there (its topic deleted, or made again
with fewer partitions) among others: the others are answered, and its entry says why it is
not; a fetch of nothing that is there is refused (404) as it always was.  A reader copes with
either answer and reads its other topics meanwhile."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from delivery.consumer import Consumer
from delivery.pull_client import FetchedPartition, PullClient, RequestRefused
from tests.delivery.conftest import Writer, line_for


def _fetch(url: str, positions: Sequence[tuple[str, int, int]], **extra: Any) -> httpx.Response:
    body = {"partitions": [{"topic": t, "partition": p, "offset": o} for t, p, o in positions]}
    return httpx.post(url + "/v1/fetch", json={**body, **extra}, timeout=30)


def _partition_of(url: str, topic: str) -> int:
    """The partition of ``topic`` that holds its messages (one source: one partition)."""
    info = httpx.get(f"{url}/v1/topics/{topic}").json()
    return next(p["partition"] for p in info["partitions"] if p["end_offset"] > 0)


def test_a_fetch_answers_the_partitions_there_and_names_those_that_are_not(
    gateway: Any, writer_for: Any
) -> None:
    writer_for(gateway.url).write("src0", [1, 2])  # dc1.app, 4 partitions
    there = _partition_of(gateway.url, "dc1.app")
    asked = [("dc1.app", 9, 5), ("dc1.app", there, 0), ("dc1.gone", 0, 3)]
    started = time.monotonic()
    answer = _fetch(gateway.url, asked, wait_ms=20_000)
    assert answer.status_code == 200, answer.text
    assert time.monotonic() - started < 10  # news: the long-poll does not wait
    no_partition, app, no_topic = answer.json()["partitions"]  # in request order
    assert [m["data"] for m in app["messages"]] == [line_for("src0", 1), line_for("src0", 2)]
    assert "error" not in app
    assert no_partition["error"] == {
        "error": "unknown_partition",
        "reason": "topic 'dc1.app' has partitions 0..3, not 9",
    }
    assert no_topic["error"]["error"] == "unknown_topic"
    assert "dc1.gone" in no_topic["error"]["reason"]
    for entry, offset in ((no_partition, 5), (no_topic, 3)):
        assert entry["messages"] == [] and entry["not_envelopes"] == []
        # where the read was: a client that does not know the field moves nowhere
        assert entry["start_offset"] == entry["end_offset"] == entry["next_offset"] == offset

    client = PullClient(gateway.url)  # the binary answer says the same
    try:
        parts = client.fetch(asked)
    finally:
        client.close()
    assert [(p.topic, p.partition, p.next_offset) for p in parts] == [
        ("dc1.app", 9, 5),
        ("dc1.app", there, 2),
        ("dc1.gone", 0, 3),
    ]
    assert parts[0].gone == "topic 'dc1.app' has partitions 0..3, not 9"
    assert parts[1].gone is None and len(parts[1].messages) == 2
    assert parts[2].gone is not None and "dc1.gone" in parts[2].gone
    assert parts[0].corrupt is None and parts[0].messages == []


def test_a_fetch_of_nothing_that_is_there_is_refused_as_before(
    gateway: Any, writer_for: Any
) -> None:
    writer_for(gateway.url).write("src0", [1])
    refused = _fetch(gateway.url, [("dc1.app", 9, 0), ("dc1.gone", 0, 0)])
    assert refused.status_code == 404, refused.text
    assert refused.json()["error"] == "unknown_partition"
    assert refused.json()["reason"] == "topic 'dc1.app' has partitions 0..3, not 9"
    alone = _fetch(gateway.url, [("dc1.gone", 0, 0)])
    assert alone.status_code == 404 and alone.json()["error"] == "unknown_topic"


class _OlderGateway(PullClient):
    """A gateway from before fetches answered partitions alone, whose look at ``dc1.ops``
    names a partition its reads do not know (as a gateway that sees an older topic's metadata
    might): every fetch naming that partition is refused whole."""

    def describe(self, topic: str) -> dict[str, Any]:
        info = super().describe(topic)
        if topic == "dc1.ops":
            ghost = {"partition": 9, "start_offset": 0, "end_offset": 0, "size_bytes": None}
            info["partitions"].append(ghost)
        return info

    def fetch(
        self, positions: Sequence[tuple[str, int, int]], **options: Any
    ) -> list[FetchedPartition]:
        if any((t, p) == ("dc1.ops", 9) for t, p, _ in positions):
            reason = "topic 'dc1.ops' has partitions 0..3, not 9"
            raise RequestRefused(404, "unknown_partition", reason, {"reason": reason})
        return super().fetch(positions, **options)


def test_a_reader_reads_its_other_topics_while_a_gateway_refuses_every_fetch_naming_one(
    gateway: Any, writer_for: Any, caplog: pytest.LogCaptureFixture
) -> None:
    writer: Writer = writer_for(gateway.url)
    writer.write("app0", [1, 2], log_type="app")
    writer.write("ops0", [1], log_type="ops")
    client = _OlderGateway(gateway.url)
    consumer = Consumer(client, prefix="dc1.", from_beginning=True, prefetch=False)
    read: list[tuple[str, str, int]] = []

    def poll_until(count: int) -> None:
        deadline = time.monotonic() + 15
        while len(read) < count and time.monotonic() < deadline:
            read.extend(
                (m.topic, m.envelope.source_id, m.envelope.seqno) for m in consumer.poll(200)
            )

    try:
        poll_until(3)
        writer.write("app0", [3], log_type="app")
        writer.write("ops0", [2], log_type="ops")
        poll_until(5)
    finally:
        consumer.close()
        client.close()
    assert sorted(read) == [
        ("dc1.app", "app0", 1),
        ("dc1.app", "app0", 2),
        ("dc1.app", "app0", 3),
        ("dc1.ops", "ops0", 1),
        ("dc1.ops", "ops0", 2),
    ]
    said = [r.getMessage() for r in caplog.records if "not 9" in r.getMessage()]
    assert len(said) <= 2, said  # the refusal, the partition set aside: once, not every poll


def test_a_topic_made_again_is_read_from_its_start_once_when_a_read_finds_a_partition_gone(
    gateway: Any, writer_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader's read names the old topic's positions before it looks at the topics again:
    the new topic's other partitions answer from those positions (``src1`` is in partition 1
    of both), and what they answer waits for that look, which starts them over."""
    monkeypatch.setattr("delivery.consumer._DISCOVER_S", 3600.0)  # it looks only when told
    admin = httpx.Client(base_url=gateway.url, timeout=30)
    writer: Writer = writer_for(gateway.url)
    assert admin.post("/v1/topics", json={"name": "dc1.ops", "partitions": 3}).status_code == 201
    writer.write("src1", [1], log_type="ops")  # partition 1, offset 0
    client = PullClient(gateway.url)
    consumer = Consumer(client, topics=["dc1.ops"], from_beginning=True, prefetch=False)
    read: list[int] = []

    def poll_until(count: int) -> None:
        deadline = time.monotonic() + 15
        while len(read) < count and time.monotonic() < deadline:
            read.extend(m.envelope.seqno for m in consumer.poll(200))

    try:
        poll_until(1)
        assert admin.delete("/v1/topics/dc1.ops").status_code == 200
        assert (
            admin.post("/v1/topics", json={"name": "dc1.ops", "partitions": 2}).status_code == 201
        )
        writer.write("src1", [1, 2, 3], log_type="ops")  # partition 1, offsets 0..2
        poll_until(4)
        time.sleep(0.3)
        read.extend(m.envelope.seqno for m in consumer.poll(200))
    finally:
        consumer.close()
        client.close()
        admin.close()
    assert read == [1, 1, 2, 3]  # the old topic's line, then the new topic's from its start
    assert consumer.assignment == [("dc1.ops", 0), ("dc1.ops", 1)]
