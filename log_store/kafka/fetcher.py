"""Reading partitions with read_committed consumers: reads, waits, watermarks, replays.

A reader sees committed records only (``isolation.level=read_committed``) and its end offset
is the *last stable offset* (LSO): nothing of an open or aborted transaction is ever returned,
and transaction markers, which take offsets too, are skipped.  Consumers are pooled: a read
that continues where an earlier read of the same partition stopped reuses that consumer and
whatever it has prefetched, so a tailing reader costs no seek per read.  A consumer no read
used for :data:`IDLE_CLOSE_S` is closed: its threads and buffers are given back once a
catching-up reader is done.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from log_store.errors import LogbrokerError, OffsetOutOfRange, StoreUnavailable, UnknownTopic
from log_store.interface import ReadResult, Record
from log_store.kafka import topic_admin
from log_store.kafka.failures import (
    as_store_error,
    ask_again,
    is_metadata_lag,
    is_topic_gone,
    is_unavailable,
    kafka_error,
    known_offset,
)
from log_store.kafka.naming import reader_group
from log_store.kafka.settings import KafkaSettings
from log_store.kafka.topic_admin import confirmed_gone

log = logging.getLogger(__name__)

_BATCH = 1000
_POOL_SIZE = 32
_WAIT_POLL_S = 0.05
_CONSUME_SLICE_S = 0.25
_ATTEMPT_S = 2.0
_NEW_TOPIC_S = 1.0
"""How long a topic or partition nobody knows yet may be just created, not gone."""
_GONE_LOOK_S = 1.0
"""A read or replay that got no record for this long asks whether its topic is still there."""
_END_AGAIN_S = 0.2
"""A partition's end found lower than before is asked again after this, to be sure."""
STUCK_CONSUMER_S = 3.0
"""A replay whose consumer hands out nothing for this long (or the operation timeout, if
shorter) while Kafka says the records it waits for are there goes on with a fresh consumer."""
_REPLAY_S = 60.0
"""What a replay that keeps getting records may take in all (it reads a snapshot's tail)."""
IDLE_CLOSE_S = 30.0
"""A pooled consumer no read or wait used for this long is closed.  A tailing reader polls
far more often (its long-polls end within seconds) and keeps its consumer."""


class Watermarks:
    """(log start offset, last stable offset) of partitions, asked of the partition leader."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._consumer = Consumer(settings.reader_config(reader_group(settings.namespace)))
        self._closed = False
        self._lock = threading.Lock()
        self._away_since: float | None = None
        self._away: collections.deque[tuple[float, float]] = collections.deque(maxlen=32)
        self._unanswered_since: float | None = None
        self.renewals = 0
        """How many times the consumer was replaced (see :meth:`_unanswered`)."""
        self.looks = 0
        """Calls of :meth:`get`: looks at one partition's watermarks (two requests each)."""

    def unavailable_spans(self) -> list[tuple[float, float]]:
        """Recent spans (wall-clock seconds) during which the partitions' leaders did not
        answer here; one still going ends now."""
        with self._lock:
            spans = list(self._away)
            if self._away_since is not None:
                spans.append((self._away_since, time.time()))
        return spans

    def _answered(self, asked: float, ok: bool) -> None:
        if ok and self._away_since is None:
            return  # the usual case, on every look: no lock taken
        with self._lock:
            if not ok:
                if self._away_since is None:
                    self._away_since = asked
            elif self._away_since is not None:
                self._away.append((self._away_since, time.time()))
                self._away_since = None

    def get(
        self,
        kafka_topic: str,
        partition: int,
        what: str = "watermarks",
        *,
        timeout_s: float | None = None,
        gone: Callable[[], bool] | None = None,
    ) -> tuple[int, int]:
        """(start, LSO), asked again while the partition is too new or moving to be known,
        for ``timeout_s`` at most (default: the operation timeout).

        Each attempt is short: a query sent to a leader that just died waits in that broker's
        queue, and only a metadata refresh (done between attempts) finds the new leader.

        ``gone``: asked every :data:`_GONE_LOOK_S` while Kafka answers that it knows no such
        topic or partition; True (the topic the caller writes was deleted) ends the asking
        with ``UnknownTopic``.  A partition the topic made again lacks is such an answer, and
        it is asked again for the whole timeout, as a partition just added may be.
        """
        self.looks += 1
        timeout = self._settings.operation_timeout_s if timeout_s is None else timeout_s
        looked_at = time.monotonic()
        told_gone = False

        def ask(remaining_s: float) -> tuple[int, int]:
            asked = time.time()
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(kafka_topic, partition),
                    timeout=max(0.1, min(_ATTEMPT_S, remaining_s)),
                    cached=False,
                )
                where = f"{kafka_topic}/{partition}"
                low, high = known_offset(int(low), where), known_offset(int(high), where)
            except Exception as exc:
                if is_unavailable(kafka_error(exc)):
                    self._answered(asked, False)
                self._unanswered(kafka_error(exc))
                raise
            self._answered(asked, True)
            self._unanswered_since = None
            return low, high

        def refresh() -> None:
            # librdkafka answers from its own metadata (leaders, partitions), which only a
            # metadata request brings up to date
            with contextlib.suppress(Exception):
                self._consumer.list_topics(kafka_topic, timeout=1.0)

        def retried_for(exc: Exception) -> float | None:
            nonlocal looked_at, told_gone
            span = _min_or_none(self._retried_for(exc), timeout)
            if span is not None and gone is not None and is_topic_gone(kafka_error(exc)):
                now = time.monotonic()
                if now - looked_at >= _GONE_LOOK_S:
                    looked_at = now
                    if gone():
                        told_gone = True
                        return None
            return span

        try:
            return ask_again(
                ask,
                timeout_s=timeout,
                retried_for=retried_for,
                pause_s=0.05,
                refresh=refresh,
            )
        except Exception as exc:
            where = f"{what} of {kafka_topic}/{partition}"
            error = as_store_error(exc, where)
            # "unknown topic or partition" is often librdkafka's own view, emptied while a
            # broker shuts down; only Kafka's metadata (or the caller's look at the topic's
            # identity) may say the topic is gone
            if (
                isinstance(error, UnknownTopic)
                and not told_gone
                and not self.gone(kafka_topic, partition, kafka_error(exc))
            ):
                error = StoreUnavailable(
                    f"Kafka unavailable ({where}): {kafka_error(exc) or exc}; yet its "
                    "metadata does not show the topic gone"
                )
            raise error from exc

    def _unanswered(self, error: KafkaError | None) -> None:
        """After :data:`~log_store.kafka.topic_admin.RENEW_AFTER_S` of asks that no broker
        answered, the consumer is replaced by a new one.

        Seen once in a full run beside a CPU-bound loop: after a broker restart this consumer
        answered every ask "All broker connections are down" for the two minutes the test
        waited, while the gateway's other clients talked to the restarted broker again; every
        takeover asks it, so the gateway took no writes.  As the admin client and the snapshot
        consumer are (``TopicAdmin``, ``OwnerContext``), it is let go.  (During an outage this
        makes a new consumer every few seconds, which fails as the old one did.)"""
        if error is None or error.code() not in topic_admin.NO_BROKER_CODES:
            self._unanswered_since = None
            return
        now = time.monotonic()
        with self._lock:
            since = self._unanswered_since
            if since is None:
                self._unanswered_since = now
                return
            if now - since < topic_admin.RENEW_AFTER_S or self._closed:
                return
            old = self._consumer
            self._consumer = Consumer(
                self._settings.reader_config(reader_group(self._settings.namespace))
            )
            self._unanswered_since = None
            self.renewals += 1
        log.warning(
            "the watermarks consumer's asks went unanswered for %.0f s: a new one is made",
            now - since,
        )
        # closed once the asks in flight on it (other takeovers') have had their timeout
        closing = threading.Timer(self._settings.operation_timeout_s + 5, old.close)
        closing.daemon = True
        closing.start()

    def gone(self, kafka_topic: str, partition: int, suspicion: KafkaError | None) -> bool:
        """Whether Kafka says for certain that the partition does not exist (see
        :func:`~log_store.kafka.topic_admin.confirmed_gone`)."""
        return confirmed_gone(
            lambda timeout_s: self._consumer.list_topics(timeout=timeout_s),
            kafka_topic,
            partition,
            suspicion=suspicion,
        )

    def _retried_for(self, exc: Exception) -> float | None:
        """How long a failure of ``get`` is asked again: a leader moving or away, for the
        operation timeout; a topic or partition nobody knows, for as long as it may be just
        created (``_UNKNOWN_PARTITION`` is both: the longer of the two)."""
        error = kafka_error(exc)
        spans = []
        if is_metadata_lag(error) or is_unavailable(error):
            spans.append(self._settings.operation_timeout_s)
        if is_topic_gone(error):
            spans.append(_NEW_TOPIC_S)
        return max(spans, default=None)

    def serve_log(self) -> None:
        """Hand the lines the consumer logged to its ``logger`` (nothing polls it otherwise:
        it is never assigned a partition)."""
        with self._lock:
            if not self._closed:
                self._consumer.poll(0)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._consumer.close()


@dataclass(eq=False)
class _Fetcher:
    consumer: Consumer
    tp: tuple[str, int] | None = None
    position: int | None = None
    """The offset of the next record this consumer would hand out (buffered ones first)."""
    buffer: collections.deque[Message] = field(default_factory=collections.deque)
    eof_at: int | None = None
    """Where the consumer reached the LSO, behind the buffered records."""
    used: float = 0.0

    def seek(self, kafka_topic: str, partition: int, offset: int) -> None:
        if self.tp == (kafka_topic, partition) and self.position == offset:
            return
        self.buffer.clear()
        self.eof_at = None
        self.consumer.assign([TopicPartition(kafka_topic, partition, offset)])
        self.tp = (kafka_topic, partition)
        self.position = offset

    def reset(self) -> None:
        self.buffer.clear()
        self.eof_at = None
        self.tp = None
        self.position = None
        try:
            self.consumer.unassign()
        except Exception:  # a broken consumer is replaced by the pool anyway
            self.position = None


class FetcherPool:
    """Pooled read_committed consumers shared by every read and wait of one store."""

    def __init__(self, settings: KafkaSettings, watermarks: Watermarks) -> None:
        self._settings = settings
        self.watermarks = watermarks
        self._idle: list[_Fetcher] = []
        self._count = 0
        self._cond = threading.Condition()
        self._closed = False
        self._stopping = threading.Event()
        self._reaper: threading.Thread | None = None

    # -- the pool -----------------------------------------------------------------------------
    def _acquire(self, tp: tuple[str, int], offset: int, *, block: bool = True) -> _Fetcher | None:
        with self._cond:
            while True:
                if self._closed:
                    raise StoreUnavailable("log store is closed")
                best = None
                for fetcher in self._idle:
                    if fetcher.tp == tp and fetcher.position == offset:
                        best = fetcher
                        break
                if best is None and self._idle:
                    # the least recently used, unless one already reads this partition
                    same = [f for f in self._idle if f.tp == tp]
                    best = same[0] if same else min(self._idle, key=lambda f: f.used)
                if best is not None:
                    self._idle.remove(best)
                    return best
                if self._count < _POOL_SIZE:
                    self._count += 1
                    break
                if not block:
                    return None
                self._cond.wait(1.0)
        return self._new_fetcher()

    def _fresh(self) -> _Fetcher:
        """A new consumer, never one of the pool's (see :meth:`replay`)."""
        with self._cond:
            if self._closed:
                raise StoreUnavailable("log store is closed")
            self._count += 1
        return self._new_fetcher()

    def _new_fetcher(self) -> _Fetcher:
        """A fetcher with a new consumer, counted already (uncounted if it cannot be made)."""
        try:
            consumer = Consumer(
                self._settings.reader_config(reader_group(self._settings.namespace))
            )
        except Exception:
            with self._cond:
                self._count -= 1
            raise
        return _Fetcher(consumer)

    def _discard(self, fetcher: _Fetcher) -> None:
        """Let a stuck consumer go; closed in a thread of its own, as a consumer that
        stopped fetching may not close at once either."""
        with self._cond:
            self._count -= 1
            self._cond.notify()
        threading.Thread(
            target=fetcher.consumer.close, name="logbroker-consumer-close", daemon=True
        ).start()

    def _release(self, fetcher: _Fetcher, broken: bool = False) -> None:
        fetcher.used = time.monotonic()
        with self._cond:
            if broken or self._closed:
                self._count -= 1
                self._cond.notify()
            else:
                self._idle.append(fetcher)
                self._cond.notify()
                if self._reaper is None:
                    self._reaper = threading.Thread(
                        target=self._close_idle_ones, name="logbroker-idle-consumers", daemon=True
                    )
                    self._reaper.start()
                return
        fetcher.consumer.close()

    def _close_idle_ones(self) -> None:
        while not self._stopping.wait(IDLE_CLOSE_S / 4):
            self.close_idle(IDLE_CLOSE_S)

    def close_idle(self, idle_s: float) -> int:
        """Close the pooled consumers no read or wait used for ``idle_s``; how many."""
        now = time.monotonic()
        with self._cond:
            old = [f for f in self._idle if now - f.used >= idle_s]
            for fetcher in old:
                self._idle.remove(fetcher)
            self._count -= len(old)
            if old:
                self._cond.notify_all()
        for fetcher in old:
            with contextlib.suppress(Exception):  # a broken consumer is let go all the same
                fetcher.consumer.close()
        return len(old)

    # -- consuming ----------------------------------------------------------------------------
    def _next(self, fetcher: _Fetcher, deadline: float) -> tuple[Message | None, bool]:
        """The next record (None on timeout) and whether the consumer reached the LSO."""
        if fetcher.buffer:
            return fetcher.buffer.popleft(), False
        if fetcher.eof_at is not None:
            fetcher.position = max(fetcher.position or 0, fetcher.eof_at)
            fetcher.eof_at = None
            return None, True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, False
        # consume(n, t) would wait for n records or t; poll() returns with the first one
        consumer = fetcher.consumer
        messages = consumer.consume(_BATCH, 0)
        if not messages:
            first = consumer.poll(min(remaining, _CONSUME_SLICE_S))
            if first is not None:
                messages = [first, *consumer.consume(_BATCH - 1, 0)]
        for message in messages:
            error = message.error()
            if error is None:
                fetcher.buffer.append(message)
                fetcher.eof_at = None
            elif error.code() == KafkaError._PARTITION_EOF:
                fetcher.eof_at = _offset(message)
            else:
                fetcher.buffer.clear()
                raise _ConsumeError(error)
        if fetcher.buffer:
            return fetcher.buffer.popleft(), False
        if fetcher.eof_at is not None:
            fetcher.position = max(fetcher.position or 0, fetcher.eof_at)
            fetcher.eof_at = None
            return None, True
        return None, False

    def read(
        self,
        kafka_topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        *,
        what: str,
        bounds: tuple[int, int] | None = None,
    ) -> ReadResult:
        """Committed records from ``offset``: at most about ``max_bytes`` (at least one).

        ``bounds``: the partition's (start, LSO) as looked up a moment ago together with
        other partitions' (see ``KafkaLogStore.reads_of``), instead of a look of its own.

        ``UnknownTopic`` if the topic is deleted meanwhile (asked as in :meth:`replay`).
        ``OffsetOutOfRange`` only for an offset outside the partition's watermarks: a
        consumer that Kafka answers "out of range" for an offset inside them has a stale view
        of the partition (seen right after its topic was deleted and made again, pooled
        consumers answered "outside 0..200" for offset 0); the read is made again with a new
        consumer, and if that one is refused too the caller is told to retry
        (``StoreUnavailable``), never that the offset is out of range.
        """
        try:
            return self._read_once(
                kafka_topic, partition, offset, max_bytes, what, fresh=False, bounds=bounds
            )
        except _StaleConsumer as exc:
            log.warning("reading %s: %s; reading it again with a new consumer", what, exc)
        self.forget(kafka_topic)  # idle consumers of the topic may have the same stale view
        try:
            return self._read_once(kafka_topic, partition, offset, max_bytes, what, fresh=True)
        except _StaleConsumer as exc:
            raise StoreUnavailable(f"Kafka unavailable (reading {what}): {exc}; retry") from None

    def _read_once(
        self,
        kafka_topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        what: str,
        *,
        fresh: bool,
        bounds: tuple[int, int] | None = None,
    ) -> ReadResult:
        """One try of :meth:`read`; ``fresh``: with a new consumer, not a pooled one."""
        low, end = bounds or self.watermarks.get(kafka_topic, partition, what)
        if offset < low:
            raise OffsetOutOfRange(f"offset {offset} is below the log start offset {low}", low, end)
        if offset >= end:
            return ReadResult([], low, end)
        records: list[Record] = []
        size = 0
        deadline = time.monotonic() + self._settings.operation_timeout_s
        fetcher = self._fresh() if fresh else self._acquire((kafka_topic, partition), offset)
        assert fetcher is not None
        broken = False
        look_at = time.monotonic() + _GONE_LOOK_S
        try:
            fetcher.seek(kafka_topic, partition, offset)
            while fetcher.position is not None and fetcher.position < end:
                message, eof = self._next(fetcher, deadline)
                if message is None:
                    if eof and _reached(fetcher, end):
                        break
                    # an end the consumer reached before what was committed since (a stale
                    # end of an earlier read): read on, or ``[position, end)`` would be lost
                    if time.monotonic() >= deadline:
                        raise StoreUnavailable(f"Kafka did not answer a read of {what} in time")
                    if time.monotonic() >= look_at:
                        self._check_still_there(kafka_topic, partition, end, what)
                        look_at = time.monotonic() + _GONE_LOOK_S
                    continue
                record_offset = _offset(message)
                fetcher.position = record_offset + 1
                if record_offset < offset:
                    continue
                if record_offset >= end:
                    # committed after our look at the end: keep it for the next read
                    fetcher.buffer.appendleft(message)
                    fetcher.position = record_offset
                    break
                value = message.value() or b""
                records.append(Record(record_offset, value, int(message.timestamp()[1])))
                size += len(value)
                if size >= max_bytes:
                    break
            # The consumer went past ``end`` (a record at or after it, or the LSO reached):
            # every offset below it was seen, and those after the last record are commit
            # markers.  The next read starts at ``end``, not on a marker, where it would find
            # only the records committed since and end on a marker again, for as long as
            # writes go on (and a wait from a marker's offset would return at once).
            passed = _reached(fetcher, end)
        except _ConsumeError as exc:
            broken = True
            at = offset if fetcher.position is None else fetcher.position
            raise self._consume_failure(
                exc.error, kafka_topic, partition, what, position=at
            ) from None
        except (StoreUnavailable, UnknownTopic):
            broken = True
            raise
        finally:
            self._release(fetcher, broken)
        return ReadResult(records, low, end, resume_at=end if passed else None)

    def _consume_failure(
        self,
        error: KafkaError,
        kafka_topic: str,
        partition: int,
        what: str,
        *,
        position: int | None = None,
    ) -> Exception:
        """What a consumer's ``error`` means.  ``position``: where the consumer read; an "out
        of range" answer for a position inside the watermarks asked now is the consumer's
        stale view (:class:`_StaleConsumer`), not the log's."""
        if error.code() == KafkaError._AUTO_OFFSET_RESET or error.code() == (
            KafkaError.OFFSET_OUT_OF_RANGE
        ):
            low, end = self.watermarks.get(kafka_topic, partition, what)
            if position is not None and low <= position < end:
                return _StaleConsumer(
                    f"Kafka answered that offset {position} is out of range ({error}), yet "
                    f"the partition holds {low}..{end}"
                )
            return OffsetOutOfRange(
                f"offset is outside {low}..{end} of {what} (retention moved the start)", low, end
            )
        if error.code() in (
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._UNKNOWN_TOPIC,
        ) and self.watermarks.gone(kafka_topic, partition, error):
            return UnknownTopic(f"{what}: the topic is gone")
        return StoreUnavailable(f"Kafka unavailable (reading {what}): {error}")

    def wait(self, kafka_topic: str, partition: int, offset: int, timeout_s: float) -> bool:
        """Block until a committed record at or after ``offset`` exists, or the timeout."""
        deadline = time.monotonic() + timeout_s
        _low, end = self.watermarks.get(kafka_topic, partition, "wait")
        if end > offset:
            return True
        fetcher = self._acquire((kafka_topic, partition), offset, block=False)
        if fetcher is None:
            # every consumer is busy (more partitions waited on than the pool holds): ask
            # for the end now and then instead of holding a consumer
            while time.monotonic() < deadline:
                time.sleep(min(_WAIT_POLL_S, max(0.0, deadline - time.monotonic())))
                if self.watermarks.get(kafka_topic, partition, "wait")[1] > offset:
                    return True
            return False
        broken = False
        try:
            fetcher.seek(kafka_topic, partition, offset)
            while time.monotonic() < deadline:
                message, _eof = self._next(fetcher, deadline)
                if message is not None:
                    # keep it: the read that follows picks this consumer and this record
                    fetcher.buffer.appendleft(message)
                    if _offset(message) >= offset:
                        return True
                    fetcher.buffer.popleft()
                    fetcher.position = _offset(message) + 1
            return False
        except _ConsumeError as exc:
            broken = True
            raise self._consume_failure(exc.error, kafka_topic, partition, "wait") from None
        finally:
            self._release(fetcher, broken)

    def replay(
        self,
        kafka_topic: str,
        partition: int,
        start: int,
        end: int,
        apply: Callable[[int, bytes], None],
        *,
        what: str,
    ) -> None:
        """Hand every committed record in ``start .. end`` to ``apply(offset, value)``.

        ``UnknownTopic`` if the topic is deleted meanwhile: a consumer of a deleted partition
        only stops getting records, so a replay that gets none for a while asks whether the
        records it waits for are still there (it used to wait its whole minute).

        ``StoreUnavailable`` once no record came for the operation timeout.  A consumer that
        hands out nothing while Kafka says the records are there is replaced after
        :data:`STUCK_CONSUMER_S`: a pooled consumer that went through a broker outage was
        seen to fetch nothing more, and the replay waited its whole minute (a takeover, and
        the writes of its partition, held a minute after Kafka was back).  A replay that
        keeps getting records may take :data:`_REPLAY_S` in all."""
        if start >= end:
            return
        timeout = self._settings.operation_timeout_s
        began = time.monotonic()
        deadline = began + max(_REPLAY_S, timeout)
        stuck_s = min(STUCK_CONSUMER_S, timeout)
        fetcher = self._acquire((kafka_topic, partition), start)
        assert fetcher is not None
        broken = False
        look_at = began + _GONE_LOOK_S
        got_at = began  # the last record, or the start
        since = began  # the last record, or the consumer's start
        records_there = False
        try:
            fetcher.seek(kafka_topic, partition, start)
            while fetcher.position is not None and fetcher.position < end:
                message, eof = self._next(fetcher, min(deadline, got_at + timeout))
                if message is None:
                    if eof and _reached(fetcher, end):
                        return
                    # a stale end (see ``read``): what follows it must be replayed too
                    now = time.monotonic()
                    if now >= deadline or now >= got_at + timeout:
                        raise StoreUnavailable(
                            f"Kafka did not answer a replay of {what} in time (no record for "
                            f"{now - got_at:.0f} s, at {fetcher.position} of {start}..{end})"
                        )
                    if now >= look_at:
                        records_there = self._check_still_there(kafka_topic, partition, end, what)
                        look_at = time.monotonic() + _GONE_LOOK_S
                    if records_there and now - since >= stuck_s:
                        position = fetcher.position
                        stuck, fetcher = fetcher, self._fresh()
                        self._discard(stuck)
                        log.warning(
                            "replaying %s: its consumer got nothing for %.0f s at %d of %d..%d "
                            "while Kafka has the records: going on with a new one",
                            what,
                            now - since,
                            position,
                            start,
                            end,
                        )
                        fetcher.seek(kafka_topic, partition, position)
                        since = time.monotonic()
                        records_there = False
                    continue
                got_at = since = time.monotonic()
                record_offset = _offset(message)
                if record_offset >= end:
                    fetcher.buffer.appendleft(message)
                    fetcher.position = record_offset
                    return
                fetcher.position = record_offset + 1
                apply(record_offset, message.value() or b"")
        except _ConsumeError as exc:
            broken = True
            raise self._consume_failure(exc.error, kafka_topic, partition, what) from None
        except BaseException:
            broken = True
            raise
        finally:
            self._release(fetcher, broken)

    def _check_still_there(self, kafka_topic: str, partition: int, end: int, what: str) -> bool:
        """Raise ``UnknownTopic`` if Kafka says for certain that the partition is gone, or no
        longer holds records up to ``end`` (its topic deleted and made again: its end
        restarted, seen twice).  Kafka away, or unsure, is no answer: the caller's own
        deadline bounds its wait (it answers ``StoreUnavailable``).  True: Kafka answered
        that the records up to ``end`` are there."""
        now = end
        for look in range(2):
            if look:
                time.sleep(_END_AGAIN_S)
            try:
                _low, now = self.watermarks.get(
                    kafka_topic, partition, what, timeout_s=_GONE_LOOK_S
                )
            except UnknownTopic:  # confirmed by Kafka's metadata (see Watermarks.get)
                raise UnknownTopic(f"{what}: the topic was deleted") from None
            except LogbrokerError:
                return False
            if now >= end:
                return True
        raise UnknownTopic(f"{what}: the topic was deleted (its end went from {end} to {now})")

    def forget(self, kafka_topic: str) -> None:
        """Drop idle consumers of a topic (deleted, or created again under the same name)."""
        with self._cond:
            stale = [f for f in self._idle if f.tp is not None and f.tp[0] == kafka_topic]
            for fetcher in stale:
                self._idle.remove(fetcher)
                self._count -= 1
        for fetcher in stale:
            fetcher.consumer.close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._stopping.set()
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        for fetcher in idle:
            fetcher.consumer.close()


def _min_or_none(span: float | None, limit: float) -> float | None:
    return None if span is None else min(span, limit)


def _reached(fetcher: _Fetcher, end: int) -> bool:
    """Whether the consumer got to ``end``: every committed record below it was handed out."""
    return fetcher.position is not None and fetcher.position >= end


def _offset(message: Message) -> int:
    offset = message.offset()
    return -1 if offset is None else int(offset)


class _StaleConsumer(StoreUnavailable):
    """A consumer was answered "offset out of range" for an offset inside the partition."""


class _ConsumeError(Exception):
    def __init__(self, error: KafkaError) -> None:
        super().__init__(str(error))
        self.error = error
