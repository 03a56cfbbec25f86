"""A transaction whose state changes or records are larger than one Kafka record may be.

The topics here take records of 128 KiB (``max_message_bytes``), so 3,000 new sources with
500-character ids (a delta of about 3 MB) do what 100,000 do with the default 16 MiB.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from log_store import PartitionState, TopicConfig
from log_store.kafka import KafkaSettings, naming, open_kafka_store
from log_store.kafka.failures import RecordTooLarge

pytestmark = pytest.mark.kafka

SMALL_RECORDS = 128 * 1024
SOURCES = 3000


def _source(i: int) -> str:
    return f"{i:06d}-" + "s" * 493  # 500 characters, as long ids may be


def _new_sources(count: int, extra: Sequence[bytes] = ()) -> Any:
    """A transaction that brings ``count`` new sources (a seqno and a pin each) and writes a
    record for each, with ``extra`` records in the middle."""

    def fn(state: PartitionState) -> Sequence[bytes]:
        for i in range(count):
            state.put(f"seq/{_source(i)}", (i + 1).to_bytes(8, "big"))
            state.put(f"pin/{_source(i)}", b"epoch-%010d" % i)
        records = [b"line of source %d " % i + b"x" * 480 for i in range(count)]
        return records[: count // 2] + list(extra) + records[count // 2 :]

    return fn


def _settings(kafka_cluster: Any, namespace: str, **kw: Any) -> KafkaSettings:
    return KafkaSettings(kafka_cluster.bootstrap, namespace=namespace, operation_timeout_s=20, **kw)


def test_a_delta_larger_than_a_record_is_split_and_replayed_whole(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    settings = _settings(kafka_cluster, kafka_namespace, max_message_bytes=SMALL_RECORDS)
    writer = open_kafka_store(settings)
    reader = open_kafka_store(settings)
    torn: list[dict[str, bytes | None]] = []
    stop = threading.Event()
    try:
        writer.create_topic("dc1.many", TopicConfig(partitions=1))
        writer.append("dc1.many", 0, [b"first"])
        state_topic = naming.state_topic(
            kafka_namespace, writer.describe_topic("dc1.many").topic_id
        )
        _low, changelog_before = writer._watermarks.get(state_topic, 0)
        ends = [f"seq/{_source(0)}", f"seq/{_source(SOURCES - 1)}"]

        def read_meanwhile() -> None:
            # a store that does not write replays the changelog: a transaction's first and
            # last keys (in its first and last delta records) are there together or not at all
            while not stop.is_set():
                seen = reader.get_state_many("dc1.many", 0, ends)
                if (seen[ends[0]] is None) != (seen[ends[1]] is None):
                    torn.append(seen)

        looker = threading.Thread(target=read_meanwhile, daemon=True)
        looker.start()
        started = time.monotonic()
        result = writer.transact("dc1.many", 0, _new_sources(SOURCES))
        took = time.monotonic() - started
        stop.set()
        looker.join(10)
        assert result.count == SOURCES
        assert took < 10, f"the write took {took:.1f} s"
        assert len(writer.takeovers) == 1, "the write was taken for a takeover"
        _low, changelog_after = writer._watermarks.get(state_topic, 0)
        # one transaction: its delta records and one commit marker
        assert changelog_after - changelog_before > 20, "the delta was not split"
        assert not torn, f"a reader saw part of a transaction: {torn[:1]}"
        assert reader.get_state("dc1.many", 0, f"pin/{_source(1234)}") == b"epoch-0000001234"
    finally:
        stop.set()
        writer.close()
        reader.close()
    # a new owner rebuilds the whole table from the changelog
    second = open_kafka_store(settings)
    try:
        second.transact("dc1.many", 0, lambda state: [b"after"])
        _topic, _partition, _seconds, entries = second.takeovers[-1]
        assert entries == 2 * SOURCES
        last = second.get_state("dc1.many", 0, f"seq/{_source(SOURCES - 1)}")
        assert last == SOURCES.to_bytes(8, "big")
    finally:
        second.close()


def test_a_record_larger_than_the_topic_takes_is_refused_without_a_takeover(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    store = open_kafka_store(
        _settings(kafka_cluster, kafka_namespace, max_message_bytes=SMALL_RECORDS)
    )
    try:
        store.create_topic("dc1.big", TopicConfig(partitions=1))
        store.append("dc1.big", 0, [b"first"])
        started = time.monotonic()
        with pytest.raises(RecordTooLarge, match="at most"):
            store.transact("dc1.big", 0, lambda state: [b"x" * (SMALL_RECORDS + 8192)])
        assert time.monotonic() - started < 2
        assert len(store.takeovers) == 1
        assert store.append("dc1.big", 0, [b"second"]).first_offset == 2
        assert len(store.takeovers) == 1
    finally:
        store.close()


def test_a_size_error_from_kafka_fails_the_write_and_keeps_the_owner(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    """The topics were made with a smaller ``max.message.bytes`` than this store is told:
    Kafka refuses the record (the store cannot see it first).  The write fails at once as
    too large, not as a takeover retried ten times, and what it held is let go: freed as
    soon as it is dropped (the garbage collector is off), not kept in reference cycles."""
    small = open_kafka_store(
        _settings(kafka_cluster, kafka_namespace, max_message_bytes=SMALL_RECORDS)
    )
    try:
        small.create_topic("dc1.refused", TopicConfig(partitions=1))
        small.append("dc1.refused", 0, [b"first"])
    finally:
        small.close()
    store = open_kafka_store(_settings(kafka_cluster, kafka_namespace))
    try:
        store.append("dc1.refused", 0, [b"second"])
        owner = store._owners[("dc1.refused", 0)]
        incompressible = os.urandom(SMALL_RECORDS + 16 * 1024)
        gc.collect()
        gc.disable()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            started = time.monotonic()
            with pytest.raises(RecordTooLarge, match="larger than the topic takes"):
                store.transact("dc1.refused", 0, _new_sources(SOURCES, [incompressible]))
            took = time.monotonic() - started
            time.sleep(0.2)  # the owner's thread lets go of its locals
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            gc.enable()
        assert took < 5, f"the refusal took {took:.1f} s"
        assert held < 1_000_000, f"{held} bytes of the failed write are still held"
        assert len(store.takeovers) == 1
        assert store._owners[("dc1.refused", 0)] is owner, "the owner was dropped"
        # the partition is written on by the same owner (taken over again once, in place)
        store.append("dc1.refused", 0, [b"third"])
        assert store._owners[("dc1.refused", 0)] is owner
        assert len(store.takeovers) == 2
    finally:
        store.close()


def test_a_gateway_answers_a_record_too_large_for_its_topics_413_and_writes_on(
    start_kafka_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the HTTP API, a chunk larger than Kafka's records may be (an operator raised
    ``max_chunk_bytes`` past it): 413 ``record_too_large`` (it was a 503 "being taken over",
    retried for ever), nothing written, and the next write of the source is taken."""
    monkeypatch.setenv("LOGBROKER_LIMITS_MAX_CHUNK_BYTES", str(32 * 1024 * 1024))
    monkeypatch.setenv("LOGBROKER_LIMITS_MAX_BODY_BYTES", str(64 * 1024 * 1024))
    gateway = start_kafka_gateway()
    line = b"x" * 199 + b"\n"

    def write(seqno: int, data: bytes) -> httpx.Response:
        section = {"log_type": "big", "source_id": "host-a:big.log", "seqno": seqno}
        body = json.dumps({**section, "data": data.decode()}).encode() + b"\n"
        return httpx.post(
            gateway.url + "/v1/write",
            content=body,
            headers={"Content-Type": "application/x-ndjson"},
            timeout=120,
        )

    assert write(1, line).status_code == 200
    refused = write(2, line * (17 * 1024 * 1024 // len(line)))
    assert refused.status_code == 413, refused.text
    assert refused.json()["error"] == "record_too_large"
    taken = write(2, line)
    assert taken.status_code == 200, taken.text
    assert taken.json()["results"][0]["acks"][0]["status"] == "written"
