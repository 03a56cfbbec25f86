"""Long-polls of a topic deleted and made again on Kafka, through a gateway.

The gateway's tail consumer follows the waited partition by its Kafka name; the topic made
again under it has new offsets from 0.  A long-poll waiting at an offset of the old topic is
answered once the new topic's end passes that offset, with what a read that does not wait
answers at that offset (the new topic's records from there), not when its wait is up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import pytest

from log_store import LogStore, TopicConfig
from tests.conftest import GatewayProcess

pytestmark = pytest.mark.kafka

TOPIC = "dc1.app"
WAIT_MS = 30_000


def _long_poll(url: str, offset: int, answers: list[tuple[float, httpx.Response]]) -> None:
    response = httpx.get(
        f"{url}/v1/topics/{TOPIC}/partitions/0/messages",
        params={"offset": offset, "wait_ms": WAIT_MS, "raw": "1"},
        timeout=WAIT_MS / 1000 + 30,
    )
    answers.append((time.monotonic(), response))


def _values(response: httpx.Response) -> list[tuple[int, str]]:
    return [(m["offset"], m["value_b64"]) for m in response.json()["messages"]]


@pytest.mark.parametrize("new_end", ["past the waited offset", "below it"])
def test_a_long_poll_is_answered_by_the_records_of_its_topic_made_again(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore, new_end: str
) -> None:
    """The tail consumer, assigned the old topic's partition at its end, fetches the new
    topic from that offset (or is told the offset is out of range, and assigned again from
    the new end): either way the new topic wakes the long-poll, which answers as a read
    that does not wait would then: the new topic's records from its offset, or 416 while the
    new topic ends below it."""
    kafka_store.create_topic(TOPIC, TopicConfig(partitions=1))
    kafka_store.append(TOPIC, 0, [b"old-0", b"old-1", b"old-2"])
    gateway = start_kafka_gateway()
    answers: list[tuple[float, httpx.Response]] = []
    # a first long-poll, answered by an append: the tail follows the partition from then on
    end = kafka_store.describe_topic(TOPIC).partitions[0].end_offset
    first = threading.Thread(target=_long_poll, args=(gateway.url, end, answers), daemon=True)
    first.start()
    time.sleep(2)
    kafka_store.append(TOPIC, 0, [b"old-3"])
    first.join(15)
    assert answers and answers[0][1].status_code == 200, answers
    waited = answers[0][1].json()["next_offset"]
    waiter = threading.Thread(target=_long_poll, args=(gateway.url, waited, answers), daemon=True)
    waiter.start()
    time.sleep(2)  # it waits (the tail assigned at the old topic's end)
    assert len(answers) == 1, f"answered before anything was written: {answers[1][1].text}"
    kafka_store.delete_topic(TOPIC)
    kafka_store.create_topic(TOPIC, TopicConfig(partitions=1))
    records = 2 * waited if new_end == "past the waited offset" else 1
    kafka_store.append(TOPIC, 0, [f"new-{n}".encode() for n in range(records)])
    appended = time.monotonic()
    waiter.join(WAIT_MS / 1000 + 30)
    assert len(answers) == 2, "the long-poll never came back"
    answered_at, response = answers[1]
    plain = httpx.get(
        f"{gateway.url}/v1/topics/{TOPIC}/partitions/0/messages",
        params={"offset": waited, "raw": "1"},
        timeout=30,
    )
    if response.status_code == 416:
        # the new topic was seen before its records passed the waited offset: answered as a
        # read that does not wait was then (always so when the new topic ends below it)
        assert response.json()["end_offset"] < waited, response.text
    else:
        assert new_end == "past the waited offset", response.text
        assert response.status_code == plain.status_code == 200, (response.text, plain.text)
        # the new topic's records from the waited offset
        assert _values(response)[0][0] == waited
        assert _values(response) == _values(plain)
    if new_end == "below it":
        assert plain.status_code == 416, plain.text
    assert answered_at - appended < 5, f"answered {answered_at - appended:.1f} s after the append"
