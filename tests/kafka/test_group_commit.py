"""Group commit on Kafka: writes queued behind a partition's Kafka transaction share the next
one, and a gateway killed while such a transaction is open leaves every chunk once."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from ingest_api.framing import encode_binary
from log_store import LogStore, PartitionState, TopicConfig
from log_store.kafka import KafkaSettings, naming, open_kafka_store
from tests.conftest import GatewayProcess
from tests.gateway.conftest import Client, meta
from tests.kafka.conftest import metric, source_seqnos, wait_until

pytestmark = pytest.mark.kafka

WRITERS = 8
CHUNKS_PER_REQUEST = 4
CHUNK_PAD = b"." * 8000


def test_writes_queued_behind_a_commit_share_the_next_kafka_transaction(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    """While the partition's writer is busy with one transaction, 20 more are submitted: they
    are committed together, in one Kafka transaction, each with offsets of its own, in the
    order they were submitted, and each exactly once."""
    store = open_kafka_store(KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace))
    try:
        store.create_topic("dc1.group", TopicConfig(partitions=1))
        store.append("dc1.group", 0, [b"before"])  # the partition is taken over
        running, release = threading.Event(), threading.Event()

        def first(state: PartitionState) -> Sequence[bytes]:
            running.set()
            assert release.wait(30)
            return [b"first"]

        def one(n: int) -> Callable[[PartitionState], Sequence[bytes]]:
            def fn(state: PartitionState) -> Sequence[bytes]:
                state.put(f"seq/w{n}", n.to_bytes(8, "big"))
                return [b"write %d" % n]

            return fn

        head = store.submit("dc1.group", 0, first)
        assert running.wait(30)
        queued = [store.submit("dc1.group", 0, one(n)) for n in range(20)]
        commits, transactions = store.commits.commits, store.commits.transactions
        release.set()
        results = [f.result(30) for f in [head, *queued]]
        assert store.commits.commits - commits == 2, "the 20 queued writes took more commits"
        assert store.commits.transactions - transactions == 21
        offsets = [r.first_offset for r in results]
        assert all(r.count == 1 for r in results)
        assert offsets == sorted(set(offsets)), "offsets repeat or are out of order"
        # one commit: the 20 records follow each other (no marker between them)
        assert offsets[1:] == list(range(offsets[1], offsets[1] + 20))
        assert store.get_state("dc1.group", 0, "seq/w19") == (19).to_bytes(8, "big")
        values = []
        offset = 0
        while offset < store.end_offset("dc1.group", 0):
            read = store.read("dc1.group", 0, offset, 1 << 20)
            values += [(r.offset, r.value) for r in read.records]
            offset = read.next_offset
        assert [v for _o, v in values] == [b"before", b"first"] + [
            b"write %d" % n for n in range(20)
        ]
        assert [o for o, _v in values][1:] == offsets
    finally:
        store.close()


class _TransactionProbe:
    """Tells whether the partition holds records of a transaction not yet committed or
    aborted: its high watermark (read_uncommitted) is above its last stable offset
    (read_committed).  Its consumers stay open, so a look costs two round trips."""

    def __init__(self, bootstrap: str, kafka_topic: str) -> None:
        self.partition = TopicPartition(kafka_topic, 0)
        self.consumers = [
            Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "isolation.level": i})
            for i in ("read_uncommitted", "read_committed")
        ]

    def open_transaction(self) -> bool:
        high, stable = (
            c.get_watermark_offsets(self.partition, 10, cached=False)[1] for c in self.consumers
        )
        return bool(high > stable)

    def close(self) -> None:
        for consumer in self.consumers:
            consumer.close()


def _uncommitted_records(bootstrap: str, kafka_topic: str, committed: int) -> int:
    """Records in the partition that no read_committed reader sees (of open or aborted
    transactions): all records read_uncommitted, less the ``committed`` ones."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "probe",
            "isolation.level": "read_uncommitted",
            "enable.partition.eof": True,
        }
    )
    seen = 0
    try:
        consumer.assign([TopicPartition(kafka_topic, 0, 0)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                break  # end of the partition
            seen += 1
    finally:
        consumer.close()
    return seen - committed


def _kill_inside_an_open_transaction(
    gateway: GatewayProcess, bootstrap: str, kafka_topic: str, timeout_s: float = 60.0
) -> None:
    """SIGKILL the gateway while partition 0 holds records of its transaction that it can no
    longer commit.  Seeing an open transaction and then killing is a race the commit often
    wins (it takes a millisecond on a fast machine), so the gateway is first frozen (SIGSTOP
    to its process group) when the probe sees an open transaction; once the broker has had
    time to finish whatever the gateway sent before (a commit already on its way lands), a
    transaction still open is one the gateway will never commit, and it is killed.
    Otherwise it goes on (SIGCONT) and the next open transaction is tried."""
    assert gateway.proc is not None
    probe = _TransactionProbe(bootstrap, kafka_topic)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            assert time.monotonic() < deadline, "never froze the gateway inside a transaction"
            if not probe.open_transaction():
                continue
            os.killpg(gateway.proc.pid, signal.SIGSTOP)
            if _stays_open(probe, 1.0):
                gateway.kill()
                return
            os.killpg(gateway.proc.pid, signal.SIGCONT)
    finally:
        probe.close()


def _stays_open(probe: _TransactionProbe, for_s: float) -> bool:
    """Whether the partition's transaction is open at every look for ``for_s`` seconds."""
    deadline = time.monotonic() + for_s
    while time.monotonic() < deadline:
        if not probe.open_transaction():
            return False
        time.sleep(0.1)
    return probe.open_transaction()


@pytest.mark.fault
def test_gateway_killed_with_a_group_transaction_open_leaves_every_chunk_once(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    kafka_cluster: Any,
    kafka_namespace: str,
) -> None:
    """Eight writers hammer one partition, so its Kafka transactions each carry several
    requests.  The gateway is SIGKILLed while a transaction holds produced, uncommitted
    records (high watermark above the last stable offset); a new gateway takes over (which
    aborts that transaction), and every writer resends everything it has no ack for.  Each
    seqno is then in the log exactly once, in order, and nothing acked is missing; the
    killed transaction's records are in the partition, aborted."""
    kafka_store.create_topic("dc1.app", TopicConfig(partitions=1))
    kafka_topic = naming.data_topic(kafka_namespace, "dc1.app")
    next_seqno = [1] * WRITERS
    acked: list[set[int]] = [set() for _ in range(WRITERS)]

    def body(writer: int) -> bytes:
        first = next_seqno[writer]
        chunks = [
            (s, 0, b"w%d %d %s\n" % (writer, s, CHUNK_PAD))
            for s in range(first, first + CHUNKS_PER_REQUEST)
        ]
        return encode_binary([(meta(f"w{writer}"), chunks)])

    def run(url: str, writer: int, stop: threading.Event, counts: list[int]) -> None:
        """Write until stopped or the gateway dies; an unanswered request is resent later."""
        with httpx.Client(base_url=url, timeout=30) as http:
            while not stop.is_set():
                try:
                    response = http.post(
                        "/v1/write",
                        content=body(writer),
                        headers={"content-type": "application/x-logbroker-chunks"},
                    )
                except httpx.TransportError:
                    return
                if response.status_code != 200:
                    time.sleep(0.05)
                    continue
                for ack in response.json()["results"][0]["acks"]:
                    assert ack["status"] in ("written", "duplicate"), ack
                    acked[writer].add(ack["seqno"])
                next_seqno[writer] += CHUNKS_PER_REQUEST
                counts[writer] += 1

    @contextlib.contextmanager
    def writers(url: str, acks_each: int) -> Iterator[None]:
        """Every writer writing to ``url``, each acked ``acks_each`` times before the body;
        stopped (and joined) after it."""
        stop = threading.Event()
        counts = [0] * WRITERS
        threads = [
            threading.Thread(target=run, args=(url, w, stop, counts)) for w in range(WRITERS)
        ]
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: min(counts) >= acks_each, 60, f"{acks_each} acks per writer")
            yield
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)

    gateway = start_kafka_gateway(ownership="on_demand")
    client = Client(gateway.url)
    client.session("w0")  # the partition is taken over before the load
    client.close()
    with writers(gateway.url, acks_each=3):
        commits = metric(gateway.url, "logbroker_kafka_commits") or 0
        carried = metric(gateway.url, "logbroker_kafka_committed_transactions") or 0
        assert carried > commits, "concurrent requests never shared a Kafka transaction"
        _kill_inside_an_open_transaction(gateway, kafka_cluster.bootstrap, kafka_topic)
    # the next gateway's takeover settles the open transaction (aborts it)
    stored = source_seqnos(kafka_store, "dc1.app")
    committed = sum(len(seqnos) for _partitions, seqnos in stored.values())
    aborted = _uncommitted_records(kafka_cluster.bootstrap, kafka_topic, committed)
    assert aborted > 0, "the killed transaction left no records"
    # every writer resends what it has no ack for (the killed request may have committed)
    with writers(start_kafka_gateway(ownership="on_demand").url, acks_each=2):
        pass
    stored = source_seqnos(kafka_store, "dc1.app")
    for writer in range(WRITERS):
        partitions, seqnos = stored[f"w{writer}"]
        assert partitions == {0}
        assert seqnos == sorted(set(seqnos)), f"w{writer}: a seqno twice or out of order"
        assert acked[writer] <= set(seqnos), f"w{writer}: an acked chunk is missing"
        assert seqnos == list(range(1, seqnos[-1] + 1)), f"w{writer}: a gap"
