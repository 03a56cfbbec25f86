"""Long-poll waits woken by appends, shared by every reader of a partition in this process.

``LogStore.wait_for_data`` blocks a thread.  Giving every waiting request its own thread per
partition would spend hundreds of threads on 16 readers of a 16-partition topic; instead one
thread per watched partition waits on the store and wakes every asyncio waiter whose offset
the partition's end has passed.  The thread goes away when nobody has waited for a while.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio.to_thread

from log_store.interface import LogStore

_SLICE_S = 1.0
_IDLE_EXIT_S = 10.0

Position = tuple[str, int, int]
"""(topic, partition, offset): wake when the partition's end offset is above ``offset``."""


@dataclass(eq=False)
class _Waiter:
    offset: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[bool]

    def wake(self) -> None:
        def _set() -> None:
            if not self.future.done():
                self.future.set_result(True)

        with contextlib.suppress(RuntimeError):  # the loop closed: its waiter is gone too
            self.loop.call_soon_threadsafe(_set)


class _PartitionWatch:
    def __init__(self, store: LogStore, topic: str, partition: int, owner: AppendWatch) -> None:
        self._store = store
        self.topic = topic
        self.partition = partition
        self._owner = owner
        self.waiters: set[_Waiter] = set()
        self.thread: threading.Thread | None = None

    def run(self) -> None:
        idle_since: float | None = None
        lock = self._owner.lock
        while not self._owner.closed:
            with lock:
                if not self.waiters:
                    now = time.monotonic()
                    idle_since = idle_since or now
                    if now - idle_since > _IDLE_EXIT_S:
                        self.thread = None
                        return
                    low = None
                else:
                    idle_since = None
                    low = min(w.offset for w in self.waiters)
            if low is None:
                time.sleep(0.05)
                continue
            try:
                self._store.wait_for_data(self.topic, self.partition, low, _SLICE_S)
                end = self._store.end_offset(self.topic, self.partition)
            except Exception:
                # The topic went away or the store closed: wake everyone, they will re-read and
                # get the real error from the read itself.
                end = None
            with lock:
                ready = [w for w in self.waiters if end is None or w.offset < end]
                for w in ready:
                    self.waiters.discard(w)
            for w in ready:
                w.wake()
            if end is None:
                time.sleep(0.05)


class AppendWatch:
    """Waits for appends to any of several partitions without polling."""

    def __init__(self, store: LogStore) -> None:
        self._store = store
        self.lock = threading.Lock()
        self.closed = False
        self._watches: dict[tuple[str, int], _PartitionWatch] = {}

    async def wait_any(self, positions: Sequence[Position], timeout_s: float) -> bool:
        """True as soon as one partition's end passes its offset; False after the timeout."""
        if not positions or timeout_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        registered: list[tuple[_PartitionWatch, _Waiter]] = []
        with self.lock:
            for topic, partition, offset in positions:
                watch = self._watch(topic, partition)
                waiter = _Waiter(offset, loop, future)
                watch.waiters.add(waiter)
                registered.append((watch, waiter))
        try:
            # An append between the caller's read and the registration above would not wake
            # the watch threads if they wait on a lower offset; look once now.
            ends = await anyio.to_thread.run_sync(self._ends, positions)
            if any(
                end is None or end > off for end, (_, _, off) in zip(ends, positions, strict=True)
            ):
                return True
            try:
                return await asyncio.wait_for(asyncio.shield(future), timeout_s)
            except TimeoutError:
                return False
        finally:
            with self.lock:
                for watch, waiter in registered:
                    watch.waiters.discard(waiter)

    def _ends(self, positions: Sequence[Position]) -> list[int | None]:
        ends: list[int | None] = []
        for topic, partition, _ in positions:
            try:
                ends.append(self._store.end_offset(topic, partition))
            except Exception:
                ends.append(None)
        return ends

    def _watch(self, topic: str, partition: int) -> _PartitionWatch:
        key = (topic, partition)
        watch = self._watches.get(key)
        if watch is None:
            watch = _PartitionWatch(self._store, topic, partition, self)
            self._watches[key] = watch
        if watch.thread is None:
            watch.thread = threading.Thread(
                target=watch.run, name=f"append-watch {topic}/{partition}", daemon=True
            )
            watch.thread.start()
        return watch

    def close(self) -> None:
        """Stop the watch threads (within one wait slice)."""
        with self.lock:
            self.closed = True
            for watch in self._watches.values():
                for w in watch.waiters:
                    w.wake()
                watch.waiters.clear()
