"""How the gateways' group spreads partitions: per topic, on joins, after a death.

The group uses Kafka's consumer group protocol (KIP-848) with the broker's range assignor, so
every topic is split over the gateways, whatever order topics and gateways arrive in.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

import httpx
import pytest

from tests.conftest import GatewayProcess
from tests.gateway.conftest import Client
from tests.kafka.conftest import SESSION_TIMEOUT_MS, wait_until

pytestmark = [pytest.mark.kafka]


def _spread(url: str, topic: str) -> list[int]:
    """How many partitions of ``topic`` each owner holds, largest first ([] if unknown)."""
    answer = httpx.get(f"{url}/v1/topics/{topic}/owners", timeout=30)
    if answer.status_code != 200:
        return []
    owners = collections.Counter(p.get("owner") for p in answer.json()["partitions"])
    if None in owners:
        return []
    return sorted(owners.values(), reverse=True)


def _owners(url: str, topic: str) -> set[str]:
    answer = httpx.get(f"{url}/v1/topics/{topic}/owners", timeout=30)
    if answer.status_code != 200:
        return set()
    return {p.get("owner") for p in answer.json()["partitions"]}


def test_every_topic_is_split_over_the_gateways_and_a_dead_ones_share_moves_in_seconds(
    start_kafka_gateway: Callable[..., GatewayProcess],
) -> None:
    """Two gateways, then two topics created after both joined: each topic is split 2+2 (the
    client-side sticky assignor gave a new topic's 4 partitions to one gateway, balancing only
    totals).  A third gateway joining makes every topic 2/1/1.  A SIGKILLed gateway's
    partitions are owned by the others again within the group's session timeout plus the
    takeover, not Kafka's 45 s default."""
    a, b = start_kafka_gateway(), start_kafka_gateway()
    client = Client(a.url)
    for log_type in ("app", "web"):
        assert client.write("src", [1], log_type=log_type).status_code == 200
    client.close()
    for topic in ("dc1.app", "dc1.web"):
        wait_until(lambda t=topic: _spread(b.url, t) == [2, 2], 60, f"{topic} split 2+2")

    c = start_kafka_gateway()
    for topic in ("dc1.app", "dc1.web"):
        wait_until(lambda t=topic: _spread(c.url, t) == [2, 1, 1], 60, f"{topic} split 2/1/1")
    assert _owners(a.url, "dc1.app") == {a.url, b.url, c.url}

    b.kill()
    killed = time.monotonic()
    for topic in ("dc1.app", "dc1.web"):
        wait_until(
            lambda t=topic: _owners(a.url, t) == {a.url, c.url},
            SESSION_TIMEOUT_MS / 1000 + 20,
            f"{topic} owned by the two live gateways",
        )
    moved_s = time.monotonic() - killed
    assert moved_s < SESSION_TIMEOUT_MS / 1000 + 20
    client = Client(c.url)
    assert client.write("after", [1, 2, 3]).status_code == 200
    assert client.write("after", [1, 2, 3], log_type="web").status_code == 200
    client.close()
