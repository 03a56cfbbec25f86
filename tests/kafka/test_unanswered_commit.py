"""A Kafka commit that ends without an answer: the writer is told it failed, its retry is
answered ``duplicate`` if it went through, and the write is still counted once (the audit).

The fault is injected where the client meets the cluster: the partition owner's producer
commits for real and then raises a timeout, as when the commit's answer is lost; or it raises
before committing, as when the request never arrived.  The broker is real Apache Kafka.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from audit.windows import WindowCounts, window_start
from ingest_api.audit_api import CommittedCounter
from log_store import LogStore
from log_store.errors import StoreUnavailable
from log_store.kafka import naming
from log_store.kafka import partition_owner as owner_module
from log_store.kafka.remote_transaction import PreparedTransaction, checked_transaction
from session_dedup.envelope import EnvelopeWriter, decode
from session_dedup.exactly_once import (
    DUPLICATE,
    WRITTEN,
    ChunkBatch,
    ExactlyOnceWriter,
    WriteOutcome,
)
from session_dedup.source import SourceMeta

pytestmark = pytest.mark.kafka


class _Faults:
    """What the next ``commit_transaction`` of any partition owner does: ``"lose_answer"``
    (commit, then raise a timeout) or ``"fail_before"`` (raise without committing)."""

    def __init__(self) -> None:
        self.next: str | None = None
        self.extra_record = False
        """The next record produced to the data topic gets another record before it."""
        self.injected = 0
        self.lock = threading.Lock()

    def take_extra(self) -> bool:
        with self.lock:
            extra, self.extra_record = self.extra_record, False
            return extra

    def take(self) -> str | None:
        with self.lock:
            fault, self.next = self.next, None
            if fault is not None:
                self.injected += 1
            return fault


def kwargs_of(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k == "partition"}


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> _Faults:
    faults = _Faults()

    class FaultyProducer(Producer):  # type: ignore[misc]
        def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
            if topic.endswith("dc1.app") and faults.take_extra():
                # another record first, as a marker written twice takes an offset
                intruder = EnvelopeWriter(
                    source_id="intruder", server="h", file="/f", log_type="app"
                )
                super().produce(topic, intruder.encode(1, 1, 0, b"x\n"), **kwargs_of(kwargs))
            super().produce(topic, *args, **kwargs)

        def commit_transaction(self, *args: Any) -> None:
            fault = faults.take()
            if fault == "fail_before":
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "injected: no answer"))
            super().commit_transaction(*args)
            if fault == "lose_answer":
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "injected: answer lost"))

    monkeypatch.setattr(owner_module, "Producer", FaultyProducer)
    return faults


class _Heard:
    """A late-commit hook that records what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[bytes]]] = []

    def __call__(self, topic: str, records: Sequence[bytes]) -> None:
        self.calls.append((topic, list(records)))

    def seqnos(self) -> list[list[int]]:
        return [[decode(r).seqno for r in records] for _topic, records in self.calls]


META = SourceMeta(log_type="app", source_id="late-src", server="h", file="/var/log/app.log")


def _batch(seqnos: list[int]) -> ChunkBatch:
    return ChunkBatch(seqnos, [1_763_900_000_000] * len(seqnos), [b"line %d\n" % s for s in seqnos])


def _write_retrying(writer: ExactlyOnceWriter, seqnos: list[int]) -> bytearray:
    """Write until the store answers (a failed commit makes the owner take over again)."""
    for _ in range(60):
        try:
            return writer.write(META, _batch(seqnos)).written
        except StoreUnavailable:
            continue
    raise AssertionError("the write never succeeded")


def _failed_write(
    kafka_store: LogStore, faults: _Faults, fault: str, first: list[int], failed: list[int]
) -> tuple[_Heard, ExactlyOnceWriter]:
    """Seqnos ``first`` written, then ``failed`` answered failed by ``fault``: the hook that
    hears of late commits, and the writer."""
    heard = _Heard()
    writer = ExactlyOnceWriter(kafka_store, dc="dc1", partitions=1, committed_late=heard)
    assert list(writer.write(META, _batch(first)).written) == [WRITTEN] * len(first)
    faults.next = fault
    with pytest.raises(StoreUnavailable):
        writer.write(META, _batch(failed))
    return heard, writer


def test_a_commit_whose_answer_was_lost_is_told_late_and_its_retry_is_a_duplicate(
    kafka_store: LogStore, faults: _Faults
) -> None:
    heard, writer = _failed_write(kafka_store, faults, "lose_answer", [1, 2, 3], [4, 5, 6])
    assert faults.injected == 1
    assert heard.calls == [], "told before the outcome was known"
    # the client retries: the owner takes the partition over again, finds the commit in the
    # changelog, tells the hook, and answers the retry from the rebuilt seqno table
    assert list(_write_retrying(writer, [4, 5, 6])) == [DUPLICATE] * 3
    assert heard.seqnos() == [[4, 5, 6]]
    assert heard.calls[0][0] == "dc1.app"
    assert [decode(r).data for r in heard.calls[0][1]] == [b"line 4\n", b"line 5\n", b"line 6\n"]
    # later writes are answered normally and told nothing more
    assert list(writer.write(META, _batch([7])).written) == [WRITTEN]
    assert heard.seqnos() == [[4, 5, 6]]
    seqnos = [decode(r.value).seqno for r in kafka_store.read("dc1.app", 0, 0, 1000).records]
    assert seqnos == [1, 2, 3, 4, 5, 6, 7], "lost or duplicated in the log"


def test_an_owner_replaced_before_its_retry_still_settles_the_unanswered_commit(
    kafka_store: LogStore, faults: _Faults
) -> None:
    """A state read finds the failed owner broken and replaces it: the new owner's takeover
    settles what the old one left unanswered."""
    heard, writer = _failed_write(kafka_store, faults, "lose_answer", [1], [2, 3])
    kafka_store.get_state("dc1.app", 0, "no-such-key")  # drops the broken owner
    assert list(_write_retrying(writer, [2, 3])) == [DUPLICATE] * 2
    assert heard.seqnos() == [[2, 3]]


def _wait_for(check: Any, what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.1)


def test_a_commit_whose_answer_was_lost_is_told_with_no_retry_and_no_takeover_here(
    kafka_store: LogStore, faults: _Faults
) -> None:
    """The client went elsewhere, or the partition moved to another gateway: nothing takes
    the partition over here again, and the settler reads the commit once readers see past
    it."""
    heard, writer = _failed_write(kafka_store, faults, "lose_answer", [1], [2, 3])
    _wait_for(lambda: heard.calls, "the settler told the hook")
    assert heard.seqnos() == [[2, 3]]
    # the takeover the retry makes finds it settled: told once, not twice
    assert list(_write_retrying(writer, [2, 3])) == [DUPLICATE] * 2
    assert heard.seqnos() == [[2, 3]]


def test_a_commit_that_never_arrived_is_dropped_once_another_writer_took_the_partition(
    kafka_store: LogStore, kafka_cluster: Any, kafka_namespace: str, faults: _Faults
) -> None:
    """Another gateway's takeover (here a bare producer of the partition's transactional id)
    aborts the open transaction; the settler then reads that it did not go through."""
    heard, _writer = _failed_write(kafka_store, faults, "fail_before", [1], [2, 3])
    ctx = kafka_store._ctx  # type: ignore[attr-defined]
    assert ctx.unanswered("dc1.app", 0) is not None
    time.sleep(3 * 2.0)  # the settler looks several times: the transaction is still open
    assert ctx.unanswered("dc1.app", 0) is not None, "settled while Kafka had not decided"
    other = Producer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap,
            "transactional.id": naming.transactional_id(kafka_namespace, "dc1.app", 0),
        }
    )
    other.init_transactions(30)  # fences the owner and aborts its open transaction
    other.begin_transaction()
    other.produce(naming.data_topic(kafka_namespace, "dc1.app"), b"another writer", partition=0)
    other.commit_transaction(30)
    _wait_for(lambda: ctx.unanswered("dc1.app", 0) is None, "the settler read it")
    assert heard.calls == []


def test_a_commit_whose_records_are_at_other_offsets_is_aborted_and_written_again(
    kafka_store: LogStore, faults: _Faults
) -> None:
    """Kafka put the records one offset further than expected (seen after a broker restart
    under load; here another record is produced first, in the same transaction): the records
    are delivered before the commit, so it is aborted, not committed; the callers get 503 and
    the retry writes them once.  (They used to be committed where Kafka put them; that also
    committed a transaction in flight across its topic's deletion into the topic made again,
    see test_commit_into_a_topic_made_again.py.)"""
    heard = _Heard()
    writer = ExactlyOnceWriter(kafka_store, dc="dc1", partitions=1, committed_late=heard)
    assert list(writer.write(META, _batch([1])).written) == [WRITTEN]
    faults.extra_record = True
    with pytest.raises(StoreUnavailable, match="not committed"):
        writer.write(META, _batch([2, 3]))
    assert list(_write_retrying(writer, [2, 3])) == [WRITTEN] * 2
    assert list(writer.write(META, _batch([4])).written) == [WRITTEN]
    assert heard.calls == []
    records = kafka_store.read("dc1.app", 0, 0, 1000).records
    envelopes = [decode(r.value) for r in records]
    assert [(e.source_id, e.seqno) for e in envelopes] == [(META.source_id, s) for s in range(1, 5)]


def test_a_commit_that_never_arrived_is_not_told_and_its_retry_is_written(
    kafka_store: LogStore, faults: _Faults
) -> None:
    heard, writer = _failed_write(kafka_store, faults, "fail_before", [1, 2], [3, 4])
    assert faults.injected == 1
    assert list(_write_retrying(writer, [3, 4])) == [WRITTEN] * 2
    assert heard.calls == []
    seqnos = [decode(r.value).seqno for r in kafka_store.read("dc1.app", 0, 0, 1000).records]
    assert seqnos == [1, 2, 3, 4]


def test_a_forwarded_transaction_keeps_the_owners_hook_only_if_its_sender_asked() -> None:
    heard = _Heard()
    asked = PreparedTransaction(records=[b"r"], counted_at_owner=True)
    not_asked = PreparedTransaction(records=[b"r"])
    decoded = PreparedTransaction.decode(asked.encode())
    assert decoded.counted_at_owner is True
    assert PreparedTransaction.decode(not_asked.encode()).counted_at_owner is False
    assert getattr(checked_transaction(decoded, heard), "committed_late", None) is heard
    assert getattr(checked_transaction(not_asked, heard), "committed_late", None) is None


def test_the_gateways_late_counter_counts_chunks_only_and_no_audit_topic() -> None:
    counts = WindowCounts()
    count = CommittedCounter(counts)
    chunk = EnvelopeWriter(source_id="s", server="h", file="/f", log_type="app")
    legacy = EnvelopeWriter(
        source_id="s", server="h", file="/f", log_type="app", kind="legacy_data"
    )
    created = 1_763_900_000_000
    count("dc1.app", [chunk.encode(1, created, 0, b"a\nb\n"), legacy.encode(2, created, 0, b"c\n")])
    count("dc1.logbroker-audit", [chunk.encode(3, created, 0, b"d\n")])
    assert counts.snapshot() == {("dc1.app", window_start(created)): (1, 2)}


def test_a_request_failing_in_one_partition_says_what_the_others_wrote(
    kafka_store: LogStore, faults: _Faults
) -> None:
    """``write_each_async``: the gateway counts what a failed request did write (its retry
    is answered ``duplicate`` there), so the writer reports each section on its own."""
    writer = ExactlyOnceWriter(kafka_store, dc="dc1", partitions=2)
    metas = [SourceMeta(log_type="app", source_id=f"each-{i}") for i in range(8)]
    first = asyncio.run(writer.write_each_async([(m, _batch([1])) for m in metas]))
    assert all(isinstance(r, WriteOutcome) for r in first)
    partitions = {r.route.partition for r in first if isinstance(r, WriteOutcome)}
    assert partitions == {0, 1}, "the sources should cover both partitions"
    faults.next = "fail_before"  # the next commit of either partition's owner fails
    results = asyncio.run(writer.write_each_async([(m, _batch([2])) for m in metas]))
    failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    written = [r for r in results if isinstance(r, WriteOutcome)]
    assert failed and written, results
    assert all(isinstance(results[i], StoreUnavailable) for i in failed)
    assert {r.route.partition for r in written} != {
        first[i].route.partition
        for i in failed  # type: ignore[union-attr]
    }
    assert all(list(r.written) == [WRITTEN] for r in written)
    with pytest.raises(StoreUnavailable):  # the all-or-error form raises the failure
        faults.next = "fail_before"
        asyncio.run(writer.write_many_async([(m, _batch([3])) for m in metas]))
