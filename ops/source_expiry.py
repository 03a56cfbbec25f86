"""The source expiry watchdog: forgets idle sources on a timer (see
:mod:`session_dedup.source_expiry`), in the gateway's parent process, like retention."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from log_store import LogbrokerError, LogStore
from session_dedup.source_expiry import ExpiryPass, SourceExpiry

log = logging.getLogger("logbroker.source_expiry")

MAX_INTERVAL_S = 600.0


def pass_interval_s(idle_s: float) -> float:
    """How often to look: a quarter of the expiry, at most every 10 minutes."""
    return min(max(idle_s / 4, 0.05), MAX_INTERVAL_S)


class SourceExpiryWatchdog:
    """A daemon thread that runs :meth:`SourceExpiry.run_once` every ``pass_interval_s``."""

    def __init__(
        self,
        store: LogStore,
        idle_s: float,
        on_pass: Callable[[ExpiryPass], None] = lambda _p: None,
    ) -> None:
        self._expiry = SourceExpiry(store, idle_s)
        self._interval_s = pass_interval_s(idle_s)
        self._on_pass = on_pass
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="logbroker-source-expiry", daemon=True
        )

    @property
    def supported(self) -> bool:
        return self._expiry.supported

    def start(self) -> SourceExpiryWatchdog:
        if not self._expiry.supported:
            log.warning("this store cannot list its sources: idle sources do not expire")
            return self
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                done = self._expiry.run_once()
            except LogbrokerError as exc:
                log.warning("source expiry pass failed: %s", exc)
                continue
            except Exception:
                # The next pass may well succeed (a store closing at shutdown, a sick disk).
                log.exception("source expiry pass failed")
                continue
            if done.expired:
                log.info(
                    "forgot %d sources idle for %.0f s", done.expired, self._expiry.idle_ms / 1000
                )
            self._on_pass(done)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
