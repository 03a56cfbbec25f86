"""A full or read-only data directory answers 503 with Retry-After and acknowledges nothing."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import BIG_CHUNK, meta, source_seqnos, write_big


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
    assert not_ready.json()["error"] == "not_ready"
    # the sizes of the refused write (SQLite's own pages: of unknown size)
    assert re.fullmatch(
        r"the data directory's file system is full: a write( of \d+ bytes)? did not fit, "
        r"\d+ are free",
        not_ready.json()["reason"],
    ), not_ready.text
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


def _fill_leaving(mount_point: Path, free_bytes: int) -> Path:
    """A file that takes all but about ``free_bytes`` of the file system."""
    import os

    fs = os.statvfs(mount_point)
    filler = mount_point / "filler"
    filler.write_bytes(b"\0" * (fs.f_bavail * fs.f_frsize - free_bytes))
    return filler


@pytest.mark.fault
def test_a_write_larger_than_the_free_space_says_so_and_is_taken_once_space_is_freed(
    start_gateway: Any, small_filesystem: Path, client_for: Any
) -> None:
    gw = start_gateway(small_filesystem / "data")
    client = client_for(gw.url)
    assert write_big(client, "s", 1, 1).status_code == 200
    filler = _fill_leaving(small_filesystem, 1536 * 1024)
    refused = write_big(client, "s", 2, 32)  # 2 MiB of chunks: more than is free
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"] == "store_unavailable"
    reason = refused.json()["reason"]
    assert reason.startswith("no space left on the data directory's file system: the write ")
    needed, free = (int(w) for w in reason.split() if w.isdigit())
    assert needed > 32 * len(BIG_CHUNK) > free > 1024 * 1024
    assert "it is taken once space is freed" in reason
    assert int(refused.headers["retry-after"]) >= 5
    assert client.session("s")["last_seqno"] == 1, "a refused chunk was written"
    time.sleep(1.1)  # past the cached look of the start
    not_ready = client.http.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.json()["reason"] == (
        f"the data directory's file system is full: a write of {needed} bytes did not fit, "
        f"{free} are free"
    )

    filler.unlink()
    _wait_ready(client)
    retried = write_big(client, "s", 2, 32)
    assert retried.status_code == 200, retried.text
    assert [a["status"] for a in retried.json()["results"][0]["acks"]] == ["written"] * 32
    assert source_seqnos(gw.data_dir, "dc1.app", "s")[1] == list(range(1, 34))


@pytest.mark.fault
def test_a_write_larger_than_the_whole_file_system_is_507_never_fits(
    start_gateway: Any, small_filesystem: Path, client_for: Any
) -> None:
    gw = start_gateway(small_filesystem / "data")
    client = client_for(gw.url)
    assert write_big(client, "s", 1, 1).status_code == 200
    refused = write_big(client, "s", 2, 80)  # 5 MiB on a 4 MiB file system
    assert refused.status_code == 507, refused.text
    assert refused.json()["error"] == "insufficient_storage"
    reason = refused.json()["reason"]
    assert "it can never fit: the file system holds 4194304 bytes in all" in reason
    assert client.session("s")["last_seqno"] == 1
    # the client's mistake, not a shortage: the gateway stays ready
    time.sleep(1.1)  # past the cached look
    ready = client.http.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert write_big(client, "s", 2, 2).status_code == 200
    assert source_seqnos(gw.data_dir, "dc1.app", "s")[1] == [1, 2, 3]
