"""Long-polls of many partitions cost a Kafka gateway no thread per partition (as
tests/gateway/test_long_poll_cost.py checks of the embedded store): a real ``--store kafka``
gateway's thread count stays flat while 6 fetches wait on 132 partitions each (most of them
made by no write yet), and one write wakes all 6 at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tests.conftest import GatewayProcess
from tests.delivery.conftest import Writer
from tests.gateway.test_long_poll_cost import ADMIN, READER, make_topics, threads_of_group

pytestmark = pytest.mark.kafka

TABLES = f"""
[limits]
max_waiting_positions = 40000
max_waiting_positions_per_token = 40000
[tokens.{READER}]
write = ["app"]
read = ["dc1.*"]
[tokens.{ADMIN}]
admin = true
"""
TOPICS = 4
PARTITIONS = 32
FETCHES = 6


def test_many_long_polls_on_kafka_take_no_thread_per_partition_and_wake_at_once(
    start_kafka_gateway: Callable[..., GatewayProcess],
) -> None:
    gw = start_kafka_gateway(top=f'partitions = 4\npeer_token = "{"p" * 32}"\n', tables=TABLES)
    positions = make_topics(gw.url, TOPICS, PARTITIONS)
    headers = {"Authorization": f"Bearer {READER}"}
    started = time.monotonic()
    first = httpx.post(
        gw.url + "/v1/fetch", json={"partitions": positions}, headers=headers, timeout=120
    )
    assert first.status_code == 200, first.text
    read_s = time.monotonic() - started
    """What one read of the partitions takes (the fetches read them before they wait, and
    again once woken)."""
    before = threads_of_group(gw.proc.pid)
    answered: list[tuple[float, int, int]] = []
    lock = threading.Lock()

    def fetch() -> None:
        body = {"partitions": positions, "wait_ms": 60_000}
        with httpx.Client(timeout=90, headers=headers) as http:
            response = http.post(gw.url + "/v1/fetch", json=body)
        messages = sum(len(p["messages"]) for p in response.json()["partitions"])
        with lock:
            answered.append((time.time(), response.status_code, messages))

    fetches = [threading.Thread(target=fetch) for _ in range(FETCHES)]
    for thread in fetches:
        thread.start()
    time.sleep(3 + 2 * FETCHES * read_s)  # all are waiting: each read every partition
    assert not answered, "a fetch was answered before anything was written"
    during = threads_of_group(gw.proc.pid)
    # one per waited partition would be 132 more: the tail consumer and librdkafka's few
    # per broker, and the pool's threads for the reads, may add some
    assert during - before < 40, (before, during, read_s)

    writer = Writer(gw.url, READER)
    try:
        written = time.time()
        writer.write("host1:/var/log/app.log", [1])
    finally:
        writer.close()
    for thread in fetches:
        thread.join(60)
    assert len(answered) == FETCHES
    assert all(status == 200 and messages == 1 for _, status, messages in answered), (
        written,
        read_s,
        answered,
    )
    # woken by the write, not by their wait_ms (60 s) (slack for a loaded host only).
    # Before, the tail consumer was assigned each partition as a long-poll first waited on
    # it, one call each, and each call waited for the consumer's fetch in progress (0.5 s):
    # a fetch of 132 partitions began to wait after 66 s, and was answered by its wait_ms.
    assert max(at for at, _, _ in answered) - written < 5 + 2 * FETCHES * read_s, answered
