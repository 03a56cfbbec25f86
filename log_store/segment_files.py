"""Open segment files for reading, shared by a partition's reader threads.

A descriptor is closed only when no read is using it, so a thread never reads through a
descriptor number that another thread closed and the kernel gave to some other file.  Segments
that retention dropped (below the log start offset) are let go at the next read, whichever
process dropped them, so their disk space is freed; at most ``MAX_OPEN`` stay open.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

MAX_OPEN = 64


class _OpenSegment:
    __slots__ = ("fd", "retired", "users")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0
        self.retired = False


class SegmentFiles:
    """Reference-counted read descriptors of one partition's segment files."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._lock = threading.Lock()
        self._open: dict[int, _OpenSegment] = {}

    def pread(self, segment: int, path_name: str, pos: int, length: int) -> bytes:
        with self._lock:
            entry = self._open.get(segment)
            if entry is None:
                if len(self._open) >= MAX_OPEN:
                    self._retire(min(self._open))
                entry = _OpenSegment(os.open(self._directory / path_name, os.O_RDONLY))
                self._open[segment] = entry
            entry.users += 1
        try:
            return os.pread(entry.fd, length, pos)
        finally:
            with self._lock:
                entry.users -= 1
                if entry.retired and entry.users == 0:
                    os.close(entry.fd)

    def forget_below(self, start_offset: int) -> None:
        """Let go of every segment whose base is below the log start offset."""
        with self._lock:
            for segment in [s for s in self._open if s < start_offset]:
                self._retire(segment)

    def forget(self, segment: int) -> None:
        with self._lock:
            if segment in self._open:
                self._retire(segment)

    def close(self) -> None:
        with self._lock:
            for segment in list(self._open):
                self._retire(segment)

    def _retire(self, segment: int) -> None:
        entry = self._open.pop(segment)
        entry.retired = True
        if entry.users == 0:
            os.close(entry.fd)
