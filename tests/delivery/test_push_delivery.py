"""Push delivery from a real gateway to real HTTP endpoints that fail, hang and recover."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import defaultdict
from typing import Any

import httpx
import pytest

from log_store import open_store
from session_dedup.envelope import Envelope, encode
from tests.conftest import REPO, logbroker_cmd
from tests.delivery.conftest import PUSH_TO_LOOPBACK, wait_until
from tests.metrics_text import sample

# A batch answered 200 after the timeout is recorded by the endpoint and sent again (at least
# once; receivers drop it by offset): the timeout is long enough that a loaded machine's slow
# "ok" is not taken for a hang, and the hanging endpoint below hangs longer.
FAST_RETRY = {"timeout_ms": 3000, "min_backoff_ms": 20, "max_backoff_ms": 200}


@pytest.fixture
def gateway(start_gateway: Any) -> Any:
    """A gateway allowed to push to the test endpoints, which listen on loopback."""
    return start_gateway(None, *PUSH_TO_LOOPBACK)


def _subscribe(url: str, name: str, endpoint: str, **extra: Any) -> None:
    body = {
        "name": name,
        "endpoint": endpoint,
        "topics": ["dc1.app"],
        "batch_size": 25,
        "linger_ms": 20,
        **FAST_RETRY,
        **extra,
    }
    response = httpx.post(f"{url}/v1/subscriptions", json=body)
    assert response.status_code == 201, response.text


def _by_partition(messages: list[dict[str, Any]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for m in messages:
        assert m["topic"] == "dc1.app"
        out[m["partition"]].append(m["offset"])
    return out


def _ends(url: str) -> dict[int, int]:
    info = httpx.get(f"{url}/v1/topics/dc1.app").json()
    return {p["partition"]: p["end_offset"] for p in info["partitions"]}


@pytest.mark.fault
def test_push_through_500s_then_timeouts_then_recovery_delivers_all_in_order_once(
    gateway: Any, writer_for: Any, push_endpoint: Any
) -> None:
    def behaviour(n: int) -> tuple[str, float]:
        if n < 4:
            return ("fail", 500)
        if n < 6:
            return ("hang", 4.0)  # longer than the subscription's 3 s timeout
        return ("ok", 200)

    endpoint = push_endpoint(behaviour)
    writer = writer_for(gateway.url)
    for s in range(8):
        writer.write(f"src{s}", list(range(1, 21)))
    _subscribe(gateway.url, "flaky", endpoint.url)
    for s in range(8):
        writer.write(f"src{s}", list(range(21, 31)))
    ends = _ends(gateway.url)
    total = sum(ends.values())
    wait_until(lambda: len(endpoint.messages()) >= total, 60, "every message to be pushed")
    assert endpoint.requests >= 7
    delivered = _by_partition(endpoint.messages())
    # in order, nothing skipped, nothing twice: exactly the offsets 0..end-1 of every partition
    assert delivered == {p: list(range(end)) for p, end in ends.items() if end}
    status = httpx.get(f"{gateway.url}/v1/subscriptions/flaky").json()
    assert status["delivered_messages"] == total
    assert all(p["lag"] == 0 for p in status["partitions"])


def test_a_failing_endpoint_delays_only_its_own_subscription(
    gateway: Any, writer_for: Any, push_endpoint: Any
) -> None:
    broken = push_endpoint(lambda n: ("fail", 503))
    healthy = push_endpoint(lambda n: ("ok", 200))
    writer = writer_for(gateway.url)
    writer.write("src0", list(range(1, 51)))
    _subscribe(gateway.url, "broken", broken.url)
    _subscribe(gateway.url, "healthy", healthy.url)
    wait_until(lambda: len(healthy.messages()) == 50, 10, "the healthy endpoint's messages")
    assert broken.messages() == []
    assert broken.requests >= 1
    status = httpx.get(f"{gateway.url}/v1/subscriptions/broken").json()
    assert "503" in status["last_error"]["error"]
    assert status["delivered_messages"] == 0


@pytest.mark.fault
def test_push_positions_survive_a_gateway_kill(
    start_gateway: Any, writer_for: Any, push_endpoint: Any, tmp_path: Any
) -> None:
    endpoint = push_endpoint(lambda n: ("ok", 200))
    gw = start_gateway(tmp_path / "data", *PUSH_TO_LOOPBACK)
    writer_for(gw.url).write("src0", list(range(1, 41)))
    _subscribe(gw.url, "durable", endpoint.url, batch_size=10)
    wait_until(lambda: len(endpoint.messages()) == 40, 10, "the first 40 messages")
    gw.kill()
    gw2 = start_gateway(tmp_path / "data", *PUSH_TO_LOOPBACK)
    writer_for(gw2.url).write("src0", list(range(41, 61)))
    wait_until(lambda: len({m["offset"] for m in endpoint.messages()}) == 60, 15, "all 60")
    offsets = [m["offset"] for m in endpoint.messages()]
    # At least once across a crash: a batch in flight may come again, and the receiver can
    # drop it by (topic, partition, offset); nothing acknowledged before the kill is resent
    # beyond that one batch.
    assert sorted(set(offsets)) == list(range(60))
    assert len(offsets) - 60 <= 10


def test_bad_subscriptions_are_refused_and_change_nothing(gateway: Any, writer_for: Any) -> None:
    writer_for(gateway.url).write("src0", [1])
    url = f"{gateway.url}/v1/subscriptions"
    good = {"name": "s", "endpoint": "http://127.0.0.1:9/x", "topics": ["dc1.app"]}
    cases = [
        ({**good, "endpoint": "ftp://x"}, 400),
        ({**good, "topics": ["../etc"]}, 400),
        ({**good, "batch_size": 0}, 400),
        ({**good, "prefix": "dc1."}, 400),
        ({**good, "colour": "red"}, 400),
        ({**good, "filter": {"hash_mod": 2}}, 400),
    ]
    for body, status in cases:
        response = httpx.post(url, json=body)
        assert response.status_code == status, (body, response.text)
        assert response.json()["reason"]
    assert httpx.get(url).json() == {"subscriptions": []}
    assert httpx.post(url, json=good).status_code == 201
    assert httpx.post(url, json=good).status_code == 200  # the same again: nothing new
    clash = httpx.post(url, json={**good, "batch_size": 7})
    assert clash.status_code == 409
    assert httpx.delete(f"{url}/s").status_code == 200
    assert httpx.get(f"{url}/s").status_code == 404


def test_a_subscription_naming_a_topic_twice_or_too_many_topics_is_refused(
    gateway: Any,
) -> None:
    """A list of one topic repeated 400,000 times (4 MB) made a subscription whose status
    answered 143 MB and kept the gateway busy for every look at its partitions."""
    url = f"{gateway.url}/v1/subscriptions"
    good = {"name": "s", "endpoint": "http://127.0.0.1:9/x"}
    twice = httpx.post(url, json={**good, "topics": ["dc1.app", "dc1.web", "dc1.app"]})
    assert twice.status_code == 400, twice.text
    assert "dc1.app" in twice.json()["reason"]
    many = [f"dc1.t{i}" for i in range(1001)]
    too_many = httpx.post(url, json={**good, "topics": many})
    assert too_many.status_code == 400, too_many.text
    assert "1000" in too_many.json()["reason"]
    assert httpx.get(url).json() == {"subscriptions": []}
    assert httpx.post(url, json={**good, "topics": many[:1000]}).status_code == 201


def test_a_subscription_or_group_under_the_internal_prefix_is_refused(gateway: Any) -> None:
    """Internal topics are never read: a prefix under theirs would wait for ever."""
    sub = {"name": "i", "endpoint": "http://127.0.0.1:9/x", "prefix": "logbroker-internal."}
    refused = httpx.post(f"{gateway.url}/v1/subscriptions", json=sub)
    assert refused.status_code == 400 and "internal" in refused.json()["reason"], refused.text
    join = {"prefix": "logbroker-internal.deliv"}
    refused = httpx.post(f"{gateway.url}/v1/groups/g/members", json=join)
    assert refused.status_code == 400 and "internal" in refused.json()["reason"], refused.text
    assert httpx.get(f"{gateway.url}/v1/subscriptions").json() == {"subscriptions": []}


@pytest.mark.slow
def test_two_gateway_workers_deliver_each_batch_once(
    start_gateway: Any, writer_for: Any, push_endpoint: Any
) -> None:
    """Every worker runs push delivery; the lease lets only one deliver a subscription."""
    endpoint = push_endpoint(lambda n: ("ok", 200))
    gw = start_gateway(None, "--workers", "2", *PUSH_TO_LOOPBACK)
    writer = writer_for(gw.url)
    writer.write("src0", list(range(1, 31)))
    _subscribe(gw.url, "once", endpoint.url, batch_size=5)
    for n in range(31, 61):
        writer.write("src0", [n])
    wait_until(lambda: len(endpoint.messages()) >= 60, 20, "60 messages")
    time.sleep(1.5)  # a second deliverer would have sent its copies by now
    offsets = [m["offset"] for m in endpoint.messages()]
    assert offsets == list(range(60))


def _topics(data_dir: Any, *args: str) -> None:
    done = subprocess.run(
        logbroker_cmd("topics", "--data-dir", str(data_dir), *args),
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.fault
def test_latest_subscription_delivers_what_came_after_it_across_a_kill_before_any_push(
    start_gateway: Any, writer_for: Any, push_endpoint: Any, tmp_path: Any
) -> None:
    healthy = threading.Event()
    endpoint = push_endpoint(lambda n: ("ok", 200) if healthy.is_set() else ("fail", 503))
    gw = start_gateway(tmp_path / "data", *PUSH_TO_LOOPBACK)
    _topics(gw.data_dir, "create", "dc1.app", "--partitions", "1")
    writer_for(gw.url).write("src0", list(range(1, 11)))  # before the subscription: not pushed
    _subscribe(gw.url, "tail", endpoint.url, reset="latest")
    writer_for(gw.url).write("src0", list(range(11, 21)))
    wait_until(lambda: endpoint.requests >= 1, 10, "a first (refused) push")
    # Killed before any batch was accepted, so no position was ever moved by a delivery.
    gw.kill()
    healthy.set()
    gw2 = start_gateway(tmp_path / "data", *PUSH_TO_LOOPBACK)
    wait_until(lambda: len(endpoint.messages()) >= 10, 20, "the 10 messages after subscribing")
    assert [m["seqno"] for m in endpoint.messages()] == list(range(11, 21))
    writer_for(gw2.url).write("src0", [21])
    wait_until(lambda: len(endpoint.messages()) == 11, 10, "the next message")


@pytest.mark.fault
def test_subscription_to_a_topic_not_written_yet_delivers_it_from_its_start(
    gateway: Any, writer_for: Any, push_endpoint: Any
) -> None:
    endpoint = push_endpoint(lambda n: ("ok", 200))
    created = httpx.post(
        f"{gateway.url}/v1/subscriptions",
        json={"name": "early", "endpoint": endpoint.url, "topics": ["dc1.later"]},
    )
    assert created.status_code == 201, created.text
    status = httpx.get(f"{gateway.url}/v1/subscriptions/early").json()
    assert status["missing_topics"] == ["dc1.later"]
    writer_for(gateway.url).write("src", [1, 2, 3], log_type="later")
    wait_until(lambda: len(endpoint.messages()) == 3, 20, "the new topic's messages")
    assert [m["seqno"] for m in endpoint.messages()] == [1, 2, 3]
    status = httpx.get(f"{gateway.url}/v1/subscriptions/early").json()
    assert status["missing_topics"] == []


@pytest.mark.parametrize("gone_for_s", [0.0, 2.5])
def test_push_delivers_a_topic_created_again_from_its_start(
    gateway: Any, writer_for: Any, push_endpoint: Any, gone_for_s: float
) -> None:
    endpoint = push_endpoint(lambda n: ("ok", 200))
    _topics(gateway.data_dir, "create", "dc1.app", "--partitions", "1")
    writer = writer_for(gateway.url)
    writer.write("old", list(range(1, 11)))
    _subscribe(gateway.url, "again", endpoint.url)
    wait_until(lambda: len(endpoint.messages()) == 10, 10, "the old topic's messages")
    _topics(gateway.data_dir, "delete", "dc1.app")
    if gone_for_s:
        time.sleep(gone_for_s)  # delivery looks (every second) while the topic is gone
    _topics(gateway.data_dir, "create", "dc1.app", "--partitions", "1")
    # The new topic outgrows the old position (offset 10) before delivery looks again.
    writer.write("new", list(range(1, 16)))
    wait_until(lambda: len(endpoint.messages()) >= 25, 15, "the new topic's messages")
    time.sleep(0.5)
    pushed = [(m["source_id"], m["seqno"]) for m in endpoint.messages()]
    assert pushed == [("old", n) for n in range(1, 11)] + [("new", n) for n in range(1, 16)]
    # The documented dedup key tells the two topics apart: offsets 0..9 came twice.
    messages = endpoint.messages()
    assert len({(m["topic_id"], m["partition"], m["offset"]) for m in messages}) == 25
    new_id = httpx.get(f"{gateway.url}/v1/topics/dc1.app").json()["topic_id"]
    assert {m["topic_id"] for m in messages[10:]} == {new_id} != {messages[0]["topic_id"]}


def _append_foreign(data_dir: Any, values: list[bytes]) -> list[int]:
    """Records that are not envelopes (another producer's), straight into partition 0."""
    store = open_store(data_dir)
    try:
        first = store.append("dc1.app", 0, values).first_offset
        return list(range(first, first + len(values)))
    finally:
        store.close()


def _append_envelopes(data_dir: Any, count: int, size: int) -> None:
    """``count`` one-line chunks of about ``size`` bytes each, straight into partition 0."""
    store = open_store(data_dir)
    try:
        for seqno in range(1, count + 1):
            line = f"{seqno:06d} ".encode() + b"x" * size + b"\n"
            env = Envelope("direct", "h", "/f", "app", "raw", seqno, 0, 0, line)
            store.append("dc1.app", 0, [encode(env)])
    finally:
        store.close()


def test_a_subscription_counts_the_records_it_passes_over_that_are_not_envelopes(
    gateway: Any, writer_for: Any, push_endpoint: Any
) -> None:
    """Another producer's records hold no lines to push: delivery passes over them, but says
    so in the subscription's status (counted, the last one named), never silently."""
    endpoint = push_endpoint(lambda n: ("ok", 200))
    _topics(gateway.data_dir, "create", "dc1.app", "--partitions", "1")
    writer = writer_for(gateway.url)
    writer.write("src", [1, 2])
    foreign = _append_foreign(gateway.data_dir, [b'{"not": "ours"}', b"\x00\x01\x02"])
    writer.write("src", [3])
    _subscribe(gateway.url, "mixed", endpoint.url)
    wait_until(lambda: len(endpoint.messages()) == 3, 15, "the three messages")
    assert [m["offset"] for m in endpoint.messages()] == [0, 1, 4]
    status = httpx.get(f"{gateway.url}/v1/subscriptions/mixed").json()
    assert status["skipped_messages"] == {"not_envelope": 2, "lost_to_retention": 0}
    last = status["last_skip"]
    assert (last["kind"], last["topic"], last["partition"]) == ("not_envelope", "dc1.app", 0)
    assert last["offset"] == foreign[-1]
    assert status["partitions"][0]["lag"] == 0
    scrape = httpx.get(f"{gateway.url}/metrics").text
    name = "logbroker_push_subscription_skipped_messages"
    assert sample(scrape, name, subscription="mixed", kind="not_envelope") == 2
    assert sample(scrape, name, subscription="mixed", kind="lost_to_retention") == 0


@pytest.mark.fault
def test_a_subscription_counts_what_retention_dropped_before_it_was_delivered(
    gateway: Any, push_endpoint: Any
) -> None:
    """An endpoint down while retention drops segments: delivery resumes at the log's new
    start, and the status counts the messages it never delivered."""
    healthy = threading.Event()
    endpoint = push_endpoint(lambda n: ("ok", 200) if healthy.is_set() else ("fail", 503))
    _topics(gateway.data_dir, "create", "dc1.app", "--partitions", "1", "--segment-bytes", "4096")
    _subscribe(gateway.url, "late", endpoint.url)
    _append_envelopes(gateway.data_dir, 60, 1024)  # about 15 segments of 4 KiB
    wait_until(lambda: endpoint.requests >= 1, 10, "a first (refused) push")
    _topics(
        gateway.data_dir, "delete-segments", "dc1.app", "--partition", "0", "--before-offset", "30"
    )
    start = httpx.get(f"{gateway.url}/v1/topics/dc1.app").json()["partitions"][0]["start_offset"]
    assert 0 < start <= 30
    healthy.set()
    # The batch in hand when the endpoint failed (read before the segments went) is
    # delivered; what came after it up to the new start is lost, and counted.
    wait_until(lambda: 59 in {m["offset"] for m in endpoint.messages()}, 20, "the last message")
    delivered = sorted({m["offset"] for m in endpoint.messages()})
    in_hand = next(i for i, offset in enumerate([*delivered, -1]) if offset != i)
    assert 0 < in_hand <= min(25, start)  # the subscription's batch_size
    assert delivered == list(range(in_hand)) + list(range(start, 60))
    status = httpx.get(f"{gateway.url}/v1/subscriptions/late").json()
    lost = start - in_hand
    assert status["skipped_messages"] == {"not_envelope": 0, "lost_to_retention": lost}
    assert status["last_skip"]["kind"] == "lost_to_retention"
    assert status["last_skip"]["messages"] == lost
