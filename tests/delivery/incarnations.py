"""What readers do when the topic they read is deleted and made again under its name, shared
by the embedded store's tests (test_read_across_incarnations.py) and Kafka's
(tests/kafka/test_read_across_incarnations_on_kafka.py).

The reader has read the old topic to its end (offset N) and is busy elsewhere while the topic
goes, comes back (made again by the next write) and is written past N.  Its next read names
offset N: before reads named the topic's identity, it read the new topic from N on and never
saw the new topic's first N offsets.  Its look at the topics comes late here on purpose (a
reader alone looks every 2 s, a group member heartbeats every third of its session): the
reads alone must tell it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import httpx
import pytest

from delivery import consumer as consumer_module
from delivery.consumer import Consumer
from delivery.pull_client import PullClient
from tests.delivery.conftest import Writer, line_for

TOPIC = "dc1.inc"
OLD_SOURCES = [f"old{s}" for s in range(4)]
NEW_SOURCES = [f"new{s}" for s in range(4)]
NEW_SEQNOS = range(1, 7)
"""The new topic gets six times as many records as the old one had: past every old offset."""


def _write_old(writer: Writer) -> Counter[str]:
    for source in OLD_SOURCES:
        writer.write(source, [1], log_type="inc")
    return Counter(line_for(s, 1) for s in OLD_SOURCES)


def _make_again(url: str, writer: Writer) -> Counter[str]:
    """Delete the topic; the next writes make it again and write it past the old end."""
    deleted = httpx.delete(f"{url}/v1/topics/{TOPIC}", timeout=30)
    assert deleted.status_code == 200, deleted.text
    for source in NEW_SOURCES:
        writer.write(source, list(NEW_SEQNOS), log_type="inc")
    return Counter(line_for(s, n) for s in NEW_SOURCES for n in NEW_SEQNOS)


def _lines(reader: Consumer, want: Counter[str], timeout_s: float = 30.0) -> Counter[str]:
    """What ``reader`` returns until it returned ``want`` (and a second more, to see any line
    returned twice), committing as a group reader does."""
    got: Counter[str] = Counter()
    deadline = time.monotonic() + timeout_s
    extra_until: float | None = None
    while time.monotonic() < deadline:
        for message in reader.poll(200):
            got[message.text_data().decode()] += 1
        reader.commit()
        if extra_until is None and +(want - got) == Counter():
            extra_until = time.monotonic() + 1.0
        if extra_until is not None and time.monotonic() >= extra_until:
            break
    return got


def a_reader_goes_on_in_the_new_topic_from_its_start(
    url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    group: str | None,
) -> None:
    """A reader alone (``group`` None) or a group member, at the old topic's end when the
    topic is made again, returns every line of the new topic once and says why it starts
    over; none of the new topic's first offsets is skipped."""
    monkeypatch.setattr(consumer_module, "_DISCOVER_S", 3600.0)  # its look comes late
    made = httpx.post(f"{url}/v1/topics", json={"name": TOPIC, "partitions": 1}, timeout=30)
    assert made.status_code == 201, made.text
    writer = Writer(url)
    client = PullClient(url)
    # a long session: its heartbeats (a third of it) come late too
    reader = Consumer(
        client,
        topics=[TOPIC],
        group=group,
        from_beginning=True,
        prefetch=False,
        session_timeout_ms=60_000,
    )
    try:
        old = _write_old(writer)
        assert _lines(reader, old) == old
        new = _make_again(url, writer)
        with caplog.at_level(logging.INFO, logger="delivery"):
            got = _lines(reader, new)
        missing = new - got
        assert not missing, f"never returned: {sorted(missing)}"
        assert got == new, f"returned twice: {sorted(got - new)}"
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert said.count(f"{TOPIC} was created again; reading it from its start") == 1, said
    finally:
        reader.close()
        client.close()
        writer.close()


def a_group_starts_a_topic_made_again_from_its_start(url: str) -> None:
    """Offsets a group committed in the old topic do not apply to the new one: a member that
    joins after the topic was made again reads the new topic from its start (as Kafka's own
    group coordinator deletes a deleted topic's committed offsets)."""
    made = httpx.post(f"{url}/v1/topics", json={"name": TOPIC, "partitions": 1}, timeout=30)
    assert made.status_code == 201, made.text
    writer = Writer(url)
    client = PullClient(url)
    try:
        old = _write_old(writer)
        first = Consumer(client, topics=[TOPIC], group="g2", from_beginning=True, prefetch=False)
        try:
            assert _lines(first, old) == old
        finally:
            first.close()  # commits the old topic's end
        new = _make_again(url, writer)
        second = Consumer(client, topics=[TOPIC], group="g2", prefetch=False)
        try:
            got = _lines(second, new)
        finally:
            second.close()
        assert got == new, (sorted(new - got), sorted(got - new))
    finally:
        client.close()
        writer.close()


def a_pull_client_is_told_of_the_new_topic(url: str) -> None:
    """``PullClient.fetch`` with the topic's id it read before: an answer of the topic made
    again carries no message of it at the old offset, names the new id, and starts where the
    new topic starts; without ids (as old clients) the answer is what it always was."""
    made = httpx.post(f"{url}/v1/topics", json={"name": TOPIC, "partitions": 1}, timeout=30)
    assert made.status_code == 201, made.text
    writer = Writer(url)
    client = PullClient(url)
    try:
        _write_old(writer)
        (first,) = client.fetch([(TOPIC, 0, 0)])
        assert first.topic_id is not None and first.recreated is None
        assert len(first.messages) == len(OLD_SOURCES)
        old_id, at = first.topic_id, first.next_offset
        _make_again(url, writer)
        (again,) = client.fetch([(TOPIC, 0, at)], topic_ids={TOPIC: old_id})
        assert again.messages == []
        assert again.recreated is not None and "created again" in again.recreated, again
        assert again.topic_id not in (None, old_id)
        assert again.next_offset == again.start_offset == 0
        (start,) = client.fetch([(TOPIC, 0, 0)], topic_ids={TOPIC: again.topic_id})
        assert start.recreated is None and start.topic_id == again.topic_id
        assert start.messages[0].envelope.source_id.startswith("new")
        (plain,) = client.fetch([(TOPIC, 0, at)])  # an old client's read: as before
        assert plain.recreated is None and plain.messages[0].offset == at
        # one partition's read: 409 with the new topic's id and offsets
        refused = httpx.get(
            f"{url}/v1/topics/{TOPIC}/partitions/0/messages",
            params={"offset": at, "topic_id": old_id},
            timeout=30,
        )
        assert refused.status_code == 409, refused.text
        body = refused.json()
        assert body["error"] == "topic_recreated", body
        assert body["topic_id"] == again.topic_id and body["start_offset"] == 0, body
        same = httpx.get(
            f"{url}/v1/topics/{TOPIC}/partitions/0/messages",
            params={"offset": 0, "topic_id": again.topic_id},
            timeout=30,
        )
        assert same.status_code == 200, same.text
        assert same.json()["topic_id"] == again.topic_id
    finally:
        client.close()
        writer.close()
