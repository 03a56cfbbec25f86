"""A read of a partition's state that Kafka answers "offset out of range" is read again, and
never answered 416 (a reader's status) to a write or a topic's description.

Seen for about a second after a topic was deleted and made again under writing gateways:
writes answered 416 ``offset_out_of_range`` "offset is outside 0..4 of the state of
dc1.hw/0", and a push-client parked its file for a minute.  The out-of-range answer is
injected here at the changelog's replay (the fault), against a real broker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from log_store import LogStore, OffsetOutOfRange, StoreUnavailable, TopicConfig
from log_store.kafka import KafkaSettings, open_kafka_store

pytestmark = pytest.mark.kafka


def _out_of_range_first(times: int, replay: Callable[..., None]) -> Callable[..., None]:
    left = [times]

    def replay_or_refuse(*args: Any, **kwargs: Any) -> None:
        if left[0] > 0:
            left[0] -= 1
            raise OffsetOutOfRange("offset is outside 0..4 of the state (injected)", 0, 4)
        replay(*args, **kwargs)

    return replay_or_refuse


@pytest.mark.parametrize("refusals", [1, 2])
def test_state_read_out_of_range_is_read_again_or_unavailable_never_416(
    kafka_cluster: Any, kafka_store: LogStore, kafka_namespace: str, refusals: int
) -> None:
    kafka_store.create_topic("dc1.hw", TopicConfig(partitions=2))
    assert kafka_store.put_topic_state_if_absent("dc1.hw", "pin:s0", b"1") == b"1"
    # another gateway's store: it reads the state from the changelog
    reader = open_kafka_store(KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace))
    try:
        fetchers: Any = reader._fetchers  # the boundary where Kafka's answer comes in
        fetchers.replay = _out_of_range_first(refusals, fetchers.replay)
        if refusals == 1:  # read again from the changelog's start: the value is there
            assert reader.get_topic_state("dc1.hw", "pin:s0") == b"1"
        else:  # still out of range: the caller retries (503), not 416
            with pytest.raises(StoreUnavailable, match="retry"):
                reader.get_topic_state("dc1.hw", "pin:s0")
            assert reader.get_topic_state("dc1.hw", "pin:s0") == b"1"
        assert reader.describe_topic("dc1.hw").topic_id
    finally:
        reader.close()


def test_a_takeover_whose_changelog_moves_under_it_is_a_retry_not_416(
    kafka_cluster: Any, kafka_store: LogStore, kafka_namespace: str
) -> None:
    """A takeover replays the partition's changelog too: "out of range" there (the changelog
    deleted and made again under it) is a retry (503) for the write that needed it, not the
    reader's 416 it was (seen once in ``test_topic_deleted_across_gateways.py``)."""
    kafka_store.create_topic("dc1.hw", TopicConfig(partitions=1))
    kafka_store.append("dc1.hw", 0, [b"first"])  # a changelog to replay
    kafka_store.close()  # its writer gone: the next writer takes the partition over
    writer = open_kafka_store(KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace))
    try:
        fetchers: Any = writer._fetchers
        fetchers.replay = _out_of_range_first(1, fetchers.replay)
        with pytest.raises(StoreUnavailable, match="retry"):
            writer.append("dc1.hw", 0, [b"second"])
        deadline = time.monotonic() + 30
        while True:  # as a client retries a 503
            try:
                writer.append("dc1.hw", 0, [b"second"])
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "the partition was never taken over"
                time.sleep(0.5)
        assert [r.value for r in writer.read("dc1.hw", 0, 0, 1 << 20).records] == [
            b"first",
            b"second",
        ]
    finally:
        writer.close()
