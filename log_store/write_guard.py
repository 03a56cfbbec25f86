"""What every write of the embedded store answers to before it acks anything.

Two things a gateway cannot see from the errors of its own writes:

- its data directory removed or replaced under it (``rm -rf``, a volume unmounted or swapped):
  SQLite and the open segment files go on writing into unlinked inodes, and a write that
  "succeeds" there is gone at the next start.  The store holds a descriptor of the directory it
  was opened in; a removed directory has no links left, a replaced one is another inode at the
  path.  Two system calls, once per group commit (not per chunk).
- a disk that hangs (a frozen file system, a dead volume): a write then neither succeeds nor
  fails.  Each store operation that touches the disk is timed while it runs; one outstanding for
  longer than ``stall_after_s`` makes the store not ready, without asking the disk.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from log_store.errors import StoreUnavailable

DEFAULT_STALL_AFTER_S = 5.0
"""A store operation outstanding this long makes the store not ready (``readiness``)."""


class WriteGuard:
    """The data directory a store was opened in, and the store operations now in flight."""

    def __init__(self, data_dir: Path, stall_after_s: float = DEFAULT_STALL_AFTER_S) -> None:
        self.data_dir = data_dir
        self.stall_after_s = stall_after_s
        self._dir_fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
        self._lock = threading.Lock()
        self._started: dict[int, tuple[float, str]] = {}
        self._ids = itertools.count()

    def directory_problem(self) -> str | None:
        """Why the data directory is no longer the one the store was opened in, or None."""
        try:
            held = os.fstat(self._dir_fd)
        except OSError as exc:  # closed: the store is
            return f"the data directory cannot be looked at: {exc.strerror}"
        if held.st_nlink == 0:
            return "the data directory was removed while the gateway was using it"
        try:
            now = os.stat(self.data_dir)
        except OSError as exc:
            return f"the data directory cannot be looked at: {exc.strerror}"
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            return (
                "the data directory was replaced while the gateway was using it "
                "(another directory or volume is at its path now)"
            )
        return None

    def check(self) -> None:
        """Raise :class:`StoreUnavailable` if writes must not be acked here now."""
        problem = self.directory_problem()
        if problem is not None:
            raise StoreUnavailable(f"log store unavailable: {problem}")

    def check_not_removed(self) -> None:
        """:meth:`check`'s first half, one ``fstat``: for the look just before an ack, where
        a directory removed under the write is what can have changed since :meth:`check`."""
        try:
            removed = os.fstat(self._dir_fd).st_nlink == 0
        except OSError:
            removed = True  # the store was closed
        if removed:
            raise StoreUnavailable(
                "log store unavailable: the data directory was removed while the gateway "
                "was using it"
            )

    @contextmanager
    def operation(self, what: str) -> Iterator[None]:
        """Time the block as a store operation in flight (see :meth:`stalled`)."""
        key = next(self._ids)
        with self._lock:
            self._started[key] = (time.monotonic(), what)
        try:
            yield
        finally:
            with self._lock:
                del self._started[key]

    def stalled(self) -> str | None:
        """Why the disk looks hung (an operation in flight too long), or None.  Never touches
        the disk, so it answers while the disk does not."""
        with self._lock:
            oldest = min(self._started.values(), default=None)
        if oldest is None:
            return None
        age = time.monotonic() - oldest[0]
        if age < self.stall_after_s:
            return None
        return (
            f"a store operation ({oldest[1]}) has been waiting on the data directory's disk "
            f"for {age:.0f} s"
        )

    def close(self) -> None:
        fd, self._dir_fd = self._dir_fd, -1
        if fd >= 0:
            os.close(fd)
