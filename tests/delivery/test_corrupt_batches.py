"""A batch damaged on disk after it was written (and read), behind a real gateway: every read
of it is refused, with an error that names topic, partition and offset and is not retried;
the other partitions of a fetch are answered, ``logbroker read`` reads the healthy partitions
and exits 3 naming the damaged one, and ``logbroker mirror`` copies everything else."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from log_store import TopicConfig, open_store
from session_dedup.envelope import Envelope, encode
from tests.conftest import REPO, logbroker_cmd
from tests.delivery.conftest import PUSH_TO_LOOPBACK, wait_until

TOPIC = "dc1.app"
PARTITIONS = 4
DAMAGED = 2
BATCHES = 5
"""Batches of one chunk each per partition: offsets 0..4."""


def _line(partition: int, n: int) -> str:
    return f"partition {partition} line {n}\n"


def _fill(data_dir: Path, topic: str, partitions: int) -> None:
    store = open_store(data_dir)
    try:
        store.create_topic(topic, TopicConfig(partitions=partitions))
        for p in range(partitions):
            for n in range(BATCHES):
                data = _line(p, n).encode() * 50
                log_type = topic.split(".", 1)[1]
                env = Envelope(f"src{p}", "h", "/f", log_type, "raw", n + 1, 0, 0, data)
                store.append(topic, p, [encode(env)])
    finally:
        store.close()


def _damage(data_dir: Path, topic: str, partition: int) -> None:
    """Flip a byte in the middle of the partition's segment: in the batch of offset 2."""
    (segment,) = (data_dir / "topics" / topic).glob(f"*/{partition}/*.log")
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))


def _fetch(url: str, offsets: dict[int, int]) -> dict[str, Any]:
    body = {
        "partitions": [{"topic": TOPIC, "partition": p, "offset": o} for p, o in offsets.items()]
    }
    answer = httpx.post(url + "/v1/fetch", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


@pytest.fixture
def damaged(start_gateway: Any, tmp_path: Path) -> Any:
    """A gateway whose dc1.app partition 2 was read whole once, then damaged at offset 2."""
    data_dir = tmp_path / "data"
    _fill(data_dir, TOPIC, PARTITIONS)
    gateway = start_gateway(data_dir)
    first = _fetch(gateway.url, dict.fromkeys(range(PARTITIONS), 0))
    assert all(len(p["messages"]) == BATCHES for p in first["partitions"])
    _damage(data_dir, TOPIC, DAMAGED)
    return gateway


def test_a_fetch_answers_the_healthy_partitions_and_names_the_damaged_one(damaged: Any) -> None:
    answer = _fetch(damaged.url, {0: 0, DAMAGED: 0})
    healthy, hurt = answer["partitions"]
    assert [m["data"] for m in healthy["messages"]] == [_line(0, n) * 50 for n in range(BATCHES)]
    # the records before the damaged batch, then (next fetch) the damage named
    assert [m["offset"] for m in hurt["messages"]] == [0, 1]
    assert "error" not in hurt and hurt["next_offset"] == 2
    for _ in range(2):  # every time
        again = _fetch(damaged.url, {0: BATCHES, DAMAGED: 2})
        hurt = again["partitions"][1]
        assert hurt["messages"] == [] and hurt["next_offset"] == 2
        assert hurt["error"]["error"] == "corrupt_data"
        assert hurt["error"]["offset"] == 2
        assert f"{TOPIC}/{DAMAGED} offset 2" in hurt["error"]["reason"]
        assert "checksum" in hurt["error"]["reason"]
    # the batch after it is whole: a reader told to move past the damage can
    past = _fetch(damaged.url, {DAMAGED: 3})["partitions"][0]
    assert [m["offset"] for m in past["messages"]] == [3, 4]


def test_damage_found_by_the_first_read_stops_only_its_partition(
    start_gateway: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    _fill(data_dir, TOPIC, PARTITIONS)
    _damage(data_dir, TOPIC, DAMAGED)  # before any read: no process ever saw it whole
    gateway = start_gateway(data_dir)
    answer = _fetch(gateway.url, {DAMAGED: 2, 3: 0})
    hurt, healthy = answer["partitions"]
    assert hurt["error"]["error"] == "corrupt_data" and hurt["error"]["offset"] == 2
    assert [m["offset"] for m in healthy["messages"]] == list(range(BATCHES))


def test_a_read_of_the_damaged_partition_alone_is_a_500_that_says_where(damaged: Any) -> None:
    url = f"{damaged.url}/v1/topics/{TOPIC}/partitions/{DAMAGED}/messages?offset=2"
    answer = httpx.get(url, timeout=30)
    assert answer.status_code == 500
    assert "retry-after" not in answer.headers  # retrying gets the same answer
    body = answer.json()
    assert body["error"] == "corrupt_data"
    assert (body["topic"], body["partition"], body["offset"]) == (TOPIC, DAMAGED, 2)
    described = httpx.get(damaged.url + "/openapi.json", timeout=30).json()
    route = described["paths"]["/v1/topics/{topic}/partitions/{partition}/messages"]["get"]
    assert "corrupt_data" in route["responses"]["500"]["description"]


def test_read_prints_the_healthy_partitions_and_exits_3_naming_the_damaged_one(
    damaged: Any,
) -> None:
    result = subprocess.run(
        logbroker_cmd(
            "read", "--server", damaged.url, "--topic", TOPIC, "--from-beginning",
            "--idle-exit", "1",
        ),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    lines = result.stdout.splitlines(keepends=True)
    for p in range(PARTITIONS):
        got = [n for n in range(BATCHES) if _line(p, n) in lines]
        assert got == ([0, 1] if p == DAMAGED else list(range(BATCHES))), p
    assert f"{TOPIC}/{DAMAGED}" in result.stderr and "checksum" in result.stderr
    assert f"{TOPIC}/{DAMAGED} was not read past offset 2" in result.stderr


def test_mirror_copies_every_other_partition_and_topic_and_exits_3(
    damaged: Any, start_gateway: Any, tmp_path: Path
) -> None:
    _fill(damaged.data_dir, "dc1.web", 2)
    dest = start_gateway(tmp_path / "dest", "--dc", "dc2")  # not dc1: its own topics are refused
    result = subprocess.run(
        logbroker_cmd(
            "mirror", "--from", damaged.url, "--to", dest.url, "--prefix", "dc1.",
            "--idle-exit", "2",
        ),
        cwd=REPO, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert f"{TOPIC}/{DAMAGED} was not copied past source offset 2" in result.stderr
    store = open_store(dest.data_dir, read_only=True)
    try:
        for topic, partitions in ((TOPIC, PARTITIONS), ("dc1.web", 2)):
            for p in range(partitions):
                want = 2 if (topic, p) == (TOPIC, DAMAGED) else BATCHES
                assert store.read(topic, p, 0, 10**6).end_offset == want, (topic, p)
    finally:
        store.close()


def test_push_delivery_goes_on_with_the_healthy_partitions_and_names_the_damaged_one(
    start_gateway: Any, push_endpoint: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    _fill(data_dir, TOPIC, PARTITIONS)
    _damage(data_dir, TOPIC, DAMAGED)
    gateway = start_gateway(data_dir, *PUSH_TO_LOOPBACK)
    endpoint = push_endpoint(lambda n: ("ok", 200))
    subscription = {
        "name": "damaged",
        "endpoint": endpoint.url,
        "topics": [TOPIC],
        "batch_size": 3,
        "linger_ms": 10,
    }
    created = httpx.post(gateway.url + "/v1/subscriptions", json=subscription, timeout=30)
    assert created.status_code == 201, created.text
    healthy = (PARTITIONS - 1) * BATCHES
    wait_until(lambda: len(endpoint.messages()) >= healthy + 2, 30, "every message but the damage")
    wait_until(lambda: bool(_subscription(gateway.url)["damaged"]), 30, "the damage in the status")
    delivered: dict[int, list[int]] = {}
    for m in endpoint.messages():
        delivered.setdefault(m["partition"], []).append(m["offset"])
    assert {p: sorted(set(o)) for p, o in delivered.items()} == {
        p: [0, 1] if p == DAMAGED else list(range(BATCHES)) for p in range(PARTITIONS)
    }
    # shown as long as it lasts (a delivery since then clears last_error, not this)
    (damage,) = _subscription(gateway.url)["damaged"]
    assert (damage["topic"], damage["partition"], damage["offset"]) == (TOPIC, DAMAGED, 2)
    assert "fails its checksum" in damage["error"], damage
    log = gateway.log_path.read_text()
    assert log.count("partition 2 stopped at offset 2") == 1, log[-2000:]


def _subscription(url: str) -> dict[str, Any]:
    answer = httpx.get(url + "/v1/subscriptions/damaged", timeout=30)
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    return doc
