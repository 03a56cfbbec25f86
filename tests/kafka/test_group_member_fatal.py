"""A gateway whose group member fails for good gives its partitions up and joins again.

Seen on a broker restarted without KIP-848's protocol: each running gateway's group member
got librdkafka's fatal error ("ConsumerGroupHeartbeat fatal error"), which ``poll`` returns
as an event, with no exception and no ``on_lost``.  The gateways kept polling their dead
members and serving the partitions they had, ``/readyz`` 200, with the group EMPTY at the
broker, also after the broker was put back; a SIGKILLed one's partitions never moved.  Now
the fatal error gives every partition up (as lost: whoever takes one over fences this
gateway), ``/readyz`` says the gateway is out of the group, and a new member joins after a
backoff.

The group member is a stand-in (a real broker cannot be made to refuse the protocol in a
test); the real path of a fatal error through ``poll`` is checked against the broker in
``test_group_protocol_check.py``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition

from log_store.kafka import gateway_group
from log_store.kafka.gateway_group import GatewayGroup
from log_store.kafka.outage import KafkaOutage
from log_store.kafka.partition_owner import CommitCounts
from log_store.kafka.readiness import WriteReadiness
from log_store.kafka.settings import KafkaSettings
from log_store.kafka.store import KafkaLogStore

REFUSED = (
    "Fatal error: Broker: API version not supported: ConsumerGroupHeartbeat fatal error: "
    "Broker: API version not supported"
)
_APP = "dc1.app"


class _Event:
    def __init__(self, error: KafkaError) -> None:
        self._error = error

    def error(self) -> KafkaError:
        return self._error


class _Member:
    """A stand-in group member: given ``partitions`` at its first poll, then quiet until
    ``fail`` is set, from when on every poll returns librdkafka's fatal error."""

    def __init__(self, name: str, partitions: list[int]) -> None:
        self.name = name
        self.partitions = [TopicPartition(_APP, p) for p in partitions]
        self.fail = threading.Event()
        self.closed = False
        self.given = False
        self.on_assign: Callable[..., None] | None = None

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.on_assign = callbacks["on_assign"]

    def poll(self, timeout: float) -> _Event | None:
        time.sleep(min(timeout, 0.02))
        if self.fail.is_set():
            return _Event(KafkaError(KafkaError._FATAL, REFUSED))
        if self.on_assign is not None and not self.given and self.partitions:
            self.given = True
            self.on_assign(self, self.partitions)
        return None

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """The group takes what it is given; this member hands out no messages to fetch."""

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Nothing to pause: this member never fetches."""

    def assignment(self) -> list[TopicPartition]:
        return list(self.partitions) if self.given else []

    def memberid(self) -> str:
        return self.name

    def consumer_group_metadata(self) -> bytes:
        """librdkafka's form: its member epoch is above 0 once the group took it."""
        epoch = 1 if self.given else 0
        return b"CGMDv2:" + epoch.to_bytes(4, sys.byteorder) + b"g\x00" + self.name.encode()

    def close(self) -> None:
        self.closed = True


class _Store:
    def __init__(self) -> None:
        self.owned: set[tuple[str, int]] = set()
        self.released: list[tuple[str, int]] = []

    def take_over(self, topic: str, partition: int) -> None:
        self.owned.add((topic, partition))

    def release(self, topic: str, partition: int, *, wait: bool = True) -> None:
        self.owned.discard((topic, partition))
        self.released.append((topic, partition))

    def local_owner(self, topic: str, partition: int) -> Any:
        if (topic, partition) not in self.owned:
            return None
        ready = threading.Event()
        ready.set()
        return SimpleNamespace(broken=False, ready=ready)


def _until(check: Callable[[], Any], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(0.02)


@pytest.fixture
def running(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``running(*members)``: a gateway's group thread whose successive members are those."""
    threads: list[tuple[GatewayGroup, threading.Thread]] = []

    def _run(*members: _Member) -> tuple[GatewayGroup, _Store]:
        queue = list(members)
        monkeypatch.setattr(gateway_group, "Consumer", lambda config: queue.pop(0))
        group = GatewayGroup(
            KafkaSettings("127.0.0.1:9", operation_timeout_s=5.0),
            url="http://127.0.0.1:1",
            link=None,  # type: ignore[arg-type]
        )
        store = _Store()
        group._store = store  # type: ignore[assignment]
        group._set_group_timeouts = lambda: None  # type: ignore[method-assign]
        group._topics = lambda consumer: [_APP]  # type: ignore[method-assign]
        thread = threading.Thread(target=group._run, daemon=True)
        thread.start()
        threads.append((group, thread))
        return group, store

    yield _run
    for group, thread in threads:
        group._stopping.set()
        thread.join(5)


def _readiness(group: GatewayGroup) -> str | None:
    """What ``/readyz`` says of a gateway with this group (Kafka itself answering)."""
    outage = KafkaOutage(lambda _s: None)  # Kafka answers; its watch is not started
    store = SimpleNamespace(
        placement=group,
        _outage=outage,
        _readiness=WriteReadiness(lambda _s: None, CommitCounts(), outage),
    )
    return KafkaLogStore.readiness(store)  # type: ignore[arg-type]


def test_a_fatal_error_of_the_member_gives_every_partition_up_and_a_new_member_joins(
    running: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    first, second = _Member("m1", [0, 1]), _Member("m2", [1])
    group, store = running(first, second)
    _until(lambda: group.assigned() == {(_APP, 0), (_APP, 1)}, "the first member is given 0, 1")
    assert _readiness(group) is None

    with caplog.at_level(logging.ERROR, logger="log_store.kafka.gateway_group"):
        first.fail.set()
        _until(lambda: not group.assigned(), "the partitions are given up")
    assert sorted(store.released) == [(_APP, 0), (_APP, 1)]
    assert not store.owned
    assert first.closed
    reason = _readiness(group)
    assert reason is not None
    assert reason.startswith("this gateway is out of the gateway group: ")
    assert "KIP-848" in reason and "API version not supported" in reason
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("out of the gateways' group" in e and "KIP-848" in e for e in errors), errors

    _until(lambda: group.assigned() == {(_APP, 1)}, "the new member is given 1")
    assert store.owned == {(_APP, 1)}
    assert _readiness(group) is None


def test_a_new_member_given_nothing_is_in_again_once_the_broker_lists_it(
    running: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With more gateways than partitions a member may be given none, and hears of no
    assignment: its member epoch says it joined."""
    listed: set[str] = set()
    monkeypatch.setattr(gateway_group, "member_joined", lambda member: member.name in listed)
    first, second = _Member("m1", [0]), _Member("m2", [])
    group, _store = running(first, second)
    _until(lambda: group.assigned() == {(_APP, 0)}, "the first member is given 0")
    first.fail.set()
    _until(lambda: _readiness(group) is not None, "the gateway says it is out")
    time.sleep(2.0)  # the new member is made after 1 s, and looked for at once
    assert _readiness(group) is not None  # not listed yet: still out
    listed.add("m2")
    _until(lambda: _readiness(group) is None, "the gateway says it is in again", 5.0)


def test_members_failing_in_a_row_are_made_again_less_and_less_often(
    running: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker still refusing: a new member every 1, 2, 4 ... s, not in a tight loop."""
    monkeypatch.setattr(gateway_group, "member_joined", lambda member: False)
    members = [_Member(f"m{i}", []) for i in range(4)]
    for member in members:
        member.fail.set()
    started = time.monotonic()
    group, _store = running(*members)
    _until(lambda: members[2].closed, "the third member failed", 10.0)
    assert time.monotonic() - started >= 1.0 + 2.0 - 0.2
    assert not members[3].closed
    assert _readiness(group) is not None


def test_a_real_member_refused_by_the_broker_is_replaced_by_one_that_joins(
    kafka_cluster: Any, kafka_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the session's broker: the gateway's first member is refused for good (an assignor
    the broker lacks, which librdkafka takes as fatal, as it takes a refused protocol), the
    gateway says it is out of the group, and its next member joins and takes the topic."""
    from log_store.interface import TopicConfig
    from log_store.kafka import open_kafka_store

    settings = KafkaSettings(
        kafka_cluster.bootstrap,
        namespace=kafka_namespace,
        operation_timeout_s=10.0,
        session_timeout_ms=3000,
    )
    link = SimpleNamespace(close=lambda: None)  # no peer is asked: one gateway
    group = GatewayGroup(settings, url="http://127.0.0.1:1", link=link)
    configs = [{**group._consumer_config(), "group.remote.assignor": "no-such-assignor"}]
    real_config = group._consumer_config
    monkeypatch.setattr(
        group, "_consumer_config", lambda: configs.pop(0) if configs else real_config()
    )
    store = open_kafka_store(settings, placement=group)
    try:
        store.create_topic(_APP, TopicConfig(partitions=2))
        group.start(store)
        _until(lambda: group.out_of_group is not None, "the refused member is noticed", 20.0)
        assert "assignor" in (group.out_of_group or "")
        assert (store.readiness() or "").startswith("this gateway is out of the gateway group")
        _until(lambda: group.assigned() == {(_APP, 0), (_APP, 1)}, "the new member joins", 30.0)
        _until(lambda: store.readiness() is None, "the gateway is ready again", 10.0)
    finally:
        group.stop()
        store.close()
