"""The retention watchdog: applies every topic's retention on a timer.

Retention drops whole segments (see ``LogStore.apply_retention``), so a pass costs a few small
SQLite transactions and unlinks; it is safe to run in several processes at once.
"""

from __future__ import annotations

import logging
import threading

from log_store import LogbrokerError, LogStore

log = logging.getLogger("logbroker.retention")

DEFAULT_INTERVAL_S = 60.0


class RetentionWatchdog:
    """A daemon thread that calls ``store.apply_retention()`` every ``interval_s`` seconds."""

    def __init__(self, store: LogStore, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self._store = store
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="logbroker-retention", daemon=True)

    def start(self) -> RetentionWatchdog:
        self._thread.start()
        return self

    def run_once(self) -> dict[tuple[str, int], int]:
        moved = self._store.apply_retention()
        for (topic, partition), start in sorted(moved.items()):
            log.info("retention: %s partition %d now starts at offset %d", topic, partition, start)
        return moved

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.run_once()
            except LogbrokerError as exc:
                log.warning("retention pass failed: %s", exc)
            except Exception:
                # The next pass may well succeed (a store closing at shutdown, a sick disk);
                # the watchdog itself must not die.
                log.exception("retention pass failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
