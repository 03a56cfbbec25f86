"""Where a Kafka read stops and where the next one starts, with a scripted consumer.

Kafka's ends come in two ways: the last stable offset asked for before a read (``end``) and
the consumer's end-of-partition event, which it raises once when it gets there.  A read that
stops at ``max_bytes`` on the last record it had can leave that event behind for the next
read; by then more may be committed.  Such a stale end must not end the next read, or the
records committed since would be skipped (the next read would start at the new ``end``).
No broker here: the consumer and the watermarks are stand-ins that follow a script.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from confluent_kafka import KafkaError

from log_store.kafka.fetcher import FetcherPool, _Fetcher
from log_store.kafka.settings import KafkaSettings


class _Message:
    def __init__(self, offset: int, value: bytes | None = None, eof: bool = False) -> None:
        self._offset, self._value, self._eof = offset, value, eof

    def error(self) -> Any:
        return _Eof() if self._eof else None

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


class _Eof:
    def code(self) -> int:
        return KafkaError._PARTITION_EOF


class _Consumer:
    """Hands out scripted batches, one per ``consume`` call that finds its queue empty."""

    def __init__(self) -> None:
        self.batches: deque[list[_Message]] = deque()
        self.assigned: list[Any] = []
        """Every ``assign`` call: a read that goes on where the last one stopped makes none."""

    def consume(self, _n: int, _timeout: float) -> list[_Message]:
        return self.batches.popleft() if self.batches else []

    def poll(self, _timeout: float) -> _Message | None:
        return None  # everything scripted comes through ``consume``

    def assign(self, partitions: Any) -> None:
        self.assigned.append(partitions)

    def unassign(self) -> None:
        self.assigned.append(None)

    def close(self) -> None:
        self.assigned.append("closed")


class _Watermarks:
    def __init__(self) -> None:
        self.end = 0

    def get(self, *_args: Any) -> tuple[int, int]:
        return 0, self.end


def _record(offset: int) -> _Message:
    return _Message(offset, b"r%d" % offset)


def _pool() -> tuple[FetcherPool, _Consumer, _Watermarks]:
    """A pool holding one idle consumer that follows a script."""
    watermarks = _Watermarks()
    settings = KafkaSettings("unused:9092", operation_timeout_s=2)
    pool = FetcherPool(settings, watermarks)  # type: ignore[arg-type]
    consumer = _Consumer()
    pool._idle.append(_Fetcher(consumer))  # type: ignore[arg-type]
    pool._count = 1
    return pool, consumer, watermarks


def test_a_stale_end_left_by_a_read_that_stopped_at_max_bytes_skips_nothing() -> None:
    pool, consumer, watermarks = _pool()

    # records 0 and 1, their transaction's marker at 2: the end is 3
    watermarks.end = 3
    consumer.batches.append([_record(0), _record(1), _Message(3, eof=True)])
    first = pool.read("t", 0, 0, max_bytes=4, what="t/0")
    assert [r.offset for r in first.records] == [0, 1]  # stopped at max_bytes, the end left
    assert first.next_offset == 2

    # meanwhile another transaction committed records 3 and 4 (marker 5): the end is 6
    watermarks.end = 6
    consumer.batches.append([_record(3), _record(4), _Message(6, eof=True)])
    second = pool.read("t", 0, first.next_offset, max_bytes=1 << 20, what="t/0")
    assert [r.offset for r in second.records] == [3, 4], "the stale end ended the read"
    assert second.next_offset == 6  # past the marker: the reader at the end waits there
    assert len(consumer.assigned) == 1  # the second read went on with the same assignment

    # at the end: nothing new, the next read is empty and starts at the end again
    third = pool.read("t", 0, second.next_offset, max_bytes=1 << 20, what="t/0")
    assert third.records == [] and third.next_offset == 6


def test_a_read_that_reached_the_end_resumes_past_the_last_commit_marker() -> None:
    pool, consumer, watermarks = _pool()
    watermarks.end = 3
    consumer.batches.append([_record(0), _record(1), _Message(3, eof=True)])
    read = pool.read("t", 0, 0, max_bytes=1 << 20, what="t/0")
    assert [r.offset for r in read.records] == [0, 1]
    assert read.next_offset == 3  # not 2, the marker's offset


def test_a_replay_does_not_stop_at_a_stale_end() -> None:
    pool, consumer, _watermarks = _pool()
    fetcher = pool._idle[0]
    fetcher.tp, fetcher.position, fetcher.eof_at = ("t", 0), 2, 3  # left by an earlier read
    consumer.batches.append([_record(3), _record(4), _Message(6, eof=True)])
    seen: list[int] = []
    pool.replay("t", 0, 2, 6, lambda offset, _value: seen.append(offset), what="t/0")
    assert seen == [3, 4]
