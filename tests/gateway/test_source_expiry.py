"""Idle sources are forgotten after limits.source_idle_expiry_s: their place under
max_sources_per_partition is freed, a live source never is, and a crash keeps the outcome."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from log_store import open_store
from log_store.interface import TopicConfig
from session_dedup.exactly_once import ChunkBatch, ExactlyOnceWriter
from session_dedup.pinning import pin_key
from session_dedup.seqno_table import SOURCE_COUNT_KEY, decode_seqno, seqno_key
from session_dedup.source import SourceMeta
from session_dedup.source_expiry import SourceExpiry
from tests.conftest import GatewayProcess
from tests.gateway.conftest import meta, topic_envelopes
from tests.pin_expiry import check_deleted_pins_are_put_back_by_the_first_write

CONFIG = """
partitions = 1
[limits]
max_sources_per_partition = 2
source_idle_expiry_s = {expiry}
"""


def _start(base: Path, expiry: float, name: str) -> GatewayProcess:
    config = base / f"{name}.toml"
    config.write_text(CONFIG.format(expiry=expiry))
    return GatewayProcess(base / "data", ["--config", str(config)], base / f"{name}.log").start()


def _write(http: httpx.Client, source: str, seqnos: list[int], prev: int | None = None) -> Any:
    head: dict[str, Any] = meta(source, "exp")
    if prev is not None:
        head["prev_seqno"] = prev
    body = encode_binary([(head, [(s, 0, b"line %d\n" % s) for s in seqnos])])
    response = http.post("/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE})
    assert response.status_code == 200, response.text
    return response.json()["results"][0]


def _last_seqno(http: httpx.Client, source: str) -> int:
    response = http.post("/v1/sessions", json=meta(source, "exp"))
    assert response.status_code == 200, response.text
    return int(response.json()["last_seqno"])


def test_an_idle_source_is_forgotten_and_a_live_one_never(tmp_path: Path) -> None:
    gateway = _start(tmp_path, expiry=3, name="short")
    try:
        http = httpx.Client(base_url=gateway.url, timeout=60)
        assert [a["status"] for a in _write(http, "idle", [1, 2, 3])["acks"]] == ["written"] * 3
        live = 1
        assert _write(http, "live", [live])["acks"][0]["status"] == "written"
        # the partition holds two sources, its limit
        assert _write(http, "new", [1])["error"] == "limit_reached"
        # the live source writes on, each chunk after the one before (prev_seqno): had its
        # state been forgotten in between, a chunk would come back out_of_order
        deadline = time.monotonic() + 120
        while _last_seqno(http, "idle") != 0:
            assert time.monotonic() < deadline, gateway.log()
            result = _write(http, "live", [live + 1], prev=live)
            assert result["acks"][0]["status"] == "written", result
            live += 1
        assert _write(http, "new", [1])["acks"][0]["status"] == "written"
        assert _last_seqno(http, "live") == live
        # the forgotten source is a new one: its next chunk after 3 is out of order...
        resumed = _write(http, "idle", [4], prev=3)
        assert resumed["acks"][0]["status"] == "out_of_order"
        assert resumed["last_seqno"] == 0
        # ...and the partition is full again (live, new), so it is not even admitted
        assert _write(http, "idle", [4])["error"] == "limit_reached"
        metrics = http.get("/metrics").text
        assert "logbroker_sources_expired_total 1" in metrics.replace(".0", "")
        http.close()
    finally:
        gateway.kill()  # SIGKILL: what was forgotten stays forgotten after the crash
    restarted = _start(tmp_path, expiry=86400, name="long")
    try:
        http = httpx.Client(base_url=restarted.url, timeout=60)
        assert _last_seqno(http, "idle") == 0
        assert _last_seqno(http, "live") == live
        assert _write(http, "other", [1])["error"] == "limit_reached"
        http.close()
    finally:
        restarted.kill()
    seqnos: dict[str, list[int]] = {}
    for _offset, envelope in topic_envelopes(tmp_path / "data", "dc1.exp")[0]:
        seqnos.setdefault(envelope.source_id, []).append(envelope.seqno)
    assert seqnos == {"idle": [1, 2, 3], "live": list(range(1, live + 1)), "new": [1]}


def _copy_index(partition_dir: Path, into: Path) -> None:
    into.mkdir(exist_ok=True)
    for name in ("partition.db", "partition.db-wal", "partition.db-shm"):
        (into / name).unlink(missing_ok=True)
        if (partition_dir / name).exists():
            shutil.copy2(partition_dir / name, into / name)


def test_an_expiry_lost_from_the_index_is_replayed_from_the_log(tmp_path: Path) -> None:
    """A power cut can take the lazily synced index back to before the expiry; the expiry's
    batch in the segment brings it forward again on open: the sources stay forgotten."""
    data_dir = tmp_path / "data"
    store = open_store(data_dir)
    writer = ExactlyOnceWriter(store, dc="dc1", partitions=1)
    store.create_topic("dc1.exp", TopicConfig(partitions=1))
    for source in ("a", "b", "c"):
        batch = ChunkBatch([1, 2], [0, 0], [b"x\n", b"y\n"])
        writer.write(SourceMeta("exp", source, "h", "/f"), batch)
    written_ms = int(time.time() * 1000)  # a and b were last written at or before this
    topic_id = store.describe_topic("dc1.exp").topic_id
    store.close()
    (partition_dir,) = (data_dir / "topics" / "dc1.exp").glob("*/0")
    _copy_index(partition_dir, tmp_path / "before")
    while int(time.time() * 1000) <= written_ms:
        time.sleep(0.001)  # the clock must move on for c's next write to be later
    store = open_store(data_dir)
    writer = ExactlyOnceWriter(store, dc="dc1", partitions=1)
    writer.write(SourceMeta("exp", "c", "h", "/f"), ChunkBatch([3], [0], [b"z\n"]))
    done = SourceExpiry(store, idle_s=3600).run_once(now_ms=written_ms + 3600 * 1000)
    store.close()
    assert (done.expired, done.pins_deleted) == (2, 2)
    _copy_index(tmp_path / "before", partition_dir)  # the index as the power cut left it
    with sqlite3.connect(partition_dir / "partition.db") as index:
        keys = {row[0] for row in index.execute("SELECT key FROM state")}
    index.close()
    assert {"seq/a", "seq/b"} <= keys  # the expiry is in the segment only
    store = open_store(data_dir)
    try:
        state = {s: store.get_state("dc1.exp", 0, seqno_key(s)) for s in ("a", "b", "c")}
        assert state["a"] is None and state["b"] is None
        assert decode_seqno(state["c"]) == 3
        assert decode_seqno(store.get_state("dc1.exp", 0, SOURCE_COUNT_KEY)) == 1
        assert store.get_topic_state("dc1.exp", pin_key(topic_id, "a")) is None
        assert store.get_topic_state("dc1.exp", pin_key(topic_id, "c")) is not None
    finally:
        store.close()


def test_pins_without_state_are_deleted_and_a_cached_route_pins_its_source_again(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "data")
    try:
        writer = ExactlyOnceWriter(store, dc="dc1", partitions=2)
        ghost, kept = SourceMeta("exp", "ghost"), SourceMeta("exp", "kept")
        (session,) = writer.open_sessions([ghost])  # pins the source, gives it no state
        outcome = writer.write(kept, ChunkBatch([1], [0], [b"x\n"]))
        topic_id = outcome.route.topic_id
        assert store.get_topic_state("dc1.exp", pin_key(topic_id, "ghost")) is not None
        expiry = SourceExpiry(store, idle_s=3600)
        done = expiry.run_once()
        assert (done.expired, done.pins_deleted) == (0, 1)
        assert store.get_topic_state("dc1.exp", pin_key(topic_id, "ghost")) is None
        pinned = store.get_topic_state("dc1.exp", pin_key(topic_id, "kept"))
        assert pinned is not None
        # forgotten with its pin, then written again through this process's cached route:
        # the write gives it state and puts the same pin back
        done = expiry.run_once(now_ms=int(time.time() * 1000) + 3600 * 1000)
        assert (done.expired, done.pins_deleted) == (1, 1)
        assert store.get_topic_state("dc1.exp", pin_key(topic_id, "kept")) is None
        again = writer.write(kept, ChunkBatch([1], [0], [b"x\n"]))
        assert again.written_count == 1 and again.route.partition == outcome.route.partition
        assert store.get_topic_state("dc1.exp", pin_key(topic_id, "kept")) == pinned
        assert session.last_seqno == 0
    finally:
        store.close()


def test_a_pin_deleted_after_a_router_saw_it_is_put_back_by_the_first_write(
    tmp_path: Path,
) -> None:
    """Expiry counts the pins it deletes; a router whose pins were seen before a deletion
    puts them back after a write gives their sources state, even on a topic grown since."""
    store = open_store(tmp_path / "data")
    try:
        check_deleted_pins_are_put_back_by_the_first_write(store)
    finally:
        store.close()


def test_a_damaged_partition_is_left_out_and_the_pass_goes_on_with_the_topics_after_it(
    tmp_path: Path,
) -> None:
    """A damaged partition (PartitionDamaged) used to end the pass: the idle sources of every
    topic after it were never forgotten.  It is left out, as retention leaves it out."""
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        writer = ExactlyOnceWriter(store, dc="dc1", partitions=1)
        for log_type in ("aaa", "zzz"):  # the pass goes in name order: aaa first
            store.create_topic(f"dc1.{log_type}", TopicConfig(partitions=1, segment_bytes=4096))
            for seqno in range(1, 13):
                batch = ChunkBatch([seqno], [0], [b"x" * 1000 + b"\n"])
                writer.write(SourceMeta(log_type, "idle", "h", "/f"), batch)
        written_ms = int(time.time() * 1000)
    (damaged_dir,) = (data_dir / "topics" / "dc1.aaa").glob("*/0")
    last = sorted(damaged_dir.glob("*.log"))[-1]
    with open(last, "r+b") as segment:
        segment.truncate(last.stat().st_size - 5)  # acknowledged bytes lost: damaged
    with open_store(data_dir) as store:
        done = SourceExpiry(store, idle_s=3600).run_once(now_ms=written_ms + 3600 * 1000)
        assert done.damaged == [("dc1.aaa", 0)]
        assert done.expired == 1
        assert store.get_state("dc1.zzz", 0, seqno_key("idle")) is None
