"""What a read token can make a gateway worker hold, behind a real gateway: a fetch names each
partition once; the positions long-polls wait on are bounded per worker and per token (429
``limit_reached`` with ``Retry-After``, counted in /metrics), and a reader refused that way
reads without waiting meanwhile; a damaged partition's reads are logged once, whatever
offsets they ask for."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.consumer import Consumer
from delivery.pull_client import PullClient
from tests.conftest import GatewayProcess
from tests.gateway.conftest import Client

A = "reader-a-token-0123456789"
B = "reader-b-token-0123456789"
CONFIG = f"""
partitions = 2

[limits]
max_waiting_positions = 6
max_waiting_positions_per_token = 4

[tokens.{A}]
name = "tenant-a"
write = ["*"]
read = ["*"]
metrics = true
[tokens.{B}]
name = "tenant-b"
read = ["*"]
"""


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    base = tmp_path_factory.mktemp("bounded")
    config = base / "gateway.toml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    gateway = GatewayProcess(base / "data", ["--config", str(config)], base / "gw.log").start()
    writer = Client(gateway.url, token=A)
    assert writer.write("src", [1]).status_code == 200  # dc1.app, partitions 0 and 1
    writer.close()
    try:
        yield gateway
    finally:
        gateway.kill()


def _http(gateway: GatewayProcess, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.url, timeout=60, headers={"Authorization": f"Bearer {token}"}
    )


def _positions(count: int, topic: str = "dc1.app") -> list[dict[str, Any]]:
    """``count`` distinct positions: the topic's two partitions at their end, then partitions
    of topics not made yet."""
    there = [{"topic": topic, "partition": p, "offset": 1 - p} for p in range(2)]
    missing = [{"topic": f"dc1.later{n}", "partition": 0, "offset": 0} for n in range(count)]
    return (there + missing)[:count]


def _refusals(gateway: GatewayProcess, limit: str) -> int:
    with _http(gateway, A) as http:
        for line in http.get("/metrics").text.splitlines():
            if line.startswith(f'logbroker_limit_refusals_total{{limit="{limit}"}} '):
                return int(float(line.split()[-1]))
    return 0


class _LongPoll(threading.Thread):
    """A fetch with ``wait_ms`` in a thread; ``response`` once answered."""

    def __init__(self, gateway: GatewayProcess, token: str, count: int, wait_ms: int) -> None:
        super().__init__(daemon=True)
        self._http = _http(gateway, token)
        self._body = {"partitions": _positions(count), "wait_ms": wait_ms}
        self.response: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        self.response = self._http.post("/v1/fetch", json=self._body)
        self._http.close()


def _waiting_soon() -> None:
    time.sleep(1.5)  # the long-polls started have read and wait (their wait is 8 s or more)


def test_a_fetch_naming_a_partition_twice_is_refused_and_names_it(
    bounded: GatewayProcess,
) -> None:
    twice = [
        {"topic": "dc1.app", "partition": 0, "offset": 0},
        {"topic": "dc1.app", "partition": 1, "offset": 0},
        {"topic": "dc1.app", "partition": 0, "offset": 0},
    ]
    with _http(bounded, A) as http:
        refused = http.post("/v1/fetch", json={"partitions": twice})
        assert refused.status_code == 400, refused.text
        body = refused.json()
        assert body["error"] == "bad_request"
        assert "dc1.app/0 is named twice" in body["reason"], body
        assert (body["topic"], body["partition"]) == ("dc1.app", 0)
        # the same partitions once each are read
        answered = http.post("/v1/fetch", json={"partitions": twice[:2]})
        assert answered.status_code == 200, answered.text


def test_long_polls_past_a_tokens_share_or_the_workers_bound_are_refused(
    bounded: GatewayProcess,
) -> None:
    per_token = _refusals(bounded, "max_waiting_positions_per_token")
    total = _refusals(bounded, "max_waiting_positions")
    first = _LongPoll(bounded, A, 3, 8_000)
    _waiting_soon()
    with _http(bounded, A) as a, _http(bounded, B) as b:
        # A waits on 3 of its 4: a long-poll of 2 more is refused, at once and by name
        started = time.monotonic()
        refused = a.post("/v1/fetch", json={"partitions": _positions(2), "wait_ms": 8_000})
        assert time.monotonic() - started < 5
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1"
        body = refused.json()
        assert (body["error"], body["limit"], body["max"]) == (
            "limit_reached",
            "max_waiting_positions_per_token",
            4,
        )
        assert "max_waiting_positions_per_token" in body["reason"]
        # one position more fits its share; a read without wait_ms is never refused
        assert a.post("/v1/fetch", json={"partitions": _positions(2)}).status_code == 200
        one = a.get("/v1/topics/dc1.app/partitions/0/messages?offset=1&wait_ms=300")
        assert one.status_code == 200, one.text
        # B has a share of its own, but the worker waits on 3 of its 6 in all
        second = _LongPoll(bounded, B, 3, 8_000)
        _waiting_soon()
        over = b.get("/v1/topics/dc1.app/partitions/0/messages?offset=1&wait_ms=8000")
        assert over.status_code == 429, over.text
        assert (over.json()["limit"], over.json()["max"]) == ("max_waiting_positions", 6)
        assert over.headers["retry-after"] == "1"
    for poll in (first, second):
        poll.join(60)
        assert poll.response is not None and poll.response.status_code == 200
    # answered: their positions are free again
    with _http(bounded, A) as a:
        again = a.post("/v1/fetch", json={"partitions": _positions(4), "wait_ms": 300})
        assert again.status_code == 200, again.text
    assert _refusals(bounded, "max_waiting_positions_per_token") == per_token + 1
    assert _refusals(bounded, "max_waiting_positions") == total + 1


def test_a_reader_refused_a_long_poll_reads_without_waiting_meanwhile(
    bounded: GatewayProcess,
) -> None:
    holding = _LongPoll(bounded, A, 4, 10_000)  # A's whole share
    _waiting_soon()
    client = PullClient(bounded.url, token=A)
    consumer = Consumer(client, topics=("dc1.app",), from_beginning=True, prefetch=False)
    try:
        started = time.monotonic()
        got = []
        while not got and time.monotonic() - started < 8:
            got = consumer.poll(wait_ms=5_000)  # refused the wait: asks again without it
        assert [m.envelope.source_id for m in got] == ["src"]
        assert time.monotonic() - started < 8  # not after the long-poll holding the share
        assert holding.is_alive()
        # nothing new: the poll is answered after about the Retry-After, neither at once
        # (a busy loop) nor with an error
        started = time.monotonic()
        assert consumer.poll(wait_ms=5_000) == []
        assert 0.8 <= time.monotonic() - started < 5
    finally:
        consumer.close()
        client.close()
    holding.join(60)


def _damaged_gateway(base: Path) -> GatewayProcess:
    """A gateway whose dc1.app partition 0 lost acknowledged data (truncated while it was
    down): every read of it is refused as damaged data."""
    gateway = GatewayProcess(base / "data", [], base / "gw.log").start()
    writer = Client(gateway.url)
    for n in range(40):
        assert writer.write(f"s{n}", [1, 2]).status_code == 200
    writer.close()
    assert gateway.stop() == 0
    (segment, *_) = sorted((base / "data" / "topics" / "dc1.app").glob("*/0/*.log"))
    with open(segment, "r+b") as f:
        f.truncate(segment.stat().st_size - 5)
    gateway.log_path = base / "gw-after.log"
    return gateway.start()


def test_a_damaged_partition_is_logged_once_whatever_offsets_its_readers_ask_for(
    tmp_path: Path,
) -> None:
    gateway = _damaged_gateway(tmp_path)
    try:
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            for offset in range(0, 200, 10):
                body = {
                    "partitions": [
                        {"topic": "dc1.app", "partition": 0, "offset": offset},
                        {"topic": "dc1.app", "partition": 1, "offset": 0},
                    ]
                }
                answer = http.post("/v1/fetch", json=body)
                assert answer.status_code == 200, answer.text
                damaged, healthy = answer.json()["partitions"]
                assert damaged["error"]["error"] == "corrupt_data"
                assert "error" not in healthy
    finally:
        gateway.kill()
    # the reads' log lines (the gateway's), not the store's own note of the damage at start
    logged = [
        line
        for line in gateway.log().splitlines()
        if " ingest_api " in line and "dc1.app/0" in line
    ]
    assert len(logged) == 1, "\n".join(logged)  # was one per offset asked for: 20
