"""Long-polls of many partitions cost a Kafka gateway no thread per partition (as
tests/gateway/test_long_poll_cost.py checks of the embedded store): a real ``--store kafka``
gateway's thread count stays flat while 6 fetches wait on 132 partitions each (most of them
made by no write yet), and one write wakes all 6 at once."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.conftest import GatewayProcess
from tests.gateway.test_long_poll_cost import (
    ADMIN,
    CONFIG,
    long_polls_wait_flat_and_wake_at_once,
    make_topics,
    threads_of_group,
)
from tests.kafka.conftest import metric, wait_until

pytestmark = pytest.mark.kafka

TABLES = CONFIG.replace("partitions = 4\n", "", 1)  # the same limits and tokens
TOPICS = 4
PARTITIONS = 32


def test_many_long_polls_on_kafka_take_no_thread_per_partition_and_wake_at_once(
    start_kafka_gateway: Callable[..., GatewayProcess],
) -> None:
    gw = start_kafka_gateway(top=f'partitions = 4\npeer_token = "{"p" * 32}"\n', tables=TABLES)
    # One thread per waited partition would be 132 more: the tail consumer and librdkafka's
    # few per broker, and the pool's threads for the reads, may add some.  Before, the tail
    # consumer was assigned each partition as a long-poll first waited on it, one call each,
    # and each call waited for the consumer's fetch in progress (0.5 s): a fetch of 132
    # partitions began to wait after 66 s, and was answered by its wait_ms.
    positions = make_topics(gw.url, TOPICS, PARTITIONS)
    # The gateway takes its partitions over after the topics are made (the gateways' group
    # gives them out), each with a producer and its threads: counted before it is done, that
    # takeover was read as threads the long-polls took (658 before, 860 while they waited).
    wait_until(
        lambda: (metric(gw.url, "logbroker_kafka_owned_partitions", ADMIN) or 0) >= len(positions),
        120,
        "the gateway to own every partition",
    )
    wait_until(lambda: _threads_settled(gw.proc.pid), 120, "the takeovers' threads to settle")
    long_polls_wait_flat_and_wake_at_once(gw, positions, more_threads=40, slack_s=5)


def _threads_settled(group: int) -> bool:
    """The process group's thread count has not changed for 2 s."""
    first = threads_of_group(group)
    time.sleep(2)
    return threads_of_group(group) == first
