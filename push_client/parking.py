"""Files the gateway refuses are parked, so that one bad file never holds back the host.

A refusal (a 4xx for a file's section or session: a log type the token may not write, a name
the gateway rejects, a chunk over its limit) says the same request sent again will fail the
same way.  The file is *parked*: it is neither read nor sent, its unsent chunks are dropped
(they are read again from the file later, so nothing is lost), and every other file keeps
shipping.  A parked file is tried again by itself every ``park_retry_s``, at once when the
token or the configuration changes, and it resumes from the gateway's last seqno for it, so
no line is lost or sent twice.  The reason shows in ``--status``, in the metrics, and once a
minute in the log.

A refusal of a whole request that carried several files cannot be pinned on one of them: each
of its files is then sent *alone* until the culprit is found and parked.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from push_client.tailer import TailedFile

log = logging.getLogger("logbroker.push")

LOG_EVERY_S = 60.0
_DURATION = re.compile(r"\b\d+(?:\.\d+)? s\b")


def same_refusal(said: str, before: str) -> bool:
    """Whether two refusals, as said, differ at most in the durations they state: a gateway
    saying its partition's owner "has refused every connection for 8.3 s", then "for 9.2 s",
    says one thing, which the log says once."""
    return _DURATION.sub("N s", said) == _DURATION.sub("N s", before)


@dataclass(frozen=True)
class Refusal:
    """What the gateway said: HTTP status, short error code and reason."""

    status: int
    error: str
    reason: str

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.error}: {self.reason}"

    @classmethod
    def from_result(cls, result: dict[str, object]) -> Refusal:
        status = result.get("status", 400)
        return cls(
            status if isinstance(status, int) else 400,
            str(result.get("error", "")),
            str(result.get("reason", ""))[:500],
        )

    @property
    def token_related(self) -> bool:
        """A refusal a new token may cure (401 unknown token, 403 not allowed)."""
        return self.status in (401, 403)


@dataclass
class Parked:
    refusal: Refusal
    since: float
    """Wall-clock time the file was parked (shown in ``--status``)."""
    retry_at: float
    """Monotonic time of the next try."""


class ParkingLot:
    """Parks and releases files; the daemon asks it which parked files are due again."""

    def __init__(self, retry_s: float) -> None:
        self.retry_s = retry_s
        self.parked_total = 0
        self._next_report = 0.0

    def park(self, tailed: TailedFile, refusal: Refusal, now: float, wall: float) -> int:
        """Park ``tailed``; return the bytes of unsent chunks dropped (read again later)."""
        first = tailed.parked is None or tailed.parked.refusal != refusal
        since = wall if tailed.parked is None else tailed.parked.since
        tailed.parked = Parked(refusal, since, now + self.retry_s)
        # A refusal that might have passed (a 429, shown as RETRYING) is history now: the
        # status shows one reason, the one that holds the file.
        tailed.session_refusal = ""
        tailed.alone = False
        tailed.session_ready = False
        self.parked_total += first
        if first:
            log.error(
                "parked %s (source %s): the gateway refused it: %s; the other files go on, "
                "this one is tried again in %.0f s or when the token or config changes",
                tailed.path,
                tailed.source_id,
                refusal,
                self.retry_s,
            )
        return tailed.drop_pending()

    def release(self, tailed: TailedFile, why: str) -> None:
        """Let ``tailed`` try again: it opens a session and resumes from the gateway's seqno."""
        if tailed.parked is None:
            return
        log.info("trying parked %s again (%s)", tailed.path, why)
        tailed.parked = None
        tailed.session_ready = False

    def release_due(self, files: Iterable[TailedFile], now: float) -> None:
        for tailed in files:
            if tailed.parked is not None and now >= tailed.parked.retry_at:
                self.release(tailed, f"retry every {self.retry_s:.0f} s")

    def release_all(self, files: Iterable[TailedFile], why: str, *, token_only: bool) -> None:
        for tailed in files:
            if tailed.parked is not None and (
                not token_only or tailed.parked.refusal.token_related
            ):
                self.release(tailed, why)

    def report(self, files: Iterable[TailedFile], now: float) -> None:
        """Once a minute while any file is parked: which, and why."""
        if now < self._next_report:
            return
        parked = [t for t in files if t.parked is not None]
        if not parked:
            return
        self._next_report = now + LOG_EVERY_S
        reasons = "; ".join(f"{t.path}: {t.parked.refusal}" for t in parked[:20] if t.parked)
        more = f" (and {len(parked) - 20} more)" if len(parked) > 20 else ""
        log.error("%d files parked, not shipping: %s%s", len(parked), reasons, more)
