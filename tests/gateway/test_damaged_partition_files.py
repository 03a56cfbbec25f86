"""A data dir whose files were damaged or lost while the gateway was down, behind a real
gateway: one partition that lost acknowledged data is refused alone (its topic's other
partitions write and read, the reader and the audit name it); a partition whose index is gone
is rebuilt from its segments, never read as empty; a catalog that is gone (or only its WAL)
stops the gateway from starting rather than take every acknowledged chunk again."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

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
