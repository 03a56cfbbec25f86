"""A data dir whose files were damaged or lost while the gateway was down, behind a real
gateway: one partition that lost acknowledged data is refused alone (its topic's other
partitions write and read, the reader and the audit name it); a partition whose index is gone
is rebuilt from its segments, never read as empty; a catalog that is gone (or only its WAL)
stops the gateway from starting rather than take every acknowledged chunk again.  Uses of a
refused partition hold no descriptor and do not open it again until its files change (a
repair is served without a restart); the reasons clients get name no path of the data dir."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from inotify_simple import INotify, flags

from ingest_api.framing import encode_binary
from session_dedup.pinning import stable_partition
from tests.conftest import REPO, GatewayProcess, logbroker_cmd
from tests.gateway.conftest import chunk_data, meta, source_seqnos

TOPIC = "dc1.app"
PARTITIONS = 4
SOURCES = [f"s{i}" for i in range(12)]
SEQNOS = [1, 2, 3]


def _partition_of(source_id: str) -> int:
    return stable_partition(source_id, PARTITIONS)


def _written(client: Any) -> None:
    for source in SOURCES:
        assert [a["status"] for a in client.acks(source, SEQNOS)] == ["written"] * len(SEQNOS)


def _partition_dir(data_dir: Path, partition: int) -> Path:
    (path,) = (data_dir / "topics" / TOPIC).glob(f"*/{partition}")
    return path


def _statuses(client: Any, source: str, seqnos: list[int]) -> list[str]:
    response = client.write(source, seqnos)
    assert response.status_code == 200, response.text
    return [a["status"] for a in response.json()["results"][0]["acks"]]


def _read_chunks(stdout: str) -> list[tuple[str, int]]:
    """(source, seqno) of each message ``read --format jsonl`` printed of this test's sources."""
    return [
        (m["source_id"], m["seqno"])
        for m in map(json.loads, stdout.splitlines())
        if m["source_id"] in SOURCES
    ]


def _logbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd(*args), cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_a_partition_that_lost_acked_data_is_refused_alone_and_named(
    start_gateway: Any, client_for: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    gw = start_gateway(data_dir)
    _written(client_for(gw.url))
    assert gw.stop() == 0
    damaged = _partition_of(SOURCES[0])
    (segment,) = _partition_dir(data_dir, damaged).glob("*.log")
    with open(segment, "r+b") as f:
        f.truncate(segment.stat().st_size - 5)  # below what its index says was synced

    gw = start_gateway(data_dir)
    # named by the gateway's look at its partitions at start, before any write or read
    deadline = time.monotonic() + 15
    while "damaged_partitions" not in (ready := httpx.get(f"{gw.url}/readyz", timeout=30)).json():
        assert ready.status_code == 200, ready.text  # the other partitions take writes
        assert time.monotonic() < deadline, ready.text
        time.sleep(0.1)
    assert ready.status_code == 200, ready.text
    (named,) = ready.json()["damaged_partitions"]
    assert (named["topic"], named["partition"]) == (TOPIC, damaged)
    assert "acknowledged data is missing" in named["reason"]

    client = client_for(gw.url)
    healthy = [s for s in SOURCES if _partition_of(s) != damaged]
    hurt = [s for s in SOURCES if _partition_of(s) == damaged]
    assert healthy and hurt
    for source in healthy:
        assert client.session(source)["last_seqno"] == SEQNOS[-1]
        assert _statuses(client, source, [4]) == ["written"]
        assert _statuses(client, source, SEQNOS) == ["duplicate"] * len(SEQNOS)
    refused = client.write(hurt[0], [4])
    assert refused.status_code == 503, refused.text
    body = refused.json()
    assert body["error"] == "partition_unavailable", body
    assert body["partitions"][0]["topic"] == TOPIC
    assert body["partitions"][0]["partition"] == damaged
    assert "acknowledged data is missing" in body["reason"], body

    # one request of both: the healthy source is written, the other named to be held back
    both = client.post_binary(
        encode_binary(
            [
                (meta(healthy[0]), [(5, 0, chunk_data(5))]),
                (meta(hurt[0]), [(5, 0, chunk_data(5))]),
            ]
        )
    )
    assert both.status_code == 503, both.text
    (named_part,) = both.json()["partitions"]
    assert named_part["partition"] == damaged and named_part["source_ids"] == [hurt[0]]
    assert _statuses(client, healthy[0], [5]) == ["duplicate"]

    described = httpx.get(f"{gw.url}/v1/topics/{TOPIC}", timeout=30)
    assert described.status_code == 200, described.text
    parts = {p["partition"]: p for p in described.json()["partitions"]}
    assert sorted(parts) == list(range(PARTITIONS))
    assert "acknowledged data is missing" in parts[damaged]["damaged"]
    assert all("damaged" not in p for n, p in parts.items() if n != damaged)

    read = _logbroker(
        "read", "--server", gw.url, "--topic", TOPIC, "--from-beginning", "--format", "jsonl",
        "--idle-exit", "1",
    )  # fmt: skip
    assert read.returncode == 3, read.stderr
    got = _read_chunks(read.stdout)
    expected = [(s, n) for s in healthy for n in [*SEQNOS, 4]] + [(healthy[0], 5)]
    assert sorted(got) == sorted(expected)
    assert f"{TOPIC}/{damaged} was not read past offset 0" in read.stderr

    assert gw.stop() == 0
    audit = _logbroker("audit", "--data-dir", str(data_dir))
    assert audit.returncode == 1, audit.stdout + audit.stderr
    problems = [line for line in audit.stdout.splitlines() if line.startswith("PROBLEM")]
    assert len(problems) == 1 and f"{TOPIC}/{damaged}" in problems[0], audit.stdout
    assert "acknowledged data is missing" in problems[0]
    listed = [line.split() for line in audit.stdout.splitlines() if line.startswith(TOPIC)]
    assert [row[1] for row in listed] == [str(p) for p in range(PARTITIONS)], audit.stdout
    assert listed[damaged][-1] == "(damaged)"


def test_a_partition_whose_index_is_gone_is_rebuilt_from_its_segments(
    start_gateway: Any, client_for: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    gw = start_gateway(data_dir)
    _written(client_for(gw.url))
    ends = {p["partition"]: p["end_offset"] for p in _described(gw.url)}
    assert gw.stop() == 0
    lost = _partition_of(SOURCES[0])
    for index in _partition_dir(data_dir, lost).glob("partition.db*"):
        index.unlink()

    gw = start_gateway(data_dir)
    # read before any write touches it: what it held, not an empty partition
    assert {p["partition"]: p["end_offset"] for p in _described(gw.url)} == ends
    read = _logbroker(
        "read", "--server", gw.url, "--topic", TOPIC, "--from-beginning", "--format", "jsonl",
        "--idle-exit", "1",
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    got = _read_chunks(read.stdout)
    assert sorted(got) == sorted((s, n) for s in SOURCES for n in SEQNOS)
    client = client_for(gw.url)
    hurt = [s for s in SOURCES if _partition_of(s) == lost]
    for source in hurt:  # the seqno table came back with it
        assert client.session(source)["last_seqno"] == SEQNOS[-1]
        assert _statuses(client, source, SEQNOS) == ["duplicate"] * len(SEQNOS)
    assert gw.stop() == 0
    assert source_seqnos(data_dir, TOPIC, hurt[0]) == ({lost}, SEQNOS)


def test_an_index_gone_after_retention_dropped_segments_is_refused_not_read_as_empty(
    start_gateway: Any, client_for: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    gw = start_gateway(data_dir)
    _written(client_for(gw.url))
    assert gw.stop() == 0
    lost = _partition_of(SOURCES[0])
    where = _partition_dir(data_dir, lost)
    for index in where.glob("partition.db*"):
        index.unlink()
    (segment,) = where.glob("*.log")
    segment.rename(where / "00000000000000000001.log")  # as if segments before 1 were dropped

    gw = start_gateway(data_dir)
    parts = {p["partition"]: p for p in _described(gw.url)}
    assert "cannot be rebuilt" in parts[lost]["damaged"], parts[lost]
    refused = client_for(gw.url).write(SOURCES[0], [4])
    assert refused.status_code == 503, refused.text
    assert refused.json()["partitions"][0]["partition"] == lost
    assert (where / "00000000000000000001.log").stat().st_size > 0  # kept for the operator
    assert not (where / "partition.db").exists()


def _described(url: str) -> list[dict[str, Any]]:
    described = httpx.get(f"{url}/v1/topics/{TOPIC}", timeout=30)
    assert described.status_code == 200, described.text
    parts: list[dict[str, Any]] = described.json()["partitions"]
    return parts


def _refused_start(data_dir: Path, tmp_path: Path) -> str:
    gw = GatewayProcess(data_dir, [], tmp_path / "refused.log")
    try:
        with contextlib.suppress(RuntimeError):  # "exited with 2"
            gw.start(timeout_s=30)
        assert gw.proc is not None
        assert gw.proc.wait(10) == 2, gw.log()
    finally:
        gw.kill()
    return gw.log()


def test_a_gateway_does_not_start_on_topics_its_catalog_does_not_know(
    start_gateway: Any, client_for: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    gw = start_gateway(data_dir)
    _written(client_for(gw.url))
    assert gw.stop() == 0
    for catalog in data_dir.glob("catalog.db*"):
        catalog.unlink()
    log = _refused_start(data_dir, tmp_path)
    (line,) = [x for x in log.splitlines() if x.startswith("logbroker serve:")]
    assert "catalog.db does not know" in line and TOPIC in line and "restore" in line, log
    assert not (data_dir / "catalog.db").exists()  # no fresh catalog made beside the data


def test_a_catalog_that_lost_its_wal_after_a_kill_still_knows_its_topics(
    start_gateway: Any, client_for: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    gw = start_gateway(data_dir)
    _written(client_for(gw.url))
    gw.kill()  # no clean close: what the catalog holds is what it checkpointed
    for lost in ("catalog.db-wal", "catalog.db-shm"):
        (data_dir / lost).unlink(missing_ok=True)
    gw = start_gateway(data_dir)
    client = client_for(gw.url)
    for source in SOURCES:
        assert _statuses(client, source, SEQNOS) == ["duplicate"] * len(SEQNOS)
    assert gw.stop() == 0
    for source in SOURCES:
        assert source_seqnos(data_dir, TOPIC, source)[1] == SEQNOS


def _cut_short(data_dir: Path, partition: int) -> bytes | None:
    """Cut the partition's segment below what its index says was synced; its bytes before."""
    (segment,) = _partition_dir(data_dir, partition).glob("*.log")
    whole = segment.read_bytes()
    with open(segment, "r+b") as f:
        f.truncate(len(whole) - 5)
    return whole


def _index_lost_after_retention(data_dir: Path, partition: int) -> bytes | None:
    where = _partition_dir(data_dir, partition)
    for index in where.glob("partition.db*"):
        index.unlink()
    (segment,) = where.glob("*.log")
    segment.rename(where / "00000000000000000001.log")  # as if segments before 1 were dropped
    return None


_DAMAGE = {"segment_cut_short": _cut_short, "index_lost": _index_lost_after_retention}


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _gateway_with_a_damaged_partition(
    start_gateway: Any, client_for: Any, data_dir: Path, damage: str
) -> tuple[Any, int]:
    """A gateway whose partition of ``SOURCES[0]`` was damaged while it was down; that
    partition."""
    gw = start_gateway(data_dir)
    _written(client_for(gw.url))
    assert gw.stop() == 0
    damaged = _partition_of(SOURCES[0])
    _DAMAGE[damage](data_dir, damaged)
    return start_gateway(data_dir), damaged


def _touch_the_damaged_partition(client: Any, damaged: int) -> list[str]:
    """One read, one describe and one write of a source pinned to the damaged partition, each
    answered as a damaged partition is; the reasons the answers give."""
    read = client.http.get(f"/v1/topics/{TOPIC}/partitions/{damaged}/messages?offset=0")
    assert read.status_code == 500 and read.json()["error"] == "corrupt_data", read.text
    described = client.http.get(f"/v1/topics/{TOPIC}")
    assert described.status_code == 200, described.text
    (part,) = [p for p in described.json()["partitions"] if p["partition"] == damaged]
    refused = client.write(SOURCES[0], [4])
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"] == "partition_unavailable", refused.text
    return [read.json()["reason"], part["damaged"], refused.json()["reason"]]


def test_reads_describes_and_writes_of_a_damaged_partition_leave_no_descriptor_open(
    start_gateway: Any, client_for: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    gw, damaged = _gateway_with_a_damaged_partition(
        start_gateway, client_for, data_dir, "segment_cut_short"
    )
    client = client_for(gw.url)
    for _ in range(3):  # what the first uses open for good (connections, healthy partitions)
        _touch_the_damaged_partition(client, damaged)
    before = _descriptors(gw.proc.pid)
    for _ in range(100):
        _touch_the_damaged_partition(client, damaged)
    after = _descriptors(gw.proc.pid)
    # each refused opening used to leave its partition.db and -wal open: +290 here
    assert after - before <= 10, (before, after)


def _opened_files(watch: INotify) -> list[str]:
    """The files of the watched directory opened since the last call (not the directory)."""
    return [event.name for event in watch.read(timeout=0) if event.name]


@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_a_damaged_partition_is_refused_from_memory_not_opened_on_every_use(
    start_gateway: Any, client_for: Any, tmp_path: Path, damage: str
) -> None:
    data_dir = tmp_path / "data"
    gw, damaged = _gateway_with_a_damaged_partition(start_gateway, client_for, data_dir, damage)
    client = client_for(gw.url)
    with INotify() as watch:
        watch.add_watch(str(_partition_dir(data_dir, damaged)), flags.OPEN)
        # opened, refused and remembered by the gateway's look at its partitions at start,
        # or else by this first use
        _touch_the_damaged_partition(client, damaged)
        _opened_files(watch)
        for _ in range(30):
            _touch_the_damaged_partition(client, damaged)
        # every use opened it again (its index, its segments, a rebuild's files): 60+
        opened = _opened_files(watch)
    # a look again after partition_damage.RECHECK_S (30 s) is allowed for, once
    assert len(opened) <= 10, opened


def _repair(data_dir: Path, partition: int, damage: str, whole: bytes | None) -> None:
    where = _partition_dir(data_dir, partition)
    if damage == "segment_cut_short":
        assert whole is not None
        (where / "00000000000000000000.log").write_bytes(whole)  # restored from a copy
    else:
        # the segment that was there: the index is rebuilt from it
        (where / "00000000000000000001.log").rename(where / "00000000000000000000.log")


@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_a_damaged_partition_repaired_under_a_running_gateway_is_served_again(
    start_gateway: Any, client_for: Any, tmp_path: Path, damage: str
) -> None:
    data_dir = tmp_path / "data"
    gw = start_gateway(data_dir)
    _written(client_for(gw.url))
    assert gw.stop() == 0
    damaged = _partition_of(SOURCES[0])
    whole = _DAMAGE[damage](data_dir, damaged)
    gw = start_gateway(data_dir)
    client = client_for(gw.url)
    for _ in range(2):  # refused, the second time from memory
        _touch_the_damaged_partition(client, damaged)

    _repair(data_dir, damaged, damage, whole)
    # another read than before: the read-ahead of those may hold their answer
    read = client.http.get(f"/v1/topics/{TOPIC}/partitions/{damaged}/messages?offset=1")
    assert read.status_code == 200, read.text
    assert read.json()["messages"], read.text
    parts = {p["partition"]: p for p in _described(gw.url)}
    assert "damaged" not in parts[damaged], parts[damaged]
    hurt = [s for s in SOURCES if _partition_of(s) == damaged]
    for source in hurt:
        assert client.session(source)["last_seqno"] == SEQNOS[-1]
        assert _statuses(client, source, SEQNOS) == ["duplicate"] * len(SEQNOS)
    assert _statuses(client, hurt[0], [4]) == ["written"]
    assert gw.stop() == 0
    assert source_seqnos(data_dir, TOPIC, hurt[0]) == ({damaged}, [*SEQNOS, 4])


def test_the_reasons_clients_get_name_the_partition_and_file_not_the_data_dir(
    start_gateway: Any, client_for: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    gw, damaged = _gateway_with_a_damaged_partition(
        start_gateway, client_for, data_dir, "segment_cut_short"
    )
    client = client_for(gw.url)
    for _ in range(2):  # opened and refused, then refused from memory
        reasons = _touch_the_damaged_partition(client, damaged)
        for reason in reasons:
            assert f"partition {TOPIC}/{damaged} is damaged" in reason, reason
            assert "segment 00000000000000000000.log holds" in reason, reason
            assert str(tmp_path) not in reason, reason
    # the operator finds the files in the gateway's log
    where = _partition_dir(data_dir, damaged)
    logged = [line for line in gw.log_path.read_text().splitlines() if "is damaged" in line]
    assert any(str(where) in line for line in logged), logged
