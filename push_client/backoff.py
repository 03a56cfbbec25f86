"""Exponential backoff with jitter: a request's retries, and the probes of what keeps failing.

A request is retried with :class:`Backoff`.  A gateway or an installation that fails while no
request tries it is probed on a :class:`ProbeSchedule`: the wait between two probes of one
target doubles from ``probe_interval_s`` up to ``probe_max_interval_s`` and starts again from
``probe_interval_s`` once it answers, so a fleet of clients asks a half-alive gateway about
once a minute each, not every 2 s, and the jitter keeps them from asking in lock step.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

CLOSE_WAIT_S = 0.5
"""How long a stopping client waits, all together, for the threads that only look or show
(probes of installations and gateways, the lag report) to end: one waiting for a gateway that
hangs is left to itself, its finding dropped."""


class Backoff:
    """Exponential backoff with jitter: ``uniform(ceiling / 2, ceiling)``, where the ceiling
    is ``min(cap, base * 2**attempt)`` and ``attempt`` counts the delays drawn."""

    def __init__(self, base_s: float = 0.05, cap_s: float = 5.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0

    def next_delay(self, at_least_s: float = 0.0) -> float:
        ceiling = min(self.cap_s, self.base_s * (2**self.attempt))
        self.attempt += 1
        return max(at_least_s, random.uniform(ceiling / 2, ceiling))


@dataclass
class _Probed:
    """One failing target: its waits so far and when it is probed next."""

    backoff: Backoff
    wait_s: float
    """The wait drawn last."""
    due_at: float
    """Monotonic time of the next probe."""
    due_wall: float
    """The same instant on the wall clock, for the status: read with ``due_at``'s clock, once.
    Converted again at each status write instead, it came out a few microseconds off each
    time (two clocks read one after the other), and a status is rewritten only when what it
    shows changed."""


class ProbeSchedule:
    """When to probe each failing target (a gateway's URL, an installation's name) next;
    thread-safe.

    Each failed try makes the next wait ``uniform(w / 2, w)``, where ``w`` doubles from
    ``base_s`` (the first wait) up to ``cap_s`` (a ``cap_s`` below ``base_s`` is ``base_s``:
    the wait stays there); a target that answers is forgotten, so its next failure starts
    again from ``base_s``.  A try counts whoever made it: a request that went to the target
    anyway (failover) is a try as good as a probe.  Only a try made when the probe was due
    doubles the wait; an earlier one (a request, or the burst of requests in flight when the
    target failed) starts the same wait again, so that ten requests failing at once are one
    try, not ten doublings.
    """

    def __init__(
        self,
        base_s: float,
        cap_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_s = base_s
        self.cap_s = max(base_s, cap_s)
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._targets: dict[str, _Probed] = {}

    def failed(self, key: str) -> float:
        """A try at ``key`` failed: return the seconds until it is to be probed next."""
        now, wall = self._clock(), self._wall_clock()
        with self._lock:
            known = self._targets.get(key)
            if known is None:
                backoff = Backoff(self.base_s, self.cap_s)
                wait_s = backoff.next_delay()
                self._targets[key] = _Probed(backoff, wait_s, now + wait_s, wall + wait_s)
                return wait_s
            if now >= known.due_at:
                known.wait_s = known.backoff.next_delay()
            known.due_at, known.due_wall = now + known.wait_s, wall + known.wait_s
            return known.wait_s

    def next_probe_at(self, key: str) -> float | None:
        """Wall-clock time ``key`` is due to be probed (None if it is not failing): what a
        status shows, so that the schedule is the one record of it."""
        with self._lock:
            probed = self._targets.get(key)
            return None if probed is None else probed.due_wall

    def answered(self, key: str) -> None:
        """``key`` answered: its next failure waits ``base_s`` again."""
        with self._lock:
            self._targets.pop(key, None)

    def due(self, keys: Iterable[str]) -> list[str]:
        """Those of ``keys`` to probe now (one not known as failing is: nothing holds it)."""
        now = self._clock()
        with self._lock:
            return [k for k in keys if (p := self._targets.get(k)) is None or p.due_at <= now]

    def until_due(self, keys: Iterable[str], longest_s: float) -> float:
        """Seconds until the first of ``keys`` is due (0 if one is), at most ``longest_s``:
        how long a prober may sleep (it also wakes after ``longest_s`` to see targets that
        began to fail, or stopped being tried by requests, meanwhile)."""
        now = self._clock()
        wait_s = longest_s
        with self._lock:
            for key in keys:
                probed = self._targets.get(key)
                wait_s = min(wait_s, 0.0 if probed is None else max(0.0, probed.due_at - now))
        return wait_s
