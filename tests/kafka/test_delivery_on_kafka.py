"""Delivery from a gateway on Kafka, unchanged for its users: pull with a consumer group,
push, the legacy Archive API, and a mirror from one Kafka installation to another."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, GatewayProcess, logbroker_cmd
from tests.delivery.conftest import PushEndpoint
from tests.gateway.conftest import Client
from tests.kafka.conftest import wait_until

pytestmark = pytest.mark.kafka


def _read_group(url: str, group: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        logbroker_cmd(
            "read",
            "--server",
            url,
            "--topic",
            "dc1.app",
            "--group",
            group,
            "--from-beginning",
            "--format",
            "jsonl",
            "--idle-exit",
            "3",
        ),
        capture_output=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.splitlines()]


def _raw_seqnos(url: str, topic: str) -> dict[str, list[tuple[int, str]]]:
    """(seqno, kind) of every record per source, read raw from ``url``."""
    info = httpx.get(f"{url}/v1/topics/{topic}", timeout=30)
    if info.status_code == 404:
        return {}
    out: dict[str, list[tuple[int, str]]] = {}
    for p in info.json()["partitions"]:
        offset = p["start_offset"]
        while offset < p["end_offset"]:
            body = httpx.get(
                f"{url}/v1/topics/{topic}/partitions/{p['partition']}/messages",
                params={"offset": offset, "raw": 1},
                timeout=30,
            ).json()
            for m in body["messages"]:
                out.setdefault(m["source_id"], []).append((m["seqno"], m.get("kind", "chunk")))
            if body["next_offset"] <= offset:
                break
            offset = body["next_offset"]
    return out


@pytest.mark.slow
def test_pull_groups_push_legacy_and_mirror_work_on_kafka(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_namespace: str
) -> None:
    source = start_kafka_gateway(top='push_allow = ["127.0.0.1"]\n')
    client = Client(source.url)
    endpoint = PushEndpoint(lambda n: ("ok", 200)).start()
    subscription = {
        "name": "hook",
        "endpoint": endpoint.url,
        "topics": ["dc1.app"],
        "batch_size": 50,
        "linger_ms": 20,
    }
    try:
        for s in range(6):
            assert client.write(f"src{s}", list(range(1, 21))).status_code == 200
        created = httpx.post(f"{source.url}/v1/subscriptions", json=subscription, timeout=60)
        assert created.status_code == 201, created.text
        # the legacy Archive API: store, commit_request, commit
        http = httpx.Client(base_url=source.url, timeout=60)
        stored = http.post(
            "/store", params={"log_type": "app", "server": "old1", "file": "/a"}, content=b"old\n"
        )
        assert stored.status_code == 200, stored.text
        txn = http.post("/commit_request", params={"store_id": stored.json()["store_id"]})
        assert txn.status_code == 200, txn.text
        committed = http.post("/commit", params={"txn_id": txn.json()["txn_id"], "log_type": "app"})
        assert committed.status_code == 200, committed.text
        http.close()
        for s in range(6):
            assert client.write(f"src{s}", list(range(21, 31))).status_code == 200
    finally:
        client.close()
    expected = {(f"src{s}", n) for s in range(6) for n in range(1, 31)}

    # pull with a consumer group: everything once, then nothing more for the same group
    first = _read_group(source.url, "g1")
    chunks = [(r["source_id"], r["seqno"]) for r in first if r["source_id"].startswith("src")]
    assert sorted(chunks) == sorted(expected)
    legacy = [r for r in first if r["source_id"].startswith("legacy:")]
    assert len(legacy) == 1 and legacy[0]["data"].strip() == "old", legacy
    assert _read_group(source.url, "g1") == []

    # push: the subscription delivers every message, each with its offset
    wait_until(
        lambda: {(m["source_id"], m["seqno"]) for m in endpoint.messages()} >= expected,
        90,
        "push delivery",
    )
    pushed = [(m["topic"], m["partition"], m["offset"]) for m in endpoint.messages()]
    assert len(pushed) == len(set(pushed)), "a message was pushed twice"

    # mirror into a second Kafka installation (another namespace): exactly once, and the
    # legacy transaction still resolves there although offsets differ between the two
    dest = start_kafka_gateway("--dc", "dc2", namespace=kafka_namespace + "dst.")
    mirror = subprocess.run(
        logbroker_cmd(
            "mirror", "--from", source.url, "--to", dest.url, "--prefix", "dc1.", "--idle-exit", "4"
        ),
        capture_output=True,
        cwd=REPO,
        timeout=180,
    )
    assert mirror.returncode == 0, mirror.stderr.decode()[-3000:]
    assert _raw_seqnos(dest.url, "dc1.app") == _raw_seqnos(source.url, "dc1.app")
    copied = _read_group(dest.url, "g2")
    assert sorted(
        (r["source_id"], r["seqno"]) for r in copied if r["source_id"].startswith("src")
    ) == sorted(expected)
    legacy = [r for r in copied if r["source_id"].startswith("legacy:")]
    assert len(legacy) == 1 and legacy[0]["data"].strip() == "old", "the legacy data was lost"
    endpoint.stop()


def test_a_group_reader_keeps_up_with_writes_going_on_and_prints_each_line_once(
    start_kafka_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """Every Kafka transaction ends with a marker after its last record.  A read that stopped
    at the partition's end used to resume on that marker, find only what was committed since
    and stop on the next marker: while writes went on, one fetch of a reader that had caught
    up never ended, the reader missed its heartbeats, was dropped from its group and printed
    everything again from its last commit.  Now a reader that caught up is answered at once,
    and a group reader started before the writer prints each line once."""
    import threading
    import time

    gateway = start_kafka_gateway()
    client = Client(gateway.url)
    assert client.write("first", [1]).status_code == 200  # the topic exists
    out_path, err_path = tmp_path / "reader.jsonl", tmp_path / "reader.err"
    with open(out_path, "wb") as out_file, open(err_path, "wb") as err_file:
        reader = subprocess.Popen(
            logbroker_cmd(
                "read", "--server", gateway.url, "--topic", "dc1.app", "--group", "keep-up",
                "--from-beginning", "--format", "jsonl",
            ),
            stdout=out_file, stderr=err_file, cwd=REPO,
        )  # fmt: skip
    stop = threading.Event()
    written: list[tuple[str, int]] = []
    failures: list[BaseException] = []

    def write() -> None:
        writer = Client(gateway.url)
        seqno = 0
        try:
            while not stop.is_set():
                seqno += 1
                for source in ("s1", "s2", "s3", "s4"):
                    answer = writer.write(source, [seqno])
                    assert answer.status_code == 200, answer.text
                    written.append((source, seqno))
                time.sleep(0.02)
        except BaseException as exc:  # raised in the test below, not lost with the thread
            failures.append(exc)
        finally:
            writer.close()

    thread = threading.Thread(target=write)
    thread.start()
    try:
        time.sleep(3)
        # a fetch at the partitions' ends while the writes go on comes back within its wait
        info = httpx.get(f"{gateway.url}/v1/topics/dc1.app", timeout=30).json()
        for _ in range(5):
            positions = [
                {"topic": "dc1.app", "partition": p["partition"], "offset": p["end_offset"]}
                for p in info["partitions"]
            ]
            started = time.monotonic()
            answer = httpx.post(
                f"{gateway.url}/v1/fetch",
                json={"partitions": positions, "wait_ms": 1000},
                timeout=60,
            )
            assert answer.status_code == 200
            assert time.monotonic() - started < 5
            info = httpx.get(f"{gateway.url}/v1/topics/dc1.app", timeout=30).json()
        time.sleep(12)  # longer than the reader's 10 s session: a stuck fetch loses it
    finally:
        stop.set()
        thread.join()
    assert not failures, failures
    expected = len(written) + 1
    deadline = time.monotonic() + 60
    while out_path.read_bytes().count(b"\n") < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    reader.terminate()
    assert reader.wait(60) == 0, err_path.read_text()
    out, err = out_path.read_bytes(), err_path.read_bytes()
    assert b"dropped from group" not in err and b"commit refused" not in err, err.decode()
    printed = [(r["source_id"], r["seqno"]) for r in map(json.loads, out.splitlines())]
    assert len(printed) == len(set(printed)), "a line was printed twice"
    assert sorted(printed) == sorted([("first", 1), *written])
    client.close()
