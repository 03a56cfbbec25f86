"""Whether a gateway on Kafka can take writes now: what ``/readyz`` answers.

A metadata request that a broker answers says Kafka takes requests.  One request that is not
answered does not say the opposite: right after one broker of three dies, librdkafka may
have sent it to that broker, or wait for a connection to another, and it times out.  A
reviewer saw every live gateway answer 503 for 2-7 s at once after a single broker of three
was SIGKILLed, while writes went on (replication factor 3, ``min.insync.replicas`` 2): behind
a load balancer routing by readiness, or for push-clients that probe ``/readyz`` to choose an
installation, the loss of one broker was a full outage.

So a look that is not answered asks once more (librdkafka picks a broker again), and a look
that fails twice makes the gateway not ready only if Kafka has said nothing to it for
:data:`GRACE_S` (no look answered, no commit of a partition owner here), or a write failed
for want of Kafka since Kafka last said something, or Kafka is known to be away: a client of
the store lost every broker since Kafka last answered (librdkafka's ``_ALL_BROKERS_DOWN``:
connections refused or broken, the whole cluster stopped or the way to it cut; no broker of
three dying does that, the clients still have the others).  A look that makes the gateway not
ready makes Kafka away for the whole store too (see :mod:`log_store.kafka.outage`: its
routes then answer 503 at once, until a look is answered); the store's watch usually finds a
lost cluster first, so ``/readyz`` turns 503 within about 2 s of a cut, and 200 again within
about 2 s of Kafka's return.  Leader elections after a broker's death take 5-10 s on the test
cluster, during which writes wait and then go on; a gateway whose writes fail, or which hears
nothing from Kafka for longer, is not ready, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from log_store.errors import LogbrokerError
from log_store.kafka.outage import KafkaOutage

log = logging.getLogger(__name__)

GRACE_S = 10.0
"""How long after Kafka last answered this gateway failed looks alone leave it ready."""
LOOK_S = 1.2
"""What one look may take in all, about (``/readyz`` waits 2 s for the store's answer, and
an ask may take a few tenths of a second longer than its timeout on a busy machine)."""
_FIRST_ASK_S = 0.8
_LAST_ASK_MIN_S = 0.2


class WriteOutcomes(Protocol):
    """When the partition owners of this process last committed, and last failed to."""

    @property
    def committed_at(self) -> float:
        """``time.monotonic()`` of the last commit (``-inf``: none yet)."""
        ...

    @property
    def refused_at(self) -> float:
        """``time.monotonic()`` of the last commit or takeover that failed for want of
        Kafka (``-inf``: none)."""
        ...


class WriteReadiness:
    """Says why this gateway cannot take writes now (None: it can), from a look at Kafka
    (``ask(timeout_s)``, raising ``LogbrokerError`` when no broker answered in time) and the
    owners' last outcomes (``writes``)."""

    def __init__(
        self,
        ask: Callable[[float], object],
        writes: WriteOutcomes,
        outage: KafkaOutage | None = None,
        *,
        grace_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ask = ask
        self._writes = writes
        self._outage = outage
        self._grace_s = GRACE_S if grace_s is None else grace_s
        self._clock = clock
        self._answered_at = float("-inf")
        self._doubting = False

    def reason(self) -> str | None:
        started = self._clock()
        try:
            self._ask(_FIRST_ASK_S)
        except LogbrokerError:
            try:
                self._ask(max(_LAST_ASK_MIN_S, LOOK_S - (self._clock() - started)))
            except LogbrokerError as exc:
                return self._unanswered(exc)
        self._answered_at = self._clock()
        if self._outage is not None:
            self._outage.answered()
        if self._doubting:
            self._doubting = False
            log.info("Kafka answers this gateway's readiness look again")
        return None

    def _unanswered(self, failure: LogbrokerError) -> str | None:
        now = self._clock()
        heard_at = max(self._answered_at, self._writes.committed_at)
        known = self._outage is not None and (
            self._outage.away() is not None or self._outage.all_down_since_answer()
        )
        if now - heard_at < self._grace_s and self._writes.refused_at < heard_at and not known:
            if not self._doubting:
                self._doubting = True
                log.info(
                    "Kafka did not answer this gateway's readiness look (%s); still ready: "
                    "it answered %.1f s ago and no write failed since",
                    failure,
                    now - heard_at,
                )
            return None
        if self._outage is not None:
            self._outage.unanswered(failure)
            away = self._outage.away()
            if away is not None:
                return f"Kafka does not answer: {away}"
        return f"Kafka does not answer: {failure}"
