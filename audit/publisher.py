"""The flusher: a tier instance's counts published to the audit topic every few seconds.

Only keys whose totals changed since the last publication are written.  Every write is a chunk
of the instance's own source (:func:`audit.records.audit_source_id`) with a seqno above every
earlier one (microseconds of the clock, or one above the log's last seqno), through the same
exactly-once write path as log data: a resent chunk is a duplicate, and since every record is a
cumulative total a replay could not double count anyway.  A failed write is retried at the
next flush; nothing on the tier's data path waits for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from audit.records import CountRecord, audit_source_id, encode_records
from audit.windows import Key, WindowCounts, window_start

_log = logging.getLogger("logbroker.audit")

DEFAULT_INTERVAL_S = 10.0
DEFAULT_STOP_TIMEOUT_S = 10.0
"""How long a stop waits for the publishes it owes, unless told otherwise: a log that answers
takes a publish in well under a second (also one that creates the audit topic); one that
does not would hold a stopping daemon for its own timeouts, several of them for one write
(a gateway's Kafka calls each take up to its ``operation_timeout_s``)."""
RECORDS_PER_CHUNK = 400


class AuditSink(Protocol):
    def write(self, source_id: str, seqno: int, data: bytes) -> tuple[bool, int]:
        """Write one chunk; returns (written, the source's last seqno in the log).

        ``written`` False: the log holds a higher seqno already (a clock that went back);
        the publisher writes again above it.  Raises on failure.
        """
        ...


class AuditPublisher:
    """Publishes ``counts`` as tier ``tier``, instance ``instance``."""

    def __init__(
        self,
        tier: str,
        instance: str,
        counts: WindowCounts,
        sink: AuditSink,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        before_publish: Callable[[], None] | None = None,
        more_tiers: Callable[[], dict[str, WindowCounts]] | None = None,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        forget_after_s: float | None = None,
        kept_for_next: str = "",
    ) -> None:
        self.tier = tier
        self.forget_after_s = forget_after_s
        """Windows of ``counts`` that started this long ago are dropped once published: the
        counts must take no create time that old (``WindowCounts(max_age_s=...)`` below it)."""
        self.instance = instance
        self.counts = counts
        self.sink = sink
        self.interval_s = interval_s
        self.stop_timeout_s = stop_timeout_s
        self.kept_for_next = kept_for_next
        """Where counts a stop could not publish are kept for the next process to publish
        (the push-client's state dir), if anywhere: then they are late, not missing."""
        self._before_publish = before_publish
        self._more_tiers = more_tiers
        """Other tiers counted in the same process, published in the same source."""
        self._source_id = audit_source_id(tier, instance)
        self._published: dict[tuple[str, Key], tuple[int, int]] = {}
        self._last_seqno = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed_at = float("-inf")
        """When a publish last failed (``time.monotonic()``)."""
        self._failure = ""
        """Why it failed."""
        self.disabled = ""
        """Why publishing stopped for good (the token may not write the audit log type)."""

    def _next_seqno(self) -> int:
        self._last_seqno = max(self._last_seqno + 1, time.time_ns() // 1000)
        return self._last_seqno

    def publish(self) -> int:
        """Write every changed total now; returns how many records were written."""
        with self._lock:
            if self._before_publish is not None:
                self._before_publish()
            tiers = {self.tier: self.counts, **(self._more_tiers() if self._more_tiers else {})}
            snapshot = {
                (tier, key): value
                for tier, counts in tiers.items()
                for key, value in counts.snapshot().items()
            }
            changed = [(k, v) for k, v in sorted(snapshot.items()) if self._published.get(k) != v]
            now_ms = int(time.time() * 1000)
            for i in range(0, len(changed), RECORDS_PER_CHUNK):
                part = changed[i : i + RECORDS_PER_CHUNK]
                data = encode_records(
                    CountRecord(tier, self.instance, topic, window, m, lines, now_ms)
                    for (tier, (topic, window)), (m, lines) in part
                )
                written, last = self.sink.write(self._source_id, self._next_seqno(), data)
                if not written:
                    self._last_seqno = max(self._last_seqno, last)
                    written, last = self.sink.write(self._source_id, self._next_seqno(), data)
                    if not written:
                        raise RuntimeError(f"audit records of {self._source_id} not written")
                self._published.update(part)
            if self.forget_after_s is not None:
                oldest = window_start(now_ms - int(self.forget_after_s * 1000))
                for key in self.counts.forget_before(oldest):
                    self._published.pop((self.tier, key), None)
            return len(changed)

    def all_published(self) -> bool:
        """Whether the log holds the totals of every tier published here as they are now
        (False while a publish holds the lock: a stop whose last publish hangs has not
        published them)."""
        if not self._lock.acquire(timeout=0.5):
            return False
        try:
            tiers = {self.tier: self.counts, **(self._more_tiers() if self._more_tiers else {})}
            return all(
                self._published.get((tier, key)) == value
                for tier, counts in tiers.items()
                for key, value in counts.snapshot().items()
            )
        finally:
            self._lock.release()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._publish_logged()

    def _publish_logged(self, *, last: bool = False) -> None:
        if self.disabled:
            return
        try:
            self.publish()
        except PermissionError as exc:
            self.disabled = str(exc)
            _log.warning("audit: the %s counts are not published: %s", self.tier, exc)
        except Exception as exc:
            self._failed_at = time.monotonic()
            self._failure = str(exc)
            if last:
                _log.warning("%s: %s", self._not_published(), exc)
            elif not self._stop.is_set():
                _log.warning(
                    "audit: publishing the %s counts failed (retried later): %s", self.tier, exc
                )
            # else: a stop is waiting for this publish, and says that it failed

    def _not_published(self) -> str:
        """The start of the one line that says the last publish did not happen: what the
        stop loses is what was counted since the last publication that got through."""
        if self.kept_for_next:
            return (
                f"audit: the last {self.tier} counts are not published yet (not retried: "
                f"stopping); they are kept in {self.kept_for_next}, and the next start with it "
                "publishes them"
            )
        return (
            f"audit: the last {self.tier} counts are not published (not retried: stopping); "
            f"what this instance counted since its last publication is missing from the audit"
        )

    def start(self) -> AuditPublisher:
        self._thread = threading.Thread(target=self._loop, name=f"audit-{self.tier}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the flusher and publish what is left, taking at most ``timeout_s`` (by
        default ``stop_timeout_s``).

        A gateway that hangs must not hold a stopping daemon past its own shutdown deadline:
        the last publish is given what is left of ``timeout_s`` and then left to itself (what
        it would have added is then missing from the audit, logged in one line: the next
        incarnation is a new instance counting from zero).  Nor does a
        log that cannot be reached hold it twice: if the flusher's publish under way when the
        stop came failed, or has not finished within ``timeout_s``, the stop does not try
        again.
        """
        if timeout_s is None:
            timeout_s = self.stop_timeout_s
        asked = time.monotonic()
        deadline = asked + timeout_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            if self._thread.is_alive():
                _log.warning(
                    "%s: the publish under way at the stop did not end within %g s",
                    self._not_published(),
                    timeout_s,
                )
                return
            if self._failed_at >= asked:
                _log.warning(
                    "%s: the publish under way at the stop failed: %s",
                    self._not_published(),
                    self._failure,
                )
                return
        last = threading.Thread(
            target=self._publish_logged,
            kwargs={"last": True},
            name=f"audit-{self.tier}-last",
            daemon=True,
        )
        last.start()
        last.join(timeout=max(0.0, deadline - time.monotonic()))
        if last.is_alive():
            _log.warning(
                "%s: the log did not take them within %g s", self._not_published(), timeout_s
            )


INTERVAL_ENV = "LOGBROKER_AUDIT_INTERVAL_S"


def interval_from_env() -> float:
    """The flush interval: ``$LOGBROKER_AUDIT_INTERVAL_S`` (seconds), else the default."""
    raw = os.environ.get(INTERVAL_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value > 0 else DEFAULT_INTERVAL_S
