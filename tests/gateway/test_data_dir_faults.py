"""The data directory taken away under a running gateway, a disk filled up to the last byte,
and a request that can never fit: what the gateway acks, refuses and says on ``/readyz``."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import logbroker_cmd
from tests.gateway.conftest import BIG_CHUNK, source_seqnos, write_big


def _fill_until_refused(client: Any) -> int:
    """Write log type ``fill`` until the gateway refuses for space (503); the chunks acked."""
    acked = 0
    for _ in range(100):
        response = write_big(client, "filler", acked + 1, 4, log_type="fill")
        if response.status_code != 200:
            break
        acked += 4
    assert response.status_code == 503, response.text
    return acked


def _fill_up(mount_point: Path) -> None:
    """Take what the gateway's writes left free, to the last byte."""
    fd = os.open(mount_point / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):  # ENOSPC: full to the last byte
            while os.write(fd, b"\0" * 4096):
                continue
    finally:
        os.close(fd)


def _readiness(client: Any) -> Any:
    time.sleep(1.1)  # past the cached look
    return client.http.get("/readyz")


def test_writes_are_refused_503_once_the_data_directory_is_removed(
    start_gateway: Any, tmp_path: Path, client_for: Any
) -> None:
    data_dir = tmp_path / "data"
    gw = start_gateway(data_dir)
    client = client_for(gw.url)
    assert client.acks("s", [1])[0]["status"] == "written"
    shutil.rmtree(data_dir)

    for log_type in ("app", "fresh"):  # a topic the gateway has open, and a new one
        refused = client.write("s", [2], log_type=log_type)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == "store_unavailable"
        assert "the data directory was removed" in refused.json()["reason"]
    not_ready = _readiness(client)
    assert not_ready.status_code == 503
    assert not_ready.json()["reason"] == (
        "the data directory was removed while the gateway was using it"
    )

    data_dir.mkdir()  # an empty directory (or another volume) at the path now
    refused = client.write("s", [2], log_type="fresh")
    assert refused.status_code == 503, refused.text
    assert "the data directory was removed" in refused.json()["reason"]
    assert list(data_dir.iterdir()) == [], "the gateway wrote into the new directory"


@pytest.mark.fault
def test_a_topic_is_deleted_on_a_full_disk_and_the_space_comes_back(
    start_gateway: Any, small_filesystem: Path, client_for: Any
) -> None:
    data_dir = small_filesystem / "data"
    gw = start_gateway(data_dir, "--partitions", "1")
    client = client_for(gw.url)
    assert _fill_until_refused(client) > 0
    assert client.http.get("/v1/topics/dc1.fill").status_code == 200
    _fill_up(small_filesystem)

    deleted = client.http.delete("/v1/topics/dc1.fill")
    assert deleted.status_code == 200, deleted.text
    ready = _readiness(client)
    assert ready.status_code == 200, ready.text
    assert client.acks("after", [1])[0]["status"] == "written"
    assert source_seqnos(gw.data_dir, "dc1.app", "after")[1] == [1]


@pytest.mark.fault
def test_the_cli_deletes_a_topic_on_a_full_disk(small_filesystem: Path) -> None:
    from log_store import open_store
    from log_store.errors import StoreFull

    data_dir = small_filesystem / "data"
    store = open_store(data_dir)
    store.create_topic("dc1.fill")
    with pytest.raises(StoreFull):
        for _ in range(200):
            store.append("dc1.fill", 0, [BIG_CHUNK] * 4)
    store.close()
    _fill_up(small_filesystem)

    done = subprocess.run(
        logbroker_cmd("topics", "--data-dir", str(data_dir), "delete", "dc1.fill"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "deleted dc1.fill"


def _fill_leaving(mount_point: Path, free_bytes: int, name: str) -> Path:
    fs = os.statvfs(mount_point)
    filler = mount_point / name
    filler.write_bytes(b"\0" * (fs.f_bavail * fs.f_frsize - free_bytes))
    return filler


@pytest.mark.fault
def test_a_smaller_write_refused_meanwhile_does_not_make_the_store_ready_early(
    small_filesystem: Path,
) -> None:
    from log_store import TopicConfig, open_store
    from log_store.errors import StoreFull

    store = open_store(small_filesystem / "data")
    store.create_topic("dc1.app", TopicConfig(partitions=2))
    store.append("dc1.app", 0, [BIG_CHUNK])
    store.append("dc1.app", 1, [BIG_CHUNK])
    _fill_leaving(small_filesystem, 1536 * 1024, "filler")
    with pytest.raises(StoreFull) as big:
        store.append("dc1.app", 0, [BIG_CHUNK] * 32)  # 2 MiB: more than is free
    rest = _fill_leaving(small_filesystem, 0, "rest")
    with pytest.raises(StoreFull):
        store.append("dc1.app", 1, [BIG_CHUNK])  # the last byte is taken: even 64 KiB is refused
    rest.unlink()  # 1.5 MiB free again: still short of the 2 MiB write

    reason = store.readiness()
    assert reason is not None
    assert reason.startswith(
        f"the data directory's file system is full: a write of {big.value.needed_bytes} bytes"
    )
    store.close()


@pytest.mark.fault
def test_a_catalog_write_refused_for_space_makes_the_store_not_ready(
    small_filesystem: Path,
) -> None:
    from log_store import open_store
    from log_store.errors import StoreUnavailable

    store = open_store(small_filesystem / "data")
    store.create_topic("dc1.app")
    rest = _fill_leaving(small_filesystem, 0, "rest")
    with pytest.raises(StoreUnavailable):
        store.put_topic_state_many_if_absent(
            "dc1.app", {f"pin-{i}": b"p" * 200 for i in range(20000)}
        )
    rest.unlink()
    filler = _fill_leaving(small_filesystem, 1536 * 1024, "filler")
    assert store.readiness() == (
        "the data directory's file system is full: a write did not fit, "
        f"{os.statvfs(small_filesystem).f_bavail * os.statvfs(small_filesystem).f_frsize} are free"
    )
    filler.unlink()
    assert store.readiness() is None
    store.close()


@pytest.mark.fault
def test_a_retention_is_lowered_on_a_full_disk(
    start_gateway: Any, small_filesystem: Path, client_for: Any
) -> None:
    gw = start_gateway(small_filesystem / "data", "--partitions", "1")
    client = client_for(gw.url)
    _fill_until_refused(client)
    _fill_up(small_filesystem)

    changed = client.http.patch("/v1/topics/dc1.fill", json={"retention_bytes": 1024 * 1024})
    assert changed.status_code == 200, changed.text
    assert changed.json()["retention_bytes"] == 1024 * 1024


def test_a_write_in_flight_when_the_data_directory_is_removed_is_not_acked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from log_store import open_store
    from log_store.errors import StoreUnavailable

    data_dir = tmp_path / "data"
    store = open_store(data_dir)
    store.create_topic("dc1.app")
    store.append("dc1.app", 0, [b"before"])
    real_fdatasync = os.fdatasync

    def removed_meanwhile(fd: int) -> None:
        shutil.rmtree(data_dir)  # after the group commit's first look, before its sync
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", removed_meanwhile)
    with pytest.raises(StoreUnavailable, match="the data directory was removed"):
        store.append("dc1.app", 0, [b"in flight"])
    store.close()
