"""Topics on a disk filled to the last byte: a new one is refused whole, and listing,
describing, the dashboard and the audit of topics whose partitions no write has made yet
work without making them (the operator's first steps on a full disk)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import logbroker_cmd
from tests.gateway.conftest import write_big
from tests.gateway.test_data_dir_faults import _fill_leaving, _readiness


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(logbroker_cmd(*args), capture_output=True, text=True, timeout=60)


def _files_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def _full_gateway(start_gateway: Any, small_filesystem: Path, client_for: Any) -> Any:
    """A gateway whose disk is full to the last byte after it refused a 256 KiB write for
    space, holding ``dc1.app`` (written) and ``dc1.idle`` (4 partitions, never written)."""
    gw = start_gateway(small_filesystem / "data")
    client = client_for(gw.url)
    created = client.http.post("/v1/topics", json={"name": "dc1.idle", "partitions": 4})
    assert created.status_code == 201, created.text
    assert client.acks("s", [1])[0]["status"] == "written"
    _fill_leaving(small_filesystem, 100 * 1024, "filler")
    refused = write_big(client, "big", 1, 4)
    assert refused.status_code == 503, refused.text
    assert "the write needs 262" in refused.json()["reason"]
    _fill_leaving(small_filesystem, 0, "rest")
    return client


@pytest.mark.fault
def test_a_new_log_type_on_a_full_disk_is_refused_as_full_and_leaves_no_topic(
    start_gateway: Any, small_filesystem: Path, client_for: Any
) -> None:
    client = _full_gateway(start_gateway, small_filesystem, client_for)
    # Room for a catalog row, not for a topic's partitions (what the write refused took).
    (small_filesystem / "rest").unlink()

    new_type = client.write("w", [1], log_type="newt")
    assert new_type.status_code == 503, new_type.text
    ready = _readiness(client)
    seen = {
        "write's reason": new_type.json()["reason"].split(":")[0],
        "GET /v1/topics/dc1.newt": client.http.get("/v1/topics/dc1.newt").status_code,
        "dc1.newt's files": (small_filesystem / "data" / "topics" / "dc1.newt").exists(),
        "/readyz": ready.status_code,
        "/readyz's reason": re.sub(r"\d+", "N", ready.json().get("reason", "")),
    }
    assert seen == {
        "write's reason": "the data directory's file system is full",
        "GET /v1/topics/dc1.newt": 404,  # nothing left behind
        "dc1.newt's files": False,
        "/readyz": 503,
        "/readyz's reason": (
            "the data directory's file system is full: a write of N bytes did not fit, N are free"
        ),
    }, (new_type.text, ready.text)
    assert ready.json()["reason"].startswith(
        "the data directory's file system is full: a write of 262"
    )


@pytest.mark.fault
def test_the_first_steps_on_a_full_disk_work_with_a_topic_no_write_made(
    start_gateway: Any, small_filesystem: Path, client_for: Any
) -> None:
    client = _full_gateway(start_gateway, small_filesystem, client_for)
    data_dir = small_filesystem / "data"

    listed = _run("topics", "--data-dir", str(data_dir), "list")
    described = client.http.get("/v1/topics/dc1.idle")
    overview = client.http.get("/v1/ui/overview")
    audited = _run("audit", "--data-dir", str(data_dir))
    seen = {
        "topics list": listed.returncode,
        "GET /v1/topics/dc1.idle": described.status_code,
        "GET /v1/ui/overview": overview.status_code,
        "audit": audited.returncode,
    }
    assert seen == {
        "topics list": 0,
        "GET /v1/topics/dc1.idle": 200,
        "GET /v1/ui/overview": 200,
        "audit": 0,
    }, (listed.stderr, described.text, overview.text[:300], audited.stdout + audited.stderr)
    assert "dc1.idle" in listed.stdout and "dc1.app" in listed.stdout
    assert len(described.json()["partitions"]) == 4
    assert "audit: OK" in audited.stdout
    assert not (data_dir / "topics" / "dc1.idle").exists(), "a read made partition files"


@pytest.mark.fault
def test_partitions_no_write_made_read_as_empty_on_a_full_disk_and_are_made_once_there_is_room(
    small_filesystem: Path,
) -> None:
    from log_store import TopicConfig, open_store
    from log_store.errors import StoreFull

    data_dir = small_filesystem / "data"
    store = open_store(data_dir)
    store.create_topic("dc1.app", TopicConfig(partitions=4))
    store.append("dc1.app", 0, [b"one"])
    store.create_topic("dc1.idle", TopicConfig(partitions=4))
    before = _files_under(data_dir / "topics")
    filler = _fill_leaving(small_filesystem, 0, "filler")

    described = store.describe_topic("dc1.app")
    assert [p.end_offset for p in described.partitions] == [1, 0, 0, 0]
    assert store.read("dc1.app", 2, 0).records == []
    assert store.end_offset("dc1.app", 3) == 0
    assert store.check_batches("dc1.app", 1) == []
    assert store.get_state("dc1.app", 1, "k") is None
    assert store.wait_for_data("dc1.app", 1, 0, 0.1) is False
    assert _files_under(data_dir / "topics") == before, "a read made files"

    with pytest.raises(StoreFull) as refused:
        store.append("dc1.app", 2, [b"two"])
    assert str(refused.value).startswith(
        "the data directory's file system is full: making dc1.app/2's files did not fit, "
    )
    made = [n for n in _files_under(data_dir / "topics") if n.split("/")[2] == "2"]
    assert not [n for n in made if "partition.db" in n], made  # no half-made database
    with pytest.raises(StoreFull, match="a new topic needs 1048576 bytes free"):
        store.create_topic("dc1.newt")
    assert [t.name for t in store.list_topics()] == ["dc1.app", "dc1.idle"]
    assert store.describe_topic("dc1.app").partitions[2].end_offset == 0
    # These give the space reserve back to the file system first (the disk is full).  The
    # deletion makes the partitions no write made, to mark them deleted.
    store.delete_topic("dc1.idle")
    assert not [n for n in _files_under(data_dir / "topics") if n.startswith("dc1.idle/")]
    assert store.delete_segments_before("dc1.app", 3, 0) == 0
    store.alter_topic("dc1.app", retention_bytes=1024)
    store.apply_retention()
    assert not [n for n in _files_under(data_dir / "topics") if n.split("/")[2] == "3"]

    filler.unlink()
    assert store.append("dc1.app", 2, [b"two"]).first_offset == 0
    assert store.read("dc1.app", 2, 0).records[0].value == b"two"
    store.create_topic("dc1.newt")
    store.close()


@pytest.mark.fault
def test_the_cli_describes_a_topic_no_write_made_on_a_full_disk(small_filesystem: Path) -> None:
    from log_store import TopicConfig, open_store

    data_dir = small_filesystem / "data"
    with open_store(data_dir) as store:
        store.create_topic("dc1.app", TopicConfig(partitions=3))
    _fill_leaving(small_filesystem, 0, "filler")
    assert os.statvfs(small_filesystem).f_bavail == 0
    described = _run("topics", "--data-dir", str(data_dir), "describe", "dc1.app")
    assert described.returncode == 0, described.stderr
    assert not (data_dir / "topics" / "dc1.app").exists()


def test_a_reader_waiting_on_a_partition_no_write_made_wakes_when_a_write_makes_it(
    tmp_path: Path,
) -> None:
    from log_store import TopicConfig, open_store

    store = open_store(tmp_path / "data")
    store.create_topic("dc1.app", TopicConfig(partitions=2))
    assert store.wait_for_data("dc1.app", 1, 0, 0.2) is False
    assert not (tmp_path / "data" / "topics" / "dc1.app").exists(), "a wait made files"
    writer = threading.Timer(0.3, lambda: store.append("dc1.app", 1, [b"first"]))
    writer.start()
    started = time.monotonic()
    assert store.wait_for_data("dc1.app", 1, 0, 30) is True
    assert time.monotonic() - started < 5
    writer.join()
    assert store.read("dc1.app", 1, 0).records[0].value == b"first"
    store.close()
