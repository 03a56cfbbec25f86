"""A gateway that can write none of the partitions the group gave it leaves the group.

After a broker outage one gateway kept failing every takeover for minutes while its group
member heartbeated: the group never moved its partitions, and writes to them were 503 "no
gateway owns" at every gateway.  The group thread now counts, while Kafka answers its member,
how long every given partition has had no working owner here; after three operation
timeouts, with other gateways owning partitions, it leaves.  These tests ask that decision
directly (no broker: the store, its owners and the directory are stand-ins).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from log_store.kafka.gateway_group import GatewayGroup
from log_store.kafka.settings import KafkaSettings

_TIMEOUT_S = 1.0
_STALLED_S = 3 * _TIMEOUT_S
_SELF = "http://127.0.0.1:1"
_OTHER = "http://127.0.0.1:2"


@dataclass
class _Owner:
    broken: bool


class _Store:
    def __init__(self) -> None:
        self.owners: dict[tuple[str, int], _Owner] = {}

    def local_owner(self, topic: str, partition: int) -> _Owner | None:
        return self.owners.get((topic, partition))


def _group(owners: dict[tuple[str, int], _Owner], claims: dict[tuple[str, int], str]) -> Any:
    group = GatewayGroup(
        KafkaSettings("127.0.0.1:9", operation_timeout_s=_TIMEOUT_S),
        url=_SELF,
        link=None,  # type: ignore[arg-type]
    )
    store = _Store()
    store.owners = owners
    group._store = store  # type: ignore[assignment]
    group._assigned = set(owners)
    group.directory.snapshot = lambda: claims  # type: ignore[method-assign]
    return group


def _stalled(group: Any, now: float, *, kafka_answers: bool = True) -> bool:
    if not hasattr(group, "_stalled"):
        pytest.fail("the gateway never leaves the group, whatever its takeovers do")
    return bool(group._stalled(now, kafka_answers=kafka_answers))


def test_a_gateway_whose_every_given_partition_stays_unwritable_leaves() -> None:
    owners = {("dc1.hw", 2): _Owner(broken=True), ("dc1.pc", 2): _Owner(broken=True)}
    group = _group(owners, {("dc1.hw", 0): _OTHER, ("dc1.hw", 2): _SELF})
    assert not _stalled(group, 100.0)
    assert not _stalled(group, 100.0 + _STALLED_S - 0.5)
    assert _stalled(group, 100.0 + _STALLED_S + 0.5)


def test_one_writable_partition_keeps_the_gateway_in_the_group() -> None:
    owners = {("dc1.hw", 2): _Owner(broken=True), ("dc1.pc", 2): _Owner(broken=False)}
    group = _group(owners, {("dc1.hw", 0): _OTHER})
    assert not _stalled(group, 100.0)
    assert not _stalled(group, 100.0 + 10 * _STALLED_S)


def test_the_clock_starts_again_after_kafka_did_not_answer_the_group_member() -> None:
    """A cluster outage stalls every gateway alike: only time with Kafka answering counts."""
    owners = {("dc1.hw", 2): _Owner(broken=True)}
    group = _group(owners, {("dc1.hw", 0): _OTHER})
    assert not _stalled(group, 100.0)
    assert not _stalled(group, 100.0 + _STALLED_S + 0.5, kafka_answers=False)
    assert not _stalled(group, 100.0 + _STALLED_S + 1.0)
    assert _stalled(group, 100.0 + 2 * _STALLED_S + 1.5)


def test_with_no_other_gateway_owning_anything_it_stays() -> None:
    """Then the trouble is the cluster's or the partitions', not this gateway's: leaving
    would only pass the partitions round."""
    owners = {("dc1.hw", 2): _Owner(broken=True)}
    group = _group(owners, {("dc1.hw", 2): _SELF})
    assert not _stalled(group, 100.0)
    assert not _stalled(group, 100.0 + 10 * _STALLED_S)


def test_a_partition_given_and_not_taken_over_yet_counts_as_unwritable() -> None:
    group = _group({("dc1.hw", 2): _Owner(broken=True)}, {("dc1.hw", 0): _OTHER})
    group._store.owners = {}  # the owner is gone (or was never made)
    assert not _stalled(group, 100.0)
    assert _stalled(group, 100.0 + _STALLED_S + 0.5)
