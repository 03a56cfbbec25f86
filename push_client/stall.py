"""Whether the gateways still answer: when a one-shot run (``--idle-exit``) gives up.

A daemon retries for ever: the data waits in its files, and the gateway comes back.  A one-shot
run (a cron job, CI) must end instead: when no gateway has answered a request for a while and
every request in that time failed (no connection, a timeout, a retryable status such as 503),
it saves the acknowledged positions and exits 1, and a rerun with the same state dir resumes
there.  A gateway that is slow but answers is not failing: a request that may still be
answered holds the verdict back, for one request timeout at most (after that it has failed
too).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable


class StallWatch:
    """Answers and failures of requests to gateways, from every sender thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._attempts: dict[int, float] = {}
        """Attempts in progress: id -> when they started (monotonic)."""
        self.failing_since: float | None = None
        """When the first request failed since a gateway last answered (None: none did)."""
        self.last_failure = ""
        """The last failure, as logged (``URL: ConnectError: ...``)."""
        self._last_failure_at = 0.0

    def started(self) -> int:
        """An attempt (one HTTP request) begins; pass the id to :meth:`ended`."""
        with self._lock:
            attempt = next(self._ids)
            self._attempts[attempt] = self._clock()
            return attempt

    def ended(self, attempt: int, failure: str | None) -> None:
        """The attempt got an answer (``failure`` None: a 200, or a refusal: the gateway
        works) or failed (``failure`` says how)."""
        with self._lock:
            self._attempts.pop(attempt, None)
            if failure is None:
                self.failing_since = None
                return
            now = self._clock()
            if self.failing_since is None:
                self.failing_since = now
            self.last_failure, self._last_failure_at = failure, now

    def answered(self) -> None:
        """A gateway answered a request made outside :meth:`started` (one attempt at a
        partition's owner)."""
        with self._lock:
            self.failing_since = None

    def dropped(self, attempt: int) -> None:
        """The attempt ended with no verdict on the gateway (the client is stopping)."""
        with self._lock:
            self._attempts.pop(attempt, None)

    def stalled(
        self, now: float, *, after_s: float, connect_s: float, request_timeout_s: float
    ) -> str | None:
        """The last failure if requests have failed for ``after_s`` with no answer since,
        else None.

        An attempt in progress that may still be answered holds the verdict back: one made
        after the last failure, or one in progress for longer than connecting may take
        (``connect_s``: a gateway took it, and answers slowly).  It holds it until
        ``after_s + request_timeout_s`` after the first failure at most (by then it failed).
        """
        with self._lock:
            since = self.failing_since
            if since is None or now - since < after_s:
                return None
            last = self._last_failure_at
            waiting = any(
                start > last or now - start > connect_s for start in self._attempts.values()
            )
            if waiting and now - since < after_s + request_timeout_s:
                return None
            return self.last_failure
