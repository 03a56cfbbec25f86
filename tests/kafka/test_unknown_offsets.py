"""An offset Kafka answers as unknown is asked again, never taken for a partition's end.

While a broker shuts down, librdkafka's ListOffsets can come back without an error but with
offset -1001 (``OFFSET_INVALID``) for every partition (seen with a local broker given
SIGTERM, polled as fast as possible).  Taken as an end, that made a topic's partitions look
empty ("valid offsets are 0..0"): a group reader's commit at that moment was refused and the
reader exited.  An unknown offset is now asked again within the operation timeout, and
answered 503 (``StoreUnavailable``) after it, like a leader that does not answer.

No broker here: the admin client and the consumer are stand-ins that follow a script.
"""

from __future__ import annotations

import concurrent.futures
from collections import deque
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from log_store.errors import StoreUnavailable
from log_store.kafka.fetcher import Watermarks
from log_store.kafka.settings import KafkaSettings
from log_store.kafka.topic_admin import KafkaTopic, TopicAdmin

UNKNOWN = -1001  # librdkafka's OFFSET_INVALID

_SETTINGS = KafkaSettings(bootstrap="127.0.0.1:9", operation_timeout_s=1.0)


class _Answer:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class _AdminClient:
    """``list_offsets`` answers from a script: per call, the offsets of earliest and latest
    asks in turn; when the script runs out, the last answers are given again."""

    def __init__(self, script: list[tuple[list[int], list[int]]]) -> None:
        self.script = deque(script)
        self.answer = script[-1]
        self.calls = 0
        self._latest = False

    def list_offsets(self, specs: dict[TopicPartition, Any], **_kwargs: Any) -> dict[Any, Any]:
        self.calls += 1
        if not self._latest and self.script:
            self.answer = self.script.popleft()
        offsets = self.answer[1] if self._latest else self.answer[0]
        self._latest = not self._latest
        futures: dict[Any, Any] = {}
        for tp in specs:
            future: concurrent.futures.Future[_Answer] = concurrent.futures.Future()
            future.set_result(_Answer(offsets[tp.partition]))
            futures[tp] = future
        return futures


def _admin(script: list[tuple[list[int], list[int]]]) -> tuple[TopicAdmin, _AdminClient]:
    admin = TopicAdmin(_SETTINGS)
    client = _AdminClient(script)
    admin.client = client  # type: ignore[assignment]
    return admin, client


_TOPIC = KafkaTopic("app", "app", "id", 2)


def test_partition_ends_answered_unknown_are_asked_again() -> None:
    admin, client = _admin(
        [
            ([0, 0], [UNKNOWN, UNKNOWN]),  # a broker shutting down
            ([UNKNOWN, UNKNOWN], [UNKNOWN, UNKNOWN]),
            ([0, 3], [14, 20]),
        ]
    )
    infos = admin.partition_infos(_TOPIC)
    assert [(p.start_offset, p.end_offset) for p in infos] == [(0, 14), (3, 20)]
    assert client.calls == 6


def test_partition_ends_unknown_for_longer_than_the_operation_timeout_are_unavailable() -> None:
    admin, _client = _admin([([0, 0], [UNKNOWN, 7])])
    with pytest.raises(StoreUnavailable, match="app"):
        admin.partition_infos(_TOPIC)


class _Consumer:
    """``get_watermark_offsets`` answers from a script, then its last answer again."""

    def __init__(self, script: list[tuple[int, int]]) -> None:
        self.script = deque(script)
        self.answer = script[-1]
        self.calls = 0

    def get_watermark_offsets(self, *_args: Any, **_kwargs: Any) -> tuple[int, int]:
        self.calls += 1
        if self.script:
            self.answer = self.script.popleft()
        return self.answer

    def list_topics(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    def close(self) -> None:
        return None


def _watermarks(script: list[tuple[int, int]]) -> tuple[Watermarks, _Consumer]:
    watermarks = Watermarks(_SETTINGS)
    watermarks._consumer.close()
    consumer = _Consumer(script)
    watermarks._consumer = consumer  # type: ignore[assignment]
    return watermarks, consumer


def test_watermarks_answered_unknown_are_asked_again() -> None:
    watermarks, consumer = _watermarks([(UNKNOWN, UNKNOWN), (0, UNKNOWN), (2, 9)])
    assert watermarks.get("app", 0) == (2, 9)
    assert consumer.calls == 3


def test_watermarks_unknown_for_longer_than_the_operation_timeout_are_unavailable() -> None:
    watermarks, _consumer = _watermarks([(0, UNKNOWN)])
    with pytest.raises(StoreUnavailable, match="app/0"):
        watermarks.get("app", 0)
    spans = watermarks.unavailable_spans()
    assert len(spans) == 1  # counted as the leader not answering, for the audit's windows
