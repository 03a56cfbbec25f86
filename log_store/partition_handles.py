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

The bound is also what the process's descriptor limit allows (:func:`partitions_that_fit`):
a configured 256 under ``ulimit -n`` 1024 would need twice the limit.  And should the process
run out of descriptors all the same (``EMFILE``: connections, deliveries, segments being read),
opening a partition closes idle ones and tries once more instead of failing.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable

from log_store.errors import StoreUnavailable
from log_store.failures import causes
from log_store.sqlite_partition import PartitionLog

_log = logging.getLogger(__name__)

DEFAULT_MAX_OPEN_PARTITIONS = 256

DESCRIPTORS_PER_PARTITION = 8
"""What one open partition holds while it is written, as counted in ``/proc/PID/fd``: its
database and its WAL twice each (the writer's and the readers' SQLite connections), the shared
memory, the segment it appends to, its write lock and its notify file.  An idle one holds 4;
a read holds one more for the segment it reads."""

RESERVED_DESCRIPTORS = 256
"""Descriptors kept for what is neither a partition nor a client connection: the listening
socket, the event loop's, logs, the catalog, metrics files, Kafka's and the peers' sockets,
push deliveries, the audit publisher and journals (one per worker, and one per push
subscription delivered in it, see ``audit.journal``)."""

MIN_OPEN_PARTITIONS = 4
"""The bound never goes below this, however low the descriptor limit."""


def descriptor_limit() -> int:
    """This process's soft limit of open descriptors (``RLIMIT_NOFILE``); "unlimited" as 2**20."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def partitions_that_fit(max_open: int, limit: int | None = None) -> int:
    """The open partitions a process with ``limit`` descriptors (its own soft limit if None)
    may keep: at most ``max_open``, and at most what half the limit leaves after
    :data:`RESERVED_DESCRIPTORS`, at :data:`DESCRIPTORS_PER_PARTITION` each (the other half
    is for client connections, see ``ingest_api.request_head.connection_cap``)."""
    if limit is None:
        limit = descriptor_limit()
    fitting = (limit // 2 - RESERVED_DESCRIPTORS) // DESCRIPTORS_PER_PARTITION
    return max(1, min(max_open, max(fitting, MIN_OPEN_PARTITIONS)))


def _may_be_out_of_descriptors(exc: BaseException) -> bool:
    """Whether opening may have failed for want of a descriptor: ``EMFILE``/``ENFILE``, or
    SQLite's "unable to open database file" (SQLite does not say why; closing idle partitions
    and trying once more costs little when it was something else)."""
    if _out_of_descriptors(exc):
        return True
    return any(
        isinstance(cause, sqlite3.OperationalError) and "unable to open" in str(cause).lower()
        for cause in causes(exc)
    )


def _out_of_descriptors(exc: BaseException) -> bool:
    """Whether ``exc`` says the process is out of descriptors, or it is close to its limit
    now (what SQLite's "unable to open database file" meant then)."""
    for cause in causes(exc):
        if isinstance(cause, OSError) and cause.errno in (errno.EMFILE, errno.ENFILE):
            return True
        if "too many open files" in str(cause).lower():
            return True
    try:
        held = len(os.listdir("/proc/self/fd"))
    except OSError as exc_now:
        return exc_now.errno in (errno.EMFILE, errno.ENFILE)
    return held >= descriptor_limit() - _NEAR_LIMIT


_NEAR_LIMIT = 16
"""Descriptors from the limit at which a failed open is taken for want of one."""


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
        self,
        max_open: int,
        on_close: Callable[[PartitionKey, PartitionLog], None],
        *,
        descriptors: int | None = None,
    ) -> None:
        """``max_open`` as configured; the bound kept is what ``descriptors`` (this process's
        soft ``RLIMIT_NOFILE`` if None) allows of it, see :func:`partitions_that_fit`."""
        if max_open < 1:
            raise ValueError("max_open must be at least 1")
        limit = descriptor_limit() if descriptors is None else descriptors
        self.max_open = partitions_that_fit(max_open, limit)
        if self.max_open < max_open:
            _log.warning(
                "keeping at most %d partitions open, not max_open_partitions = %d: the "
                "descriptor limit (ulimit -n, LimitNOFILE) is %d and an open partition takes "
                "up to %d; raise the limit to keep more",
                self.max_open,
                max_open,
                limit,
                DESCRIPTORS_PER_PARTITION,
            )
        self._on_close = on_close
        self._lock = threading.Lock()
        self._open: OrderedDict[PartitionKey, _Handle] = OrderedDict()
        self.closed_total = 0
        """Partitions closed to stay within ``max_open`` (not counting deletions)."""
        self.closed_for_descriptors = 0
        """Idle partitions closed because opening another ran out of descriptors."""

    def __len__(self) -> int:
        return len(self._open)

    def acquire(self, key: PartitionKey, opener: Callable[[], PartitionLog]) -> _Handle:
        """Mark ``key`` in use (opening it if needed); :meth:`release` the handle after.

        An open that runs out of descriptors closes idle partitions and is tried once more;
        if none is idle, or it fails again, it raises :class:`StoreUnavailable` saying so."""
        try:
            return self._acquire(key, opener)
        except Exception as exc:
            if not _may_be_out_of_descriptors(exc):
                raise
            first = exc
        with self._lock:
            idle = [h for h in self._open.values() if h.users == 0]
            # the older half: enough room for this one and the next few, without closing
            # what is being used right now
            victims = idle[: max(1, (len(idle) + 1) // 2)] if idle else []
            for handle in victims:
                del self._open[handle.key]
            self.closed_for_descriptors += len(victims)
            in_use = sum(1 for h in self._open.values() if h.users)
        if victims:
            _log.warning(
                "opening a partition failed (%s), perhaps for want of file descriptors: closed "
                "%d idle partitions and trying again",
                first,
                len(victims),
            )
            self._close(victims)
            try:
                return self._acquire(key, opener)
            except Exception as exc:
                first = exc
        if not _out_of_descriptors(first):
            raise first
        raise StoreUnavailable(
            f"log store unavailable: the process is out of file descriptors (ulimit -n "
            f"{descriptor_limit()}, {in_use} partitions in use): raise LimitNOFILE or lower "
            f"limits.max_open_partitions; retry later ({first})"
        ) from first

    def _acquire(self, key: PartitionKey, opener: Callable[[], PartitionLog]) -> _Handle:
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
