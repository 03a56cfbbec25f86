"""A write that looked at the placement just before its partition was taken away goes to the
partition's next owner; it never makes a new writer of it here.

Three gateways starting on a new topic: a gateway that gave a partition up (``gives up
dc1.app/0,1``) took it over four times in the next half second, for writes that had found it
owned a moment before; each takeover fenced the next owner, which took it back, and the
stale writers stayed until fenced (librdkafka's FATAL lines on a move came from them).  The
placement here is a stand-in taking the partition away between the write's look and the
making of its owner; the store never reaches a broker.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest

from log_store.interface import AppendResult
from log_store.kafka.partition_owner import Pending
from log_store.kafka.remote_transaction import NotOwner
from log_store.kafka.settings import KafkaSettings
from log_store.kafka.store import KafkaLogStore

TOPIC = "dc1.app"


class _TakenAway:
    """The gateways' group as it takes ``TOPIC``/0 away: the first look says owned, every
    later one not; transactions for an owner elsewhere are noted."""

    def __init__(self) -> None:
        self.looks = 0
        self.forwarded: list[tuple[str, int]] = []

    def owns(self, topic: str, partition: int) -> bool:
        self.looks += 1
        return self.looks == 1

    def remote(self) -> Any:
        return self

    def submit(self, topic: str, partition: int, fn: Any, future: Any) -> None:
        self.forwarded.append((topic, partition))

    def topics_changed(self) -> None:
        return None

    def close(self) -> None:
        return None


@pytest.fixture
def store() -> Iterator[tuple[KafkaLogStore, _TakenAway]]:
    placement = _TakenAway()
    opened = KafkaLogStore(
        KafkaSettings("127.0.0.1:9", librdkafka_log="debug"),
        placement=placement,  # type: ignore[arg-type]
    )
    yield opened, placement
    opened.close()


def test_a_write_for_a_partition_given_up_meanwhile_goes_to_its_next_owner(
    store: tuple[KafkaLogStore, _TakenAway],
) -> None:
    kafka, placement = store
    future: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
    kafka._dispatch(TOPIC, 0, Pending(lambda _state: [b"line"], future))
    assert kafka.local_owner(TOPIC, 0) is None, "a writer of a partition given up was made"
    assert placement.forwarded == [(TOPIC, 0)]


def test_a_peer_asking_for_a_partition_given_up_meanwhile_is_told_not_owned(
    store: tuple[KafkaLogStore, _TakenAway],
) -> None:
    kafka, _placement = store
    with pytest.raises(NotOwner):
        kafka.read_local_state(TOPIC, 0, ["key"])
    assert kafka.local_owner(TOPIC, 0) is None
