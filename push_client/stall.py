"""Whether the gateways still answer: when a one-shot run (``--idle-exit``) gives up.

A daemon retries for ever: the data waits in its files, and the gateway comes back.  A one-shot
run (a cron job, CI) must end instead: when no gateway has answered a request for a while and
every request in that time failed (no connection, a timeout, a retryable status such as 503),
it saves the acknowledged positions and exits 1, and a rerun with the same state dir resumes
there.  A gateway that is slow but answers is not failing: a request it accepted and may still
answer holds the verdict back, for one request timeout at most (after that the request has
failed too).
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
            if self.failing_since is None:
                self.failing_since = self._clock()
            self.last_failure = failure

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

        An attempt in progress for longer than connecting may take (``connect_s``) reached a
        gateway that may still answer (slowly): it holds the verdict back, until
        ``after_s + request_timeout_s`` after the first failure (by then it failed as well).
        """
        with self._lock:
            since = self.failing_since
            if since is None or now - since < after_s:
                return None
            waiting = any(now - start > connect_s for start in self._attempts.values())
            if waiting and now - since < after_s + request_timeout_s:
                return None
            return self.last_failure
