"""A group member's session does not run out while no gateway was running to hear it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.consumer_group import GroupCoordinator, Subscription
from delivery.internal_state import InternalState
from delivery.pull_client import PullClient
from log_store import TopicConfig, open_store

SESSION_MS = 1000


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_member_whose_commit_was_in_flight_keeps_its_partitions_across_a_gateway_restart(
    start_gateway: Any, writer_for: Any, tmp_path: Path, workers: str
) -> None:
    """The gateway is SIGKILLed after the member read a batch and before its commit, and is
    down longer than the member's session: the commit made once it answers again is taken and
    the member keeps its partitions, so nothing it read is handed out again."""
    gw = start_gateway(tmp_path / "data", "--workers", workers)
    writer_for(gw.url).write("src0", list(range(1, 21)))
    http = httpx.Client(base_url=gw.url, timeout=30)
    joined = http.post(
        "/v1/groups/g/members",
        json={"topics": ["dc1.app"], "reset": "earliest", "session_timeout_ms": SESSION_MS},
    )
    assert joined.status_code == 200, joined.text
    member = joined.json()["member_id"]
    owned = joined.json()["assignment"]
    client = PullClient(gw.url)
    parts = client.fetch([(a["topic"], a["partition"], a["offset"]) for a in owned])
    client.close()
    assert sum(len(p.messages) for p in parts) == 20
    next_offsets = {p.partition: p.next_offset for p in parts}

    gw.kill()  # the batch is printed, its commit not yet made
    time.sleep(2 * SESSION_MS / 1000)
    gw.start()

    commit = http.post(
        "/v1/groups/g/offsets",
        json={
            "member_id": member,
            "offsets": [
                {"topic": "dc1.app", "partition": p, "offset": o} for p, o in next_offsets.items()
            ],
        },
    )
    assert commit.status_code == 200, commit.text
    beat = http.post(f"/v1/groups/g/members/{member}/heartbeat", json={})
    assert beat.status_code == 200, beat.text
    kept = {a["partition"]: a["offset"] for a in beat.json()["assignment"]}
    assert kept == next_offsets  # read on from where it was: nothing handed out twice
    # so does a member that joins now: the group hands out nothing of the batch again
    other = http.post("/v1/groups/g/members", json={"topics": ["dc1.app"]})
    assert other.status_code == 200, other.text
    described = http.get("/v1/groups/g").json()
    assert {p["partition"]: p["committed"] for p in described["partitions"]} == next_offsets
    assert len(described["members"]) == 2
    http.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_member_dead_before_a_restart_is_expired_one_session_after_the_first_request(
    tmp_path: Path,
) -> None:
    """The grace a restart gives is bounded: a member that died before the gateway went
    down is expired one session after the restarted process heard its first group request."""
    store = open_store(tmp_path / "data")
    store.create_topic("dc1.app", TopicConfig(partitions=2))
    clock = _Clock()
    sub = Subscription(("dc1.app",))
    before = GroupCoordinator(store, InternalState(store), clock)
    live = before.join("g", sub, session_timeout_ms=SESSION_MS, reset="earliest")
    dead = before.join("g", sub, session_timeout_ms=SESSION_MS, reset="earliest")
    first = before.heartbeat("g", live.member_id)
    before.heartbeat("g", live.member_id, release=first.revoke)
    assert len(before.heartbeat("g", dead.member_id).assignment) == 1

    clock.now += 30  # the gateway is down; then a new process serves the store
    after = GroupCoordinator(store, InternalState(store), clock)
    clock.now += 0.2  # starting up
    assert len(after.heartbeat("g", live.member_id).assignment) == 1  # heard: kept
    clock.now += 0.9
    assert len(after.heartbeat("g", live.member_id).assignment) == 1  # the other's grace
    clock.now += 0.2
    assert len(after.heartbeat("g", live.member_id).assignment) == 2  # expired: moved
    store.close()
