"""A read that Kafka answers "offset out of range" for an offset inside the partition is read
again with a new consumer, and is never answered ``OffsetOutOfRange`` (416) for it.

Seen right after a topic was deleted and made again: a gateway answered a loader's read of
offset 0 with 416 "offset is outside 0..200" (a pooled consumer's stale view of the
partition), and the loader took the log for truncated.  The race did not show reliably
against the session's broker, so the consumers here are stand-ins that follow a script (as in
``test_fetcher_ends``); only a real out-of-range (below the log start) is 416.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from confluent_kafka import KafkaError

from log_store.errors import OffsetOutOfRange, StoreUnavailable
from log_store.kafka.fetcher import FetcherPool, _Fetcher
from log_store.kafka.settings import KafkaSettings


class _Message:
    def __init__(self, offset: int, error: int | None = None) -> None:
        self._offset, self._error = offset, error

    def error(self) -> Any:
        return None if self._error is None else KafkaError(self._error)

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return b"r%d" % self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


class _Consumer:
    """Hands out scripted batches, one per ``consume`` call."""

    def __init__(self, *batches: list[_Message]) -> None:
        self.batches: deque[list[_Message]] = deque(batches)
        self.closed = False

    def consume(self, _n: int, _timeout: float) -> list[_Message]:
        return self.batches.popleft() if self.batches else []

    def poll(self, _timeout: float) -> None:
        return None

    def assign(self, _partitions: Any) -> None:
        """Nothing to assign: the script says what comes."""

    def unassign(self) -> None:
        """Nothing assigned."""

    def close(self) -> None:
        self.closed = True


class _Watermarks:
    def __init__(self, *answers: tuple[int, int]) -> None:
        self.answers = deque(answers)

    def get(self, *_args: Any, **_kwargs: Any) -> tuple[int, int]:
        # the last answer holds once the script is done
        return self.answers.popleft() if len(self.answers) > 1 else self.answers[0]


def _out_of_range(offset: int, code: int = KafkaError.OFFSET_OUT_OF_RANGE) -> list[_Message]:
    return [_Message(offset, code)]


def _records(*offsets: int, end: int) -> list[_Message]:
    return [*(_Message(o) for o in offsets), _Message(end, KafkaError._PARTITION_EOF)]


def _pool(
    watermarks: _Watermarks, pooled: _Consumer, new: list[_Consumer]
) -> tuple[FetcherPool, list[_Consumer]]:
    """A pool holding ``pooled`` idle; new consumers are taken from ``new``, in order."""
    settings = KafkaSettings("unused:9092", operation_timeout_s=2)
    pool = FetcherPool(settings, watermarks)  # type: ignore[arg-type]
    pool._idle.append(_Fetcher(pooled, tp=("t", 0), position=0))  # type: ignore[arg-type]
    pool._count = 1
    made: list[_Consumer] = []

    def new_fetcher() -> _Fetcher:
        made.append(new.pop(0))
        return _Fetcher(made[-1])  # type: ignore[arg-type]

    pool._new_fetcher = new_fetcher  # type: ignore[method-assign]
    return pool, made


@pytest.mark.parametrize("code", [KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET])
def test_out_of_range_for_an_offset_inside_the_log_is_read_again_with_a_new_consumer(
    code: int,
) -> None:
    stale = _Consumer(_out_of_range(0, code))
    fresh = _Consumer(_records(0, 1, end=3))
    pool, made = _pool(_Watermarks((0, 3)), stale, [fresh])

    read = pool.read("t", 0, 0, max_bytes=1 << 20, what="dc1.app/0")

    assert [r.offset for r in read.records] == [0, 1]
    assert made == [fresh] and stale.closed  # the stale consumer is not pooled again
    assert pool._idle[0].consumer is fresh  # the new one is, for the next read


def test_refused_again_by_a_new_consumer_the_read_is_to_be_retried_not_out_of_range() -> None:
    pool, _made = _pool(
        _Watermarks((0, 200)), _Consumer(_out_of_range(0)), [_Consumer(_out_of_range(0))]
    )
    with pytest.raises(StoreUnavailable, match=r"holds 0\.\.200.*retry") as caught:
        pool.read("t", 0, 0, max_bytes=1 << 20, what="dc1.app/0")
    assert not isinstance(caught.value, OffsetOutOfRange)


def test_out_of_range_below_a_log_start_that_moved_is_out_of_range() -> None:
    # the start was 0 when the read began; retention moved it to 5 while it read
    pool, made = _pool(_Watermarks((0, 10), (5, 10)), _Consumer(_out_of_range(0)), [])
    with pytest.raises(OffsetOutOfRange) as caught:
        pool.read("t", 0, 0, max_bytes=1 << 20, what="dc1.app/0")
    assert (caught.value.start_offset, caught.value.end_offset) == (5, 10)
    assert made == []  # a real answer: not read again
