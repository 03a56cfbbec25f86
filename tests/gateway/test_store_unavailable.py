"""A full or read-only data directory answers 503 with Retry-After and acknowledges nothing."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import meta, source_seqnos

CHUNK = b"x" * 64 * 1024


def write_big(client: Any, source: str, first: int, count: int) -> Any:
    from ingest_api.framing import encode_binary

    chunks = [(s, 0, CHUNK) for s in range(first, first + count)]
    return client.post_binary(encode_binary([(meta(source), chunks)]))


def _wait_ready(client: Any) -> None:
    deadline = time.monotonic() + 10
    while client.http.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, "the gateway never became ready again"
        time.sleep(0.2)
    assert client.http.get("/readyz").json()["status"] == "ready"


@pytest.mark.fault
def test_full_disk_answers_503_acks_nothing_and_recovers(
    start_gateway: Any, small_filesystem: Path, client_for: Any
) -> None:
    gw = start_gateway(small_filesystem / "data")
    client = client_for(gw.url)
    acked = 0
    refused = None
    for _ in range(200):
        response = write_big(client, "filler", acked + 1, 4)
        if response.status_code != 200:
            refused = response
            break
        acked += 4
    assert refused is not None, "a 4 MiB file system never filled up"
    assert refused.status_code == 503
    assert refused.json()["error"] == "store_unavailable"
    assert int(refused.headers["retry-after"]) >= 1
    assert client.session("filler")["last_seqno"] == acked, "a refused chunk was written"
    # alive, but not ready for writes: a balancer or a prober can tell the two apart
    assert client.http.get("/healthz").status_code == 200
    not_ready = client.http.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.json() == {
        "error": "not_ready",
        "reason": "the data directory's file system is full",
    }
    assert "retry-after" in not_ready.headers

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_filesystem)], check=True)
    _wait_ready(client)
    retried = write_big(client, "filler", acked + 1, 4)
    assert retried.status_code == 200, retried.text
    assert [a["status"] for a in retried.json()["results"][0]["acks"]] == ["written"] * 4
    seqnos = source_seqnos(gw.data_dir, "dc1.app", "filler")[1]
    assert seqnos == list(range(1, acked + 5))


@pytest.mark.fault
def test_read_only_data_dir_answers_503_and_the_retry_succeeds_once_writable(
    start_gateway: Any, small_filesystem: Path, tmp_path: Path, client_for: Any
) -> None:
    data_dir = tmp_path / "data"
    gw = start_gateway(data_dir)
    client = client_for(gw.url)
    assert client.acks("s", [1])[0]["status"] == "written"
    topics_dir = data_dir / "topics"
    # the directory where new partitions are made becomes a read-only file system
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(topics_dir)], check=True
    )
    try:
        refused = client.write("s", [1], log_type="fresh")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == "store_unavailable"
        assert "retry-after" in refused.headers
        session_refused = client.http.post("/v1/sessions", json=meta("t", "fresh"))
        assert session_refused.status_code == 503
        time.sleep(1.1)  # past the cached look of the start
        not_ready = client.http.get("/readyz")
        assert not_ready.status_code == 503
        assert "read-only" in not_ready.json()["reason"]
    finally:
        subprocess.run(["umount", str(topics_dir)], check=True)
    _wait_ready(client)
    acks = client.acks("s", [1, 2], log_type="fresh")
    assert [a["status"] for a in acks] == ["written", "written"]
    assert source_seqnos(data_dir, "dc1.fresh", "s")[1] == [1, 2]
