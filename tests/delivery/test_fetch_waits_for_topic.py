"""A long-poll naming a topic that is not made yet waits for it (``wait_ms`` is honoured):
raw HTTP readers started before their topic do not spin, and one missing topic in a fetch of
several does not cancel the wait for the others."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx


def _later(delay_s: float, action: Any) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay_s), action()), daemon=True)
    thread.start()
    return thread


def test_a_fetch_of_a_topic_not_made_yet_waits_for_it_and_then_says_so(gateway: Any) -> None:
    started = time.monotonic()
    alone = httpx.get(
        f"{gateway.url}/v1/topics/dc1.nosuch/partitions/0/messages",
        params={"offset": 0, "wait_ms": 1500},
        timeout=30,
    )
    assert alone.status_code == 404 and alone.json()["error"] == "unknown_topic"
    assert time.monotonic() - started >= 1.4  # was answered at once: readers spun

    made = httpx.post(f"{gateway.url}/v1/topics", json={"name": "dc1.app", "partitions": 1})
    assert made.status_code == 201, made.text
    started = time.monotonic()
    both = httpx.post(
        f"{gateway.url}/v1/fetch",
        json={
            "partitions": [
                {"topic": "dc1.app", "partition": 0, "offset": 0},
                {"topic": "dc1.nosuch", "partition": 0, "offset": 0},
            ],
            "wait_ms": 1500,
        },
        timeout=30,
    )
    assert both.status_code == 200, both.text
    assert time.monotonic() - started >= 1.4  # the missing topic did not end the wait
    app, nosuch = both.json()["partitions"]
    assert app["messages"] == [] and "error" not in app
    assert nosuch["error"]["error"] == "unknown_topic"


def test_a_fetch_waiting_on_a_missing_topic_is_woken_by_another_partitions_data(
    gateway: Any, writer_for: Any
) -> None:
    writer = writer_for(gateway.url)
    writer.write("src", [1])  # dc1.app exists, one message
    info = httpx.get(f"{gateway.url}/v1/topics/dc1.app").json()
    ends = {p["partition"]: p["end_offset"] for p in info["partitions"]}
    asked = [{"topic": "dc1.app", "partition": p, "offset": e} for p, e in ends.items()]
    asked.append({"topic": "dc1.late", "partition": 0, "offset": 0})
    _later(1.0, lambda: writer.write("src", [2]))
    started = time.monotonic()
    answer = httpx.post(
        f"{gateway.url}/v1/fetch", json={"partitions": asked, "wait_ms": 20_000}, timeout=30
    )
    took = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    entries = answer.json()["partitions"]
    assert [m["seqno"] for e in entries for m in e["messages"]] == [2]
    assert entries[-1]["error"]["error"] == "unknown_topic"
    assert 0.8 <= took < 10  # waited for the append, not for the whole wait_ms


def test_a_fetch_waiting_on_a_missing_topic_reads_it_once_it_is_made(
    gateway: Any, writer_for: Any
) -> None:
    writer = writer_for(gateway.url)
    _later(1.0, lambda: writer.write("src", [1, 2], log_type="late"))
    started = time.monotonic()
    answer = httpx.post(
        f"{gateway.url}/v1/fetch",
        json={
            "partitions": [{"topic": "dc1.late", "partition": p, "offset": 0} for p in range(4)],
            "wait_ms": 20_000,
        },
        timeout=30,
    )
    took = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    entries = answer.json()["partitions"]
    assert sorted(m["seqno"] for e in entries for m in e["messages"]) == [1, 2]
    assert all("error" not in e for e in entries)
    assert 0.8 <= took < 10
