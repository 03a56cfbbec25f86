"""A one-line progress bar on a terminal while a backlog is being caught up."""

from __future__ import annotations

import time
from typing import TextIO

_SHOW_ABOVE_BYTES = 16 * 1024 * 1024
_WIDTH = 30


class ProgressBar:
    """Shown while the backlog is large; cleared once it is caught up."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._start_acked: int | None = None
        self._start_time = 0.0
        self._shown = False

    def update(self, acked_bytes: int, backlog_bytes: int) -> None:
        if self._start_acked is None:
            if backlog_bytes < _SHOW_ABOVE_BYTES:
                return
            self._start_acked = acked_bytes
            self._start_time = time.monotonic()
        done = acked_bytes - self._start_acked
        total = done + backlog_bytes
        fraction = done / total if total else 1.0
        elapsed = max(1e-6, time.monotonic() - self._start_time)
        rate = done / elapsed / 1e6
        filled = int(fraction * _WIDTH)
        bar = "#" * filled + "." * (_WIDTH - filled)
        self._stream.write(
            f"\rcatching up [{bar}] {fraction * 100:5.1f}%  {rate:7.1f} MB/s  "
            f"lag {backlog_bytes / 1e6:9.1f} MB "
        )
        self._stream.flush()
        self._shown = True
        if backlog_bytes < _SHOW_ABOVE_BYTES // 16:
            self.finish()

    def finish(self) -> None:
        if self._shown:
            self._stream.write("\n")
            self._stream.flush()
        self._shown = False
        self._start_acked = None
