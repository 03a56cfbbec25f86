"""Offsets asked of a leader just elected are asked again, not taken for Kafka being away.

Right after a leader change the new leader answers ListOffsets with ``OFFSET_NOT_AVAILABLE``
("Leader high watermark is not caught up") until its followers caught up: a moment.  It used
to be ``StoreUnavailable`` at once, which a push delivery logged as a failure after every
broker kill.  Now it is asked again within the operation timeout, then ``StoreUnavailable``.

No broker here: the admin client is a stand-in that follows a script.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from log_store.errors import StoreUnavailable
from log_store.kafka.settings import KafkaSettings
from log_store.kafka.topic_admin import KafkaTopic, TopicAdmin

_SETTINGS = KafkaSettings(bootstrap="127.0.0.1:9", operation_timeout_s=1.0)
_TOPIC = KafkaTopic("app", "app", "id", 2)


class _Answer:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class _AdminClient:
    """``list_offsets`` fails with ``OFFSET_NOT_AVAILABLE`` for partition 1 the first
    ``failures`` calls, then answers offset 5 for every partition."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def list_offsets(self, specs: dict[TopicPartition, Any], **_kwargs: Any) -> dict[Any, Any]:
        self.calls += 1
        futures: dict[Any, Any] = {}
        for tp in specs:
            future: concurrent.futures.Future[_Answer] = concurrent.futures.Future()
            if tp.partition == 1 and self.calls <= self.failures:
                error = KafkaError(
                    KafkaError.OFFSET_NOT_AVAILABLE, "Leader high watermark is not caught up"
                )
                future.set_exception(KafkaException(error))
            else:
                future.set_result(_Answer(5))
            futures[tp] = future
        return futures


def _admin(failures: int) -> tuple[TopicAdmin, _AdminClient]:
    admin = TopicAdmin(_SETTINGS)
    client = _AdminClient(failures)
    admin.client = client  # type: ignore[assignment]
    return admin, client


def test_offsets_not_available_after_a_leader_change_are_asked_again() -> None:
    admin, client = _admin(failures=3)
    infos = admin.partition_infos(_TOPIC)
    assert [(p.start_offset, p.end_offset) for p in infos] == [(5, 5), (5, 5)]
    assert client.calls == 5  # earliest: three failures and an answer; latest: an answer


def test_offsets_not_available_for_longer_than_the_operation_timeout_are_unavailable() -> None:
    admin, _client = _admin(failures=10**6)
    with pytest.raises(StoreUnavailable, match="offsets of app"):
        admin.partition_infos(_TOPIC)
