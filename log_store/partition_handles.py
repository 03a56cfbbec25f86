"""The open partitions of one embedded store: a bounded cache, least recently used closed first.

An open :class:`~log_store.sqlite_partition.PartitionLog` holds file descriptors: SQLite
connections (the database, its WAL and shared memory), segment files being read, and while it
commits the segment it appends to, its lock and notify files.  A store with thousands of
topics would run out of descriptors (``EMFILE``) if it kept every partition it ever touched
open, so at most ``max_open`` stay open: opening one more closes the least recently used
partitions that nobody is using.

A partition is *in use* while a lease on it is held: a read, a state lookup, a long poll, or
a transaction from its submission until its future is resolved.  One in use is never closed
(closing it would fail the operation), so while more than ``max_open`` partitions are in use
at once, that many stay open; the idle ones beyond the limit are closed at the next open.
Closing a partition commits what is queued and lets go of its files; the next use opens it
again (a cheap check that its index matches its segments).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from log_store.sqlite_partition import PartitionLog

DEFAULT_MAX_OPEN_PARTITIONS = 256

PartitionKey = tuple[str, int]
"""(topic id, partition): a topic created again under the same name is another key."""


class _Handle:
    __slots__ = ("key", "log", "users")

    def __init__(self, key: PartitionKey, log: PartitionLog) -> None:
        self.key = key
        self.log = log
        self.users = 0


class PartitionHandles:
    """At most ``max_open`` idle partitions open; in-use ones are never closed."""

    def __init__(
        self, max_open: int, on_close: Callable[[PartitionKey, PartitionLog], None]
    ) -> None:
        if max_open < 1:
            raise ValueError("max_open must be at least 1")
        self.max_open = max_open
        self._on_close = on_close
        self._lock = threading.Lock()
        self._open: OrderedDict[PartitionKey, _Handle] = OrderedDict()
        self.closed_total = 0
        """Partitions closed to stay within ``max_open`` (not counting deletions)."""

    def __len__(self) -> int:
        return len(self._open)

    def acquire(self, key: PartitionKey, opener: Callable[[], PartitionLog]) -> _Handle:
        """Mark ``key`` in use (opening it if needed); :meth:`release` the handle after."""
        evicted: list[_Handle] = []
        with self._lock:
            handle = self._open.get(key)
            if handle is None:
                handle = _Handle(key, opener())
                self._open[key] = handle
            else:
                self._open.move_to_end(key)
            handle.users += 1
            evicted = self._evict_idle()
        self._close(evicted)
        return handle

    def release(self, handle: _Handle) -> None:
        """The caller stopped using the partition.  Safe from any thread (committers too):
        nothing is closed here."""
        with self._lock:
            handle.users -= 1

    def _evict_idle(self) -> list[_Handle]:
        """Take the least recently used idle handles out until ``max_open`` remain (lock held)."""
        excess = len(self._open) - self.max_open
        if excess <= 0:
            return []
        idle = [h for h in self._open.values() if h.users == 0][:excess]
        for handle in idle:
            del self._open[handle.key]
        self.closed_total += len(idle)
        return idle

    def _close(self, handles: list[_Handle]) -> None:
        for handle in handles:
            self._on_close(handle.key, handle.log)
            handle.log.close()

    def get(self, key: PartitionKey) -> PartitionLog | None:
        """The open partition ``key``, without marking it used (for settings changes)."""
        handle = self._open.get(key)
        return None if handle is None else handle.log

    def items(self) -> list[tuple[PartitionKey, PartitionLog]]:
        with self._lock:
            return [(key, h.log) for key, h in self._open.items()]

    def pop_topic(self, topic_id: str) -> list[tuple[PartitionKey, PartitionLog]]:
        """Take every open partition of a topic out, in use or not; the caller closes them."""
        with self._lock:
            keys = [k for k in self._open if k[0] == topic_id]
            return [(k, self._open.pop(k).log) for k in keys]

    def pop_all(self) -> list[PartitionLog]:
        with self._lock:
            logs = [h.log for h in self._open.values()]
            self._open.clear()
        return logs
