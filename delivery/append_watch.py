"""Long-poll waits woken by appends, shared by every reader of a partition in this process.

A waiting long-poll holds no thread.  Each partition someone waits on has one entry here,
with the asyncio waiters on it, and is followed through the store
(``LogStore.follow_appends``): the append itself (the thread that committed it, or the
store's one thread that watches other processes' appends) wakes every waiter of the
partition, with one call into each event loop that has some.  A read of N partitions awaits
one future across all N, so N idle partitions cost N set entries and a store follower each,
not N threads.  A partition nobody waits on is let go after :data:`IDLE_UNFOLLOW_S` (a
tailing reader's next long-poll comes back well within it and finds it still followed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import anyio.to_thread

from log_store.interface import LogStore

IDLE_UNFOLLOW_S = 10.0
"""A partition nobody has waited on for this long is no longer followed (looked at by the
long-polls that begin, at most once per half of it)."""

Position = tuple[str, int, int]
"""(topic, partition, offset): wake when the partition's end offset is above ``offset``."""

TopicPartition = tuple[str, int]


@dataclass(eq=False)
class _Waiter:
    """One ``wait_any`` call: its future, set by the first append to any of its partitions."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[bool]


@dataclass(eq=False)
class _Partition:
    waiters: set[_Waiter] = field(default_factory=set)
    unfollow: Callable[[], None] | None = None
    """Ends the store's following of the partition; None: not followed (yet)."""
    idle_since: float = 0.0


def _wake(futures: list[asyncio.Future[bool]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(True)


def _wake_in_their_loops(waiters: Iterable[_Waiter]) -> None:
    """Wake ``waiters`` from any thread: one call into each event loop that has some."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[bool]]] = {}
    for waiter in waiters:
        by_loop.setdefault(waiter.loop, []).append(waiter.future)
    for loop, futures in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop closed: its waiters are gone
            loop.call_soon_threadsafe(_wake, futures)


class AppendWatch:
    """Waits for appends to any of several partitions without polling or a thread each."""

    def __init__(self, store: LogStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        """Guards the partitions and their waiters (taken by the event loop and by the
        threads appends wake from; held for dict and set operations only)."""
        self._following = threading.Lock()
        """Held while the store is asked to follow or let go (one thread at a time): a
        second waiter of a partition being followed waits for that before its own look."""
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._swept = time.monotonic()
        self.closed = False

    @property
    def followed(self) -> int:
        """How many partitions the store follows for this watch now."""
        with self._lock:
            return sum(1 for p in self._partitions.values() if p.unfollow is not None)

    @property
    def waiting(self) -> int:
        """How many (wait, partition) pairs wait now."""
        with self._lock:
            return sum(len(p.waiters) for p in self._partitions.values())

    async def wait_any(self, positions: Sequence[Position], timeout_s: float) -> bool:
        """True as soon as one partition's end passes its offset; False after the timeout."""
        if not positions or timeout_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop, loop.create_future())
        keys = list(dict.fromkeys((topic, partition) for topic, partition, _ in positions))
        with self._lock:
            for key in keys:
                self._partitions.setdefault(key, _Partition()).waiters.add(waiter)
        try:
            # Followed now if they were not; then an append between the caller's read and
            # the registration above, which woke nobody, is looked for once.
            ends = await anyio.to_thread.run_sync(self._follow_and_look, keys, positions)
            if any(
                end is None or end > off for end, (_, _, off) in zip(ends, positions, strict=True)
            ):
                return True
            try:
                return await asyncio.wait_for(asyncio.shield(waiter.future), timeout_s)
            except TimeoutError:
                return False
        finally:
            now = time.monotonic()
            with self._lock:
                for key in keys:
                    entry = self._partitions.get(key)
                    if entry is not None and waiter in entry.waiters:
                        entry.waiters.discard(waiter)
                        if not entry.waiters:
                            entry.idle_since = now

    def _follow_and_look(
        self, keys: Sequence[TopicPartition], positions: Sequence[Position]
    ) -> list[int | None]:
        """Have the store follow those of ``keys`` it does not yet, then the partitions'
        ends (None: the look failed, which the caller's read will say).  In a thread."""
        broken: set[TopicPartition] = set()
        with self._following:
            with self._lock:
                new = [
                    key
                    for key in keys
                    if (entry := self._partitions.get(key)) is not None and entry.unfollow is None
                ]
            # each looks at its partition's end: looked up together (see LogStore.reads_of)
            with self._store.reads_of(new):
                for key in new:
                    with self._lock:
                        entry = self._partitions.get(key)
                        if entry is None or entry.unfollow is not None or self.closed:
                            continue
                    try:
                        unfollow = self._store.follow_appends(
                            key[0], key[1], functools.partial(self._appended, key)
                        )
                    except Exception:
                        broken.add(key)  # the topic went away meanwhile, or the store failed
                        continue
                    with self._lock:
                        entry.unfollow = unfollow
            self._sweep()
        ends: list[int | None] = []
        # asked after every partition is followed: an append since is in these ends
        with self._store.reads_of([(topic, partition) for topic, partition, _ in positions]):
            for topic, partition, _ in positions:
                if (topic, partition) in broken:
                    ends.append(None)
                    continue
                try:
                    ends.append(self._store.end_offset(topic, partition))
                except Exception:
                    ends.append(None)
        return ends

    def _sweep(self) -> None:
        """Let go of the partitions nobody waited on for :data:`IDLE_UNFOLLOW_S` (with
        ``_following`` held, at most once per half of it)."""
        now = time.monotonic()
        if now - self._swept < IDLE_UNFOLLOW_S / 2:
            return
        self._swept = now
        with self._lock:
            idle = [
                key
                for key, entry in self._partitions.items()
                if not entry.waiters and now - entry.idle_since > IDLE_UNFOLLOW_S
            ]
            gone = [self._partitions.pop(key) for key in idle]
        for entry in gone:
            if entry.unfollow is not None:
                entry.unfollow()

    def _appended(self, key: TopicPartition) -> None:
        """The store saw the partition change: wake its waiters.  In any thread."""
        with self._lock:
            entry = self._partitions.get(key)
            if entry is None or not entry.waiters:
                return
            woken, entry.waiters = entry.waiters, set()
            entry.idle_since = time.monotonic()
        _wake_in_their_loops(woken)

    def close(self) -> None:
        """Wake every waiter and let go of every partition."""
        with self._following:
            with self._lock:
                self.closed = True
                entries = list(self._partitions.values())
                self._partitions.clear()
            for entry in entries:
                if entry.unfollow is not None:
                    entry.unfollow()
                _wake_in_their_loops(entry.waiters)
