"""Long-polls of many existing partitions cost the gateway no thread per partition: a real
gateway's thread count stays flat while 6 fetches wait on 516 partitions each (most of them
made by no write yet), one append wakes all 6 at once, and a long-poll whose client went
away lets go of what it waited on at once, not when its ``wait_ms`` is up."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.delivery.conftest import Writer

READER = "r" * 32
ADMIN = "z" * 32
CONFIG = f"""
partitions = 4
[limits]
max_waiting_positions = 40000
max_waiting_positions_per_token = 40000
[tokens.{READER}]
write = ["app"]
read = ["dc1.*"]
[tokens.{ADMIN}]
admin = true
"""
TOPICS = 8
PARTITIONS = 64
FETCHES = 6


@pytest.fixture
def gw(start_gateway: Any, tmp_path: Path) -> Any:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    return start_gateway(tmp_path / "data", "--config", str(config))


def threads_of_group(group: int) -> int:
    """Threads of every process of the process group ``group`` (the gateway and its workers)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) == group:
                count += len(os.listdir(f"/proc/{entry}/task"))
        except (OSError, ValueError, IndexError):
            continue
    return count


def make_topics(
    url: str, topics: int = TOPICS, partitions: int = PARTITIONS
) -> list[dict[str, object]]:
    """The positions of the fetches: every partition of ``topics`` topics no write has made,
    and of ``dc1.app``, which the writer's chunks go to."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    httpx.post(url + "/v1/topics", json={"name": "dc1.app"}, headers=admin).raise_for_status()
    positions: list[dict[str, object]] = [
        {"topic": "dc1.app", "partition": p, "offset": 0} for p in range(4)
    ]
    for i in range(topics):
        body = {"name": f"dc1.web{i}", "partitions": partitions}
        httpx.post(url + "/v1/topics", json=body, headers=admin, timeout=60).raise_for_status()
        positions += [
            {"topic": f"dc1.web{i}", "partition": p, "offset": 0} for p in range(partitions)
        ]
    return positions


def long_polls_wait_flat_and_wake_at_once(
    gw: Any, positions: list[dict[str, object]], *, more_threads: int, slack_s: float
) -> None:
    """``FETCHES`` long-polls of ``positions`` at once on gateway ``gw``: while they wait,
    its process group has fewer than ``more_threads`` threads more than before (one per
    waited partition is what this guards against); one write wakes all of them, within
    ``slack_s`` plus two reads of the positions each (slack for a loaded host only), not
    by their ``wait_ms`` (60 s)."""
    headers = {"Authorization": f"Bearer {READER}"}
    started = time.monotonic()
    first = httpx.post(
        gw.url + "/v1/fetch", json={"partitions": positions}, headers=headers, timeout=120
    )
    assert first.status_code == 200, first.text
    read_s = time.monotonic() - started
    """What one read of the positions takes (the fetches read them, one after another,
    before they wait, and again once woken)."""
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
    time.sleep(slack_s + 2 * FETCHES * read_s)  # all are waiting
    assert not answered, "a fetch was answered before anything was written"
    during = threads_of_group(gw.proc.pid)
    assert during - before < more_threads, (before, during, read_s)

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
    assert max(at for at, _, _ in answered) - written < slack_s + 2 * FETCHES * read_s, answered


def test_many_long_polls_of_existing_partitions_take_no_thread_each_and_wake_at_once(
    gw: Any,
) -> None:
    # one thread per waited partition was 516 more; the pool's threads for the reads may
    # grow a bit
    long_polls_wait_flat_and_wake_at_once(gw, make_topics(gw.url), more_threads=50, slack_s=3)


def test_a_long_poll_whose_client_went_away_lets_go_of_its_positions_at_once(
    start_gateway: Any, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG.replace("40000", "500"))
    config.chmod(0o600)
    gw = start_gateway(tmp_path / "data", "--config", str(config))
    positions = make_topics(gw.url)[:300]
    body = json.dumps({"partitions": positions, "wait_ms": 60_000}).encode()
    gone = socket.create_connection(("127.0.0.1", gw.port))
    gone.sendall(
        b"POST /v1/fetch HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {READER}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    headers = {"Authorization": f"Bearer {READER}"}
    again = {"partitions": positions, "wait_ms": 100}
    with httpx.Client(timeout=30, headers=headers) as http:
        deadline = time.monotonic() + 10
        while http.post(gw.url + "/v1/fetch", json=again).status_code != 429:
            # the first long-poll is not waiting yet: this one fitted beside nothing
            assert time.monotonic() < deadline, "the first long-poll never waited"
            time.sleep(0.05)
        gone.close()
        closed = time.monotonic()
        while (answer := http.post(gw.url + "/v1/fetch", json=again)).status_code == 429:
            # 300 + 300 positions do not fit in 500 while the first one's are held: its
            # wait_ms (60 s) is not what lets them go
            assert time.monotonic() - closed < 5, "the positions were held after the close"
            time.sleep(0.1)
    assert answer.status_code == 200, answer.text
