"""Whether Kafka is away from this process, known without waiting, and what its librdkafka
clients say about it.

Every librdkafka client of a running gateway (its group member, readers, append tail,
watermarks and snapshot consumers, admin clients, the owners' directory, the partition
writers) is made with its settings' :class:`ClientLines` (``KafkaSettings.lines``) as its
``logger`` and ``error_cb`` (see ``KafkaSettings.client_base``).  librdkafka's own lines go
to the Python logger ``log_store.kafka.librdkafka`` at DEBUG (its fatal ones at their
level); a client that lost every broker says so (``_ALL_BROKERS_DOWN``), and the last reason
a connection failed is kept.  While Kafka was away those clients printed each failed
connection on stderr, 25-40 lines a second from one gateway, which buried the gateway's own
lines.

:class:`KafkaOutage` is a store's view of it: a client that lost every broker, then a look
at the cluster's metadata that no broker answered, makes Kafka *away* at once (no broker of
three dying does that: the client still has the others).  So does ``/readyz``'s look when
Kafka has not answered for its grace (a network that drops packets, where no connection is
refused).  While it is away, a thread asks Kafka again and again (each ask waits up to
:data:`LOOK_S` for a broker); the first answer ends it.
Meanwhile ``/readyz`` and the routes that ask Kafka for metadata answer 503 at once
instead of after ``operation_timeout_s``, and the gateway's log says it is away when it
finds out, every :data:`SAY_EVERY_S` after, and when it is back.  Writes are not refused by
it: they go to their partition's owner as before, and fail (503) or succeed as Kafka says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError

from log_store.errors import LogbrokerError

log = logging.getLogger(__name__)
RAW = logging.getLogger("log_store.kafka.librdkafka")
"""Where librdkafka's own lines go (at DEBUG, its fatal ones at their level)."""

TICK_S = 0.5
"""How often the watch serves its clients' lines (and looks whether a client lost every
broker)."""
LOOK_S = 1.0
"""What one ask of the watch may take.  While Kafka is away the asks follow each other
:data:`AWAY_PAUSE_S` apart: an ask waits for a broker to answer, which librdkafka's client
tries to connect to every 0.5-1 s meanwhile, so the first answer after Kafka's return ends
it."""
AWAY_PAUSE_S = 0.1
FAILING_S = 5.0
"""How long librdkafka must have reported failures, while Kafka answers, before the log says
so (a cut is found to be one within about 2 s: not said as a broker away first)."""
_QUIET_S = 3.0
"""No failure reported for this long: the failures ended."""
SAY_EVERY_S = 30.0
"""How often the log says again that Kafka is away (or that librdkafka reports failures
while Kafka answers), while it lasts."""


def failure_reason(line: str) -> str:
    """``Connect to ipv4#127.0.0.1:9 failed: Connection refused`` out of a librdkafka line
    ``FAIL [name] [thrd:...]: 127.0.0.1:9/bootstrap: Connect to ... (after 0ms in state
    CONNECT)``."""
    text = line.rsplit("]: ", 1)[-1]
    broker, sep, rest = text.partition(": ")
    if sep and "/" in broker:
        text = rest
    return text.split(" (after ", 1)[0].strip()


class ClientLines:
    """The ``logger`` and ``error_cb`` of every librdkafka client made from one
    ``KafkaSettings`` (a gateway's store and group): the lines to the debug log, the last
    failure and when a client lost every broker kept.  Lines and errors reach it when their
    client is polled.  A copy in another process (pickled) starts afresh."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.last_failure: str | None = None
        """The last reason librdkafka gave for a failure (``Connect to ... failed: ...``)."""
        self.failures = 0
        """How many failure lines and errors librdkafka reported in all."""
        self.all_down_at = float("-inf")
        """``clock()`` when a client last said it lost every broker (``-inf``: never)."""

    def __reduce__(self) -> tuple[type[ClientLines], tuple[()]]:
        return (ClientLines, ())

    def log(self, level: int, msg: str, *args: object) -> None:
        text = (msg % args) if args else msg
        RAW.log(level if level >= logging.CRITICAL else logging.DEBUG, "%s", text)
        if level >= logging.ERROR:
            self._failed(failure_reason(text))

    def error(self, error: KafkaError) -> None:
        RAW.debug("error: %s", error.str())
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            with self._lock:
                self.all_down_at = self._clock()
            return
        if error.fatal():
            # not an outage: said as it is (a group member's fatal error comes from ``poll``,
            # and a partition writer's is handled by its owner)
            log.error("librdkafka: fatal error: %s", error.str())
        self._failed(failure_reason(error.str()))

    def _failed(self, reason: str) -> None:
        with self._lock:
            self.last_failure = reason
            self.failures += 1


class KafkaOutage:
    """Whether Kafka is away from this store's process (see the module's docstring).

    ``ask(timeout_s)`` looks at the cluster (raises ``LogbrokerError`` when no broker
    answered); ``serve`` are the calls that hand the lines of clients nobody polls otherwise
    to their ``logger`` (an admin client, a consumer that is never assigned anything)."""

    def __init__(
        self,
        ask: Callable[[float], object],
        serve: Sequence[Callable[[], None]] = (),
        *,
        lines: ClientLines | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ask = ask
        self._serve = list(serve)
        self._lines = lines or ClientLines()
        self._clock = clock
        self._lock = threading.Lock()
        self._answered_at = clock()
        self._away_since: float | None = None
        self._why = ""
        self._said_at = float("-inf")
        self._failures_said = self._lines.failures
        self._back_at = float("-inf")
        self._failing_since: float | None = None
        self._failures_seen = self._lines.failures
        self._grew_at = float("-inf")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the store and its readiness ask ----------------------------------------------------
    def away(self) -> str | None:
        """Why Kafka is known to be away now (None: it is not known to be)."""
        with self._lock:
            since = self._away_since
            if since is None:
                return None
            why = self._lines.last_failure or self._why
            return f"no broker has answered this gateway for {self._clock() - since:.0f} s ({why})"

    def all_down_since_answer(self) -> bool:
        """Whether a client lost every broker after Kafka last answered this process."""
        return self._lines.all_down_at > self._answered_at

    def answered(self) -> None:
        """Kafka answered this process (a look, a commit)."""
        with self._lock:
            self._answered_at = self._clock()
            since, self._away_since = self._away_since, None
            if since is not None:
                self._back_at = self._answered_at
        if since is not None:
            log.warning("Kafka answers this gateway again, after %.1f s", self._clock() - since)

    def unanswered(self, failure: object) -> None:
        """A look that no broker answered found Kafka away (the caller knows it is: every
        broker lost, or no answer for longer than a broker's loss takes)."""
        with self._lock:
            if self._away_since is not None:
                return
            self._away_since = self._clock()
            self._why = str(failure)
        self._say(first=True)

    # -- the watch ---------------------------------------------------------------------------------
    def start(self) -> KafkaOutage:
        self._thread = threading.Thread(target=self._run, name="logbroker-kafka-watch", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the watch (not waited for: an ask in flight ends within :data:`LOOK_S`, and a
        gateway's stop has no time to spare; the clients it serves say themselves when
        they are closed)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(TICK_S if self._away_since is None else AWAY_PAUSE_S):
            try:
                self.tick()
            except Exception:  # the watch must never end while the store runs
                log.exception("watching Kafka")

    def tick(self) -> None:
        """Serve the quiet clients' lines; ask Kafka if it is away, or if a client lost every
        broker since it last answered; say what the log should."""
        for serve in self._serve:
            serve()
        if self._away_since is not None or self.all_down_since_answer():
            try:
                self._ask(LOOK_S)
            except LogbrokerError as exc:
                self.unanswered(exc)
            else:
                self.answered()
        now = self._clock()
        count = self._lines.failures
        if count != self._failures_seen:
            self._failures_seen, self._grew_at = count, now
            if self._failing_since is None:
                self._failing_since = now
        elif now - self._grew_at > _QUIET_S:
            self._failing_since = None  # no new failure for a while: it ended
        if now - self._said_at < SAY_EVERY_S:
            return
        if self._away_since is not None:
            self._say(first=False)
            return
        since = self._failing_since
        if since is not None and now - since >= FAILING_S and now - self._back_at > SAY_EVERY_S:
            self._failures_said = count
            self._said_at = now
            log.warning(
                "librdkafka reports failures while Kafka answers this gateway (a broker "
                "away?): %s (librdkafka's own lines: DEBUG, logger log_store.kafka.librdkafka)",
                self._lines.last_failure,
            )

    def _say(self, *, first: bool) -> None:
        now = self._clock()
        with self._lock:
            since = self._away_since
            if since is None:
                return
            why = self._lines.last_failure or self._why
            failures = self._lines.failures - self._failures_said
            self._failures_said = self._lines.failures
            self._said_at = now
        if first:
            log.warning(
                "Kafka is unreachable from this gateway: %s; /readyz, reads and topic requests "
                "answer 503 at once until a broker answers (asked all the time; "
                "librdkafka's own lines: DEBUG, logger log_store.kafka.librdkafka)",
                why,
            )
        else:
            log.warning(
                "Kafka is unreachable from this gateway for %.0f s: %s (%d failures reported "
                "by librdkafka since last said)",
                now - since,
                why,
                failures,
            )
