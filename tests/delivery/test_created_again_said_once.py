"""A reader whose positions are past the end of a topic created again says so once per topic,
whether the look it takes at once sees the new topic's id or only a later one does (the
per-partition detail is at debug level)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from delivery.consumer import Consumer

TOPIC = "dc1.ops"


class _Client:
    """Describes TOPIC with ``topic_id`` and partitions 0-2 holding 2 messages each."""

    def __init__(self) -> None:
        self.topic_id = "old"

    def describe(self, topic: str) -> dict[str, Any]:
        assert topic == TOPIC
        partitions = [{"partition": p, "start_offset": 0, "end_offset": 2} for p in range(3)]
        return {"topic_id": self.topic_id, "partitions": partitions}


def _reader(client: _Client) -> Consumer:
    reader = Consumer(client, topics=[TOPIC], prefetch=False)  # type: ignore[arg-type]
    reader._topic_ids[TOPIC] = "old"
    for p in range(3):
        reader._positions[(TOPIC, p)] = 50 + p  # the old topic's, past the new one's end
    return reader


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("seen_at_once", [True, False])
def test_a_topic_created_again_is_said_once(
    caplog: pytest.LogCaptureFixture, seen_at_once: bool
) -> None:
    client = _Client()
    reader = _reader(client)
    if seen_at_once:
        client.topic_id = "new"
    with caplog.at_level(logging.DEBUG, logger="delivery.consumer"):
        reader._skip_lost([(TOPIC, p, 50 + p) for p in range(3)])
        assert {tp: o for tp, o in reader._positions.items()} == {(TOPIC, p): 0 for p in range(3)}
        client.topic_id = "new"
        reader._discover()  # a later look sees the new id
        reader._discover()
    assert _said(caplog) == [f"{TOPIC} was created again; reading it from its start"]
    details = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len([d for d in details if "is past the end" in d]) == 3
