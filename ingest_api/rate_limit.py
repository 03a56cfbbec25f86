"""Per-source rate limits: a token bucket of chunks per second for each source.

A request is admitted only if every source in it is within its rate; then all its sources are
charged at once, so a 429 charges nothing and writes nothing.  A bucket that is full admits a
request larger than the burst (it goes into debt), so big batches work and the average rate
still holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterable

_MAX_BUCKETS = 200_000


class SourceRateLimiter:
    """Token buckets per source key; ``rate`` chunks per second, ``burst`` chunks deep."""

    def __init__(self, rate: float, burst: int = 0) -> None:
        self.rate = rate
        self.capacity = float(burst) if burst > 0 else max(rate, 1.0)
        self._buckets: dict[Hashable, tuple[float, float]] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def admit(self, demands: Iterable[tuple[Hashable, int]]) -> float | None:
        """Charge each source its chunks if all can pay; else the seconds to wait."""
        if not self.enabled:
            return None
        now = time.monotonic()
        with self._lock:
            levels: dict[Hashable, float] = {}
            wanted: dict[Hashable, int] = {}
            for key, chunks in demands:
                wanted[key] = wanted.get(key, 0) + chunks
            wait = 0.0
            for key, chunks in wanted.items():
                level, stamp = self._buckets.get(key, (self.capacity, now))
                level = min(self.capacity, level + (now - stamp) * self.rate)
                levels[key] = level
                if level < min(chunks, self.capacity):
                    wait = max(wait, (min(chunks, self.capacity) - level) / self.rate)
            if wait > 0:
                return wait
            if len(self._buckets) > _MAX_BUCKETS:
                # idle buckets are full anyway; dropping them forgets nothing that matters
                self._buckets = {
                    k: v for k, v in self._buckets.items() if now - v[1] < self.capacity / self.rate
                }
            for key, chunks in wanted.items():
                self._buckets[key] = (levels[key] - chunks, now)
            return None
