"""What a worker's long-polls hold while they wait, bounded and shared.

A read (``/v1/fetch`` or one partition's messages) with ``wait_ms`` that finds nothing new
waits: every position it names holds an append watch, is read again on every wake, and, for
a topic not made yet, is looked for again every half second.  :class:`WaitingPositions`
bounds how many positions a worker's long-polls wait on, in all and per token (a 429 for the
long-poll that would pass it, which a reader answers by reading without waiting for a while:
see docs/protocol.md, "Limits").  :class:`AbsentPartitions` makes the looks for topics not
made yet cheap: one look per topic (per partition of a topic that is there) and interval,
whatever number of long-polls waits for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import anyio.to_thread

from log_store.errors import LimitReached, UnknownPartition, UnknownTopic
from log_store.interface import LogStore

RETRY_AFTER_S = 1
"""What a long-poll refused for waiting positions is told to wait before it asks again: by
then the long-polls that filled the bound may have been answered."""

LOOK_SHARE = 0.25
"""The share of one thread's time that looks for topics not made yet may take: a look of
many partitions that took ``t`` seconds is kept ``t / LOOK_SHARE`` (at least the interval)."""

TopicPartition = tuple[str, int]


class WaitingPositions:
    """The positions this worker's long-polls wait on: at most ``max_total`` in all and
    ``max_per_token`` of one token owner's (no share without tokens: ``owner`` None).

    Counted on the event loop only (one per worker), so no lock is needed."""

    def __init__(self, max_total: int, max_per_token: int) -> None:
        self.max_total = max_total
        self.max_per_token = max_per_token
        self.total = 0
        self._by_owner: dict[str, int] = {}

    def of(self, owner: str) -> int:
        """The positions ``owner``'s long-polls wait on now."""
        return self._by_owner.get(owner, 0)

    @contextmanager
    def hold(self, owner: str | None, count: int) -> Iterator[None]:
        """Count ``count`` positions as waiting while the ``with`` block runs; raises
        :class:`LimitReached` (nothing counted) if they do not fit."""
        if self.total + count > self.max_total:
            raise LimitReached(
                f"this gateway worker's long-polls wait on {self.total} positions, at most "
                f"{self.max_total} (max_waiting_positions): this one's {count} do not fit; read "
                f"without wait_ms, or wait {RETRY_AFTER_S} s and ask again",
                "max_waiting_positions",
                self.max_total,
                retry_after_s=RETRY_AFTER_S,
            )
        held = self.of(owner) if owner is not None else 0
        if owner is not None and held + count > self.max_per_token:
            raise LimitReached(
                f"this token's long-polls wait on {held} positions of this gateway worker, at "
                f"most {self.max_per_token} (max_waiting_positions_per_token): this one's "
                f"{count} do not fit; read without wait_ms, or wait {RETRY_AFTER_S} s and ask "
                "again",
                "max_waiting_positions_per_token",
                self.max_per_token,
                retry_after_s=RETRY_AFTER_S,
            )
        self.total += count
        if owner is not None:
            self._by_owner[owner] = held + count
        try:
            yield
        finally:
            self.total -= count
            if owner is not None:
                left = self._by_owner[owner] - count
                if left:
                    self._by_owner[owner] = left
                else:
                    del self._by_owner[owner]


class AbsentPartitions:
    """Which of the partitions long-polls found not there (a topic not made yet, or made
    again with fewer partitions) are there now.

    An answer is kept for ``interval_s``, and shared by every long-poll of the worker: the
    store is asked about a partition at most once per interval, and about a topic that is
    not there once for all its partitions.  The looks run one at a time, in one thread, and
    a look that took long is kept longer (:data:`LOOK_SHARE` of one thread's time at most):
    long-polls of many thousand missing topics cost one thread a part of its time, not the
    worker's thread pool.  A topic made meanwhile is seen when its answer is renewed."""

    def __init__(self, store: LogStore, interval_s: float) -> None:
        self._store = store
        self._interval_s = interval_s
        self._lock = asyncio.Lock()
        self._missing_topics: dict[str, float] = {}
        """Topic -> until when it is taken as not there."""
        self._partitions: dict[TopicPartition, tuple[float, bool]] = {}
        """Partition of a topic that is there -> (until when the answer holds, there)."""
        self._pruned = time.monotonic()

    async def still_absent(self, partitions: Sequence[TopicPartition]) -> set[TopicPartition]:
        """The ones of ``partitions`` that are not there, as looked at lately."""
        async with self._lock:
            now = time.monotonic()
            self._prune(now)
            unknown = [tp for tp in dict.fromkeys(partitions) if self._answer(tp, now) is None]
            if unknown:
                missing, there = await anyio.to_thread.run_sync(self._look, unknown)
                looked = time.monotonic()
                until = looked + max(self._interval_s, (looked - now) / LOOK_SHARE)
                for topic in missing:
                    self._missing_topics[topic] = until
                for tp in unknown:
                    if tp[0] not in missing:
                        self._partitions[tp] = (until, tp in there)
            return {tp for tp in partitions if self._answer(tp, now) is False}

    def _answer(self, tp: TopicPartition, now: float) -> bool | None:
        """Whether ``tp`` is there, as a look still valid at ``now`` says; None: not known."""
        if self._missing_topics.get(tp[0], 0.0) > now:
            return False
        until, there = self._partitions.get(tp, (0.0, False))
        return there if until > now else None

    def _look(self, partitions: Sequence[TopicPartition]) -> tuple[set[str], set[TopicPartition]]:
        """(topics not there, partitions there) of ``partitions``: a blocking look each."""
        missing: set[str] = set()
        there: set[TopicPartition] = set()
        for topic, partition in partitions:
            if topic in missing:
                continue
            try:
                self._store.end_offset(topic, partition)
            except UnknownTopic:
                missing.add(topic)
            except UnknownPartition:
                pass  # the topic is there: a partition it lacks is the read's answer
            except Exception:
                there.add((topic, partition))  # something else: the long-poll's read says what
            else:
                there.add((topic, partition))
        return missing, there

    def _prune(self, now: float) -> None:
        """Forget answers that no longer hold (once per interval: the dicts stay as large as
        the looks of one interval, which the waiting positions bound)."""
        if now - self._pruned < self._interval_s:
            return
        self._missing_topics = {
            t: until for t, until in self._missing_topics.items() if until > now
        }
        self._partitions = {tp: seen for tp, seen in self._partitions.items() if seen[0] > now}
        self._pruned = now
