"""Counting messages and lines per (topic, window of the lines' create time), in memory.

A tier's hook calls :meth:`WindowCounts.add_chunk` once per chunk it handled; the cost on the
write path is one dictionary update and, for uncompressed chunks, one ``bytes.count``.  A
compressed chunk's lines are counted later, off the request path, when the publisher takes a
snapshot (up to :data:`MAX_DEFERRED_BYTES` of such chunks wait; past that they are counted at
once).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from session_dedup import chunk_codecs

WINDOW_S = 600
"""The audit's window: 10 minutes of create time."""
MAX_DEFERRED_BYTES = 64 << 20
MAX_AHEAD_S = 24 * 3600
"""With ``max_age_s``: how far past the clock a create time is taken as it is (a day: a
host whose clock is set to its local time zone, hours ahead, still counts in its windows)."""

Key = tuple[str, int]
"""(topic, window start in unix seconds)."""


def window_start(create_time_ms: int) -> int:
    """The start (unix seconds) of the window a create time (ms) falls in."""
    return (create_time_ms // 1000) // WINDOW_S * WINDOW_S


def count_lines(codec: str, data: bytes | memoryview) -> int:
    """Lines in a chunk's data (every chunk is whole lines once decompressed)."""
    try:
        return chunk_codecs.count_lines(codec, data)
    except chunk_codecs.CorruptChunk:
        return 0  # a gateway refuses such a chunk; one already in a log has no lines to count


class WindowCounts:
    """Messages and lines per (topic, window), cumulative since this object was made.

    Thread-safe: hooks add from request threads, the publisher snapshots from its own.

    ``max_age_s`` (for counts of create times a client chose, the gateway's): a create time
    older than that, or over :data:`MAX_AHEAD_S` ahead of ``clock``, is counted at that
    bound, so a client cannot make the counts hold one key per window it names, and windows
    older than the bound are final (:meth:`forget_before` may drop them once published).
    """

    def __init__(
        self,
        *,
        max_age_s: float | None = None,
        clock: Callable[[], float] = time.time,
        on_change: Callable[[list[tuple[Key, int, int]]], None] | None = None,
        after_snapshot: Callable[[dict[Key, tuple[int, int]]], None] | None = None,
    ) -> None:
        self._on_change = on_change
        """Told the changes ``[(key, messages, lines), ...]`` of each add, with the lock held,
        before a snapshot can hold them (the gateway's journal, :mod:`audit.journal`)."""
        self._after_snapshot = after_snapshot
        """Given each snapshot's totals, with the lock still held."""
        self._lock = threading.Lock()
        self._counts: dict[Key, list[int]] = {}
        self._deferred: list[tuple[Key, str, bytes | memoryview]] = []
        self._deferred_bytes = 0
        self.max_age_s = max_age_s
        self._clock = clock

    def _key(self, topic: str, create_time_ms: int) -> Key:
        if self.max_age_s is not None:
            now_ms = int(self._clock() * 1000)
            oldest_ms = now_ms - int(self.max_age_s * 1000)
            create_time_ms = min(max(create_time_ms, oldest_ms), now_ms + MAX_AHEAD_S * 1000)
        return (topic, window_start(create_time_ms))

    def watch(
        self,
        on_change: Callable[[list[tuple[Key, int, int]]], None],
        after_snapshot: Callable[[dict[Key, tuple[int, int]]], None],
    ) -> None:
        """Set ``on_change`` and ``after_snapshot`` (see the constructor)."""
        with self._lock:
            self._on_change = on_change
            self._after_snapshot = after_snapshot

    def add(self, topic: str, create_time_ms: int, messages: int, lines: int) -> None:
        self.add_many([(topic, create_time_ms, messages, lines)])

    def add_many(self, items: list[tuple[str, int, int, int]]) -> None:
        """:meth:`add` of each ``(topic, create time, messages, lines)``, in one step."""
        changes = [
            (self._key(topic, create_time_ms), messages, lines)
            for topic, create_time_ms, messages, lines in items
        ]
        with self._lock:
            for key, messages, lines in changes:
                counts = self._counts.get(key)
                if counts is None:
                    self._counts[key] = [messages, lines]
                else:
                    counts[0] += messages
                    counts[1] += lines
            if self._on_change is not None:
                self._on_change(changes)

    def add_chunk(
        self, topic: str, create_time_ms: int, codec: str, data: bytes | memoryview
    ) -> None:
        """One message of ``topic``; its lines counted now (raw) or at the next snapshot."""
        if codec == "raw" or self._deferred_bytes + len(data) > MAX_DEFERRED_BYTES:
            self.add(topic, create_time_ms, 1, count_lines(codec, data))
            return
        key = self._key(topic, create_time_ms)
        with self._lock:
            self._deferred.append((key, codec, data))
            self._deferred_bytes += len(data)

    def set(self, topic: str, window: int, messages: int, lines: int) -> None:
        """Replace a key's totals (tiers whose counts come from a durable place)."""
        with self._lock:
            self._counts[(topic, window)] = [messages, lines]

    def snapshot(self) -> dict[Key, tuple[int, int]]:
        """Every key's (messages, lines) so far; counts deferred chunks first."""
        with self._lock:
            deferred, self._deferred, self._deferred_bytes = self._deferred, [], 0
        counted = [(key, count_lines(codec, data)) for key, codec, data in deferred]
        with self._lock:
            for key, lines in counted:
                counts = self._counts.setdefault(key, [0, 0])
                counts[0] += 1
                counts[1] += lines
            if counted and self._on_change is not None:
                self._on_change([(key, 1, lines) for key, lines in counted])
            totals = {key: (c[0], c[1]) for key, c in self._counts.items()}
            if self._after_snapshot is not None:
                self._after_snapshot(totals)
            return totals

    def forget_before(self, window: int) -> list[Key]:
        """Drop the keys of windows starting before ``window``; the keys dropped."""
        with self._lock:
            gone = [key for key in self._counts if key[1] < window]
            for key in gone:
                del self._counts[key]
            return gone
