"""The state area on Kafka: committed with the data, snapshotted, rebuilt by a new owner."""

from __future__ import annotations

import collections
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from log_store import PartitionState, TopicConfig
from log_store.kafka import KafkaSettings, naming, open_kafka_store
from tests.conftest import REPO, logbroker_cmd

pytestmark = pytest.mark.kafka


def test_new_owner_rebuilds_state_from_the_snapshot_and_the_tail(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    settings = KafkaSettings(
        kafka_cluster.bootstrap,
        namespace=kafka_namespace,
        snapshot_min_entries=500,
        operation_timeout_s=20,
    )
    first = open_kafka_store(settings)
    try:
        first.create_topic("dc1.t", TopicConfig(partitions=1))

        def put(start: int, count: int) -> Any:
            def fn(state: PartitionState) -> Sequence[bytes]:
                for i in range(start, start + count):
                    state.put(f"seq/src-{i % 3000}", i.to_bytes(8, "big"))
                return [b"batch %d" % start]

            return fn

        for start in range(0, 6000, 200):
            first.transact("dc1.t", 0, put(start, 200))
        state_topic = naming.state_topic(kafka_namespace, first.describe_topic("dc1.t").topic_id)
        watermarks = first._watermarks  # the changelog's own bounds
        low, end = watermarks.get(state_topic, 0)
    finally:
        first.close()
    # snapshots were written and the records before the last one deleted
    assert low > 0, "no snapshot moved the changelog's start"
    second = open_kafka_store(settings)
    try:
        # a write takes the partition over: fencing, then snapshot plus tail
        second.transact("dc1.t", 0, lambda state: [b"after"])
        topic, partition, _seconds, entries = second.takeovers[-1]
        assert (topic, partition) == ("dc1.t", 0)
        assert entries == 3000
        for i in (0, 1234, 2999):
            expected = max(n for n in range(6000) if n % 3000 == i)
            assert second.get_state("dc1.t", 0, f"seq/src-{i}") == expected.to_bytes(8, "big")
    finally:
        second.close()
    assert end > low


def test_audit_and_topics_commands_read_a_kafka_namespace_without_fencing_it(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    store = open_kafka_store(KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace))
    try:
        store.create_topic("dc1.cli", TopicConfig(partitions=2))
        store.append("dc1.cli", 0, [b"not an envelope"])
        flags = [
            "--store",
            "kafka",
            "--kafka-bootstrap",
            kafka_cluster.bootstrap,
            "--kafka-namespace",
            kafka_namespace,
        ]
        listed = subprocess.run(
            logbroker_cmd("topics", *flags, "list"), capture_output=True, text=True, cwd=REPO
        )
        assert listed.returncode == 0, listed.stderr
        assert "dc1.cli" in listed.stdout
        # --kafka-bootstrap alone says the store is Kafka
        audit = subprocess.run(
            logbroker_cmd("audit", *flags[2:]), capture_output=True, text=True, cwd=REPO
        )
        assert audit.returncode == 1, audit.stdout + audit.stderr
        assert "not an envelope" in audit.stdout
        mixed = subprocess.run(
            logbroker_cmd("topics", "--store", "sqlite", *flags[2:], "list"),
            capture_output=True, text=True, cwd=REPO,
        )  # fmt: skip
        assert mixed.returncode == 2, mixed.stderr
        assert "--store kafka --kafka-bootstrap" in mixed.stderr or "goes with" in mixed.stderr
        # the store that wrote is still the partition's writer: nobody fenced it
        assert store.append("dc1.cli", 0, [b"again"]).count == 1
        assert len(store.takeovers) == 1
    finally:
        store.close()


def test_state_reads_during_back_to_back_commits_answer_with_every_acknowledged_value(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    """The owner's writer hardly pauses here (32 transactions queued): a state read is
    answered all the same, with every commit acknowledged before it began (proved by the
    owner's next successful commit).  A second store then takes the partition over: the
    first store's reads fail over to the changelog instead of answering from its stale
    table."""
    settings = KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace)
    store = open_kafka_store(settings)
    stop = threading.Event()
    acked = [0]
    failures: list[BaseException] = []

    def put(n: int) -> Any:
        def fn(state: PartitionState) -> Sequence[bytes]:
            state.put("seq/busy", n.to_bytes(8, "big"))
            return [b"chunk %d" % n]

        return fn

    def write() -> None:
        pending: collections.deque[tuple[int, Any]] = collections.deque()
        n = 0
        try:
            while not stop.is_set():
                n += 1
                pending.append((n, store.submit("dc1.busy", 0, put(n))))
                while len(pending) > 32 or (pending and pending[0][1].done()):
                    done, future = pending.popleft()
                    future.result()
                    acked[0] = done
            for _done, future in pending:
                future.result()
        except BaseException as exc:
            failures.append(exc)

    try:
        store.create_topic("dc1.busy", TopicConfig(partitions=1))
        store.transact("dc1.busy", 0, put(0))
        writer = threading.Thread(target=write)
        writer.start()
        try:
            for _ in range(40):
                floor = acked[0]
                raw = store.get_state("dc1.busy", 0, "seq/busy")
                assert raw is not None
                assert int.from_bytes(raw, "big") >= floor
        finally:
            stop.set()
            writer.join(120)
        assert not failures, failures
        last = acked[0]
        other = open_kafka_store(settings)
        try:
            other.transact("dc1.busy", 0, put(last + 100))  # fences the first store's writer
            raw = store.get_state("dc1.busy", 0, "seq/busy")
            assert raw is not None and int.from_bytes(raw, "big") == last + 100
        finally:
            other.close()
    finally:
        store.close()
