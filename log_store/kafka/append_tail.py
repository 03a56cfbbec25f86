"""Following appends on Kafka: one read_committed consumer tails the followed partitions' state.

A long-poll waits on partitions that any gateway may write (their owners are anywhere).  Every
commit to a data partition writes, in the same Kafka transaction, a delta to the partition of
the same number of the topic's state changelog (``state_changelog``), and the delta names the
data partition's end after the commit.  So one consumer of the store is assigned, for each
followed partition, its changelog partition, and a delta it receives wakes the data
partition's followers: the tail reads the few bytes of each commit's delta, not the commit's
records (a megabyte a commit under load, which it fetched and decompressed only to drop:
about 1.3 ms of CPU per MB written).  However many partitions are followed, that is one
consumer and one thread, and an idle partition costs the broker a place in the consumer's
fetch session, not a request of its own.

The markers that make a transaction readable are written to each of its partitions one by
one, so a delta can be readable a moment before the records it names (on a cluster, the two
partitions' leaders may be different brokers).  A follower woken then would look, find
nothing new, and wait again for a delta that already came.  So a delta's followers are woken
once the data partition's last stable offset has reached the delta's data end (asked of the
leader; at once in the usual case, else again every few milliseconds).  A partition whose
writer is in this process, and made that commit, is not asked about: the writer answers its
callers only once it saw the commit readable (``PartitionOwner._await_visible``), and the
tail wakes the followers when it did, without a request of its own.

A partition whose changelog is not there (a topic made by a version without one, until its
first writer makes it) is followed by its own records, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from log_store.kafka.naming import reader_group
from log_store.kafka.settings import KafkaSettings
from log_store.kafka.state_changelog import data_end_of

log = logging.getLogger(__name__)

_CONSUME_S = 0.1
"""How long one ``poll`` waits for a record: how soon a partition followed meanwhile is
assigned (a commit before that still wakes it, see :data:`STATE_LOOKBACK`), and the thread
sees that the store closed."""
_VISIBLE_LOOK_S = 0.003
"""How long a ``consume`` waits while a delta's records are not readable yet."""
_VISIBLE_WAIT_S = 5.0
"""A delta's followers are woken after this even if its records never became readable (a
transaction Kafka aborted after the delta's marker: nothing to read, and nothing lost)."""
_ASKED_ONE_BY_ONE = 4
"""Up to this many partitions' ends are asked one by one (the store's watermark consumer:
less CPU per look than an admin request), more in one request per leader."""
_RESOLVE_EVERY_S = 0.5
"""How often a partition whose changelog went away (its topic deleted) is looked up again."""
_CHECK_EVERY_S = 1.0
"""How often the followed changelogs are looked for in Kafka's metadata: a deleted topic's
changelog is not made again under its name (a topic made again has a new identity, so a new
changelog), and a consumer assigned a topic that is gone is told nothing."""
_TAIL_FETCH_BYTES = 64 * 1024
_TAIL_QUEUE_KBYTES = 1024
STATE_LOOKBACK = 16
"""Changelog offsets read back when a partition is first followed: its changelog's end is
looked up by librdkafka when the consumer is assigned it, a moment after the follow took the
data's end, and the commits in between (or whose delta was readable before their records,
see above) are among the last few transactions, whose deltas wake the followers if their
data end is past the follow's start."""
_FROM_LOOKBACK = -2000 - STATE_LOOKBACK
"""librdkafka's logical offset ``OFFSET_TAIL(STATE_LOOKBACK)``: that many before the end."""

KafkaPartition = tuple[str, int]
StateStart = tuple[str, int]
"""(the changelog topic, the offset to read it from)."""


def _call(followers: list[Callable[[], None]]) -> None:
    for on_append in followers:
        try:
            on_append()
        except Exception:
            log.exception("a follower of appends failed")


@dataclass
class _Followed:
    """A followed data partition, as the tail's thread tracks it."""

    assigned: KafkaPartition
    """What the consumer is assigned for it: its changelog partition, or itself."""
    floor: int
    """Deltas whose data end is at or below this woke (or needed to wake) nobody."""
    pending: int | None = None
    """The data end of the last delta whose records were not readable when it came."""
    pending_since: float = 0.0
    resolve_at: float | None = None
    """When to look its changelog up again (fetching it failed); None: it is assigned."""


@dataclass
class _Request:
    start: int
    changelog: str | None


class AppendTail:
    """One consumer, started on the first follow, assigned the followed partitions' changelogs."""

    def __init__(
        self,
        settings: KafkaSettings,
        end_of: Callable[[str, int], int],
        state_of: Callable[[str, int], StateStart],
        ends_of: Callable[[list[KafkaPartition]], dict[KafkaPartition, int]],
        local_ends: Callable[[str, int], tuple[int, int] | None] = lambda *_: None,
    ) -> None:
        """``end_of(kafka_topic, partition)``: the partition's end (LSO) now, quickly.
        ``ends_of(partitions)``: the ends of many, asked together (those not answered are
        left out).
        ``state_of(kafka_topic, partition)``: where to follow the partition's changelog from
        now, asked afresh after fetching it failed (the topic deleted, maybe made again
        with another changelog); the data topic itself if it has none.
        ``local_ends(changelog, partition)``: (committed end, readable end) of the data
        partition as the writer in this process of the topic of that changelog knows them;
        None if it has none."""
        self._settings = settings
        self._local_ends = local_ends
        self.end_looks = 0
        """Partitions' ends asked of Kafka to see a delta's records readable."""
        self._end_of = end_of
        self._ends_of = ends_of
        self._state_of = state_of
        self._lock = threading.Lock()
        self._followers: dict[KafkaPartition, list[Callable[[], None]]] = {}
        self._requests: dict[KafkaPartition, _Request] = {}
        """Followed partitions the consumer is not assigned yet (guarded by the lock)."""
        self._followed: dict[KafkaPartition, _Followed] = {}
        """What the consumer is assigned, by data partition (the tail's thread only)."""
        self._data_of: dict[KafkaPartition, KafkaPartition] = {}
        """The data partition of each assigned partition (the tail's thread only)."""
        self._checked = time.monotonic()
        self._consumer: Consumer | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.received_bytes = 0
        """Bytes of records the consumer received (changelog deltas, mostly)."""

    @property
    def followed(self) -> int:
        """How many partitions are followed now."""
        with self._lock:
            return len(self._followers)

    def follow(
        self,
        kafka_topic: str,
        partition: int,
        start: int,
        on_append: Callable[[], None],
        changelog: str | None = None,
    ) -> Callable[[], None]:
        """Call ``on_append`` for every commit that makes the partition's end pass ``start``
        (an offset at or below the partition's end now), until the function returned is
        called.  ``changelog``: the topic of the partition's changelog (None: the partition's
        own records are followed, from ``start``); if Kafka has no such topic, the partition
        is followed by its records (or a changelog made since) within :data:`_CHECK_EVERY_S`.

        Returns at once: the consumer is assigned the partition by the tail's thread, with
        every other partition followed or let go meanwhile, between two of its ``consume``
        calls (librdkafka's assign waits for a ``consume`` in progress, half a second: a
        long-poll of 100 new partitions took 50 s to follow them one by one).  A commit
        made before that still calls it."""
        tp = (kafka_topic, partition)
        with self._lock:
            if self._closed:
                return lambda: None
            self._started()
            followers = self._followers.get(tp)
            if followers is None:
                self._followers[tp] = followers = []
                self._requests[tp] = _Request(start, changelog)
            followers.append(on_append)

        def unfollow() -> None:
            with self._lock:
                followers = self._followers.get(tp)
                if followers is None or on_append not in followers:
                    return
                followers.remove(on_append)
                if not followers:
                    del self._followers[tp]
                    self._requests.pop(tp, None)

        return unfollow

    def _started(self) -> Consumer:
        """The consumer, made with its thread on first use (lock held)."""
        if self._consumer is None:
            config = self._settings.reader_config(reader_group(self._settings.namespace))
            config.update(
                {
                    "enable.partition.eof": False,
                    "max.partition.fetch.bytes": _TAIL_FETCH_BYTES,
                    "queued.max.messages.kbytes": _TAIL_QUEUE_KBYTES,
                }
            )
            self._consumer = Consumer(config)
            self._thread = threading.Thread(
                target=self._run, args=(self._consumer,), name="logbroker-append-tail", daemon=True
            )
            self._thread.start()
        return self._consumer

    def _reassign(self, consumer: Consumer) -> None:
        """Assign the consumer the partitions followed since the last call and let go of
        those nobody follows now, each in one call (in the tail's thread)."""
        with self._lock:
            requests, self._requests = self._requests, {}
            gone = [tp for tp in self._followed if tp not in self._followers]
            requests = {tp: r for tp, r in requests.items() if tp in self._followers}
        if gone:
            let_go = [self._forget(tp) for tp in gone]
            assigned = [TopicPartition(*a) for a in let_go if a is not None]
            try:
                if assigned:
                    consumer.incremental_unassign(assigned)
            except Exception as exc:  # a broken consumer: nothing is fetched for them
                log.debug("unassigning %d partitions: %s", len(assigned), exc)
        new: list[TopicPartition] = []
        added: list[KafkaPartition] = []
        for tp, request in requests.items():
            if tp in self._followed:
                continue
            added.append(tp)
            if request.changelog is not None:
                offset = _FROM_LOOKBACK
                followed = _Followed((request.changelog, tp[1]), floor=request.start)
            else:
                offset = request.start
                followed = _Followed(tp, floor=request.start)
            self._followed[tp] = followed
            self._data_of[followed.assigned] = tp
            new.append(TopicPartition(*followed.assigned, offset))
        if new:
            try:
                consumer.incremental_assign(new)
            except Exception as exc:
                # not assigned, so no append wakes their followers: their readers look
                # when their waits end
                log.warning("the append tail could not follow %d partitions: %s", len(new), exc)
                for tp in added:
                    self._forget(tp)

    def _forget(self, tp: KafkaPartition) -> KafkaPartition | None:
        """Drop the tail's record of ``tp``; what the consumer was assigned for it, if any."""
        followed = self._followed.pop(tp, None)
        if followed is None:
            return None
        self._data_of.pop(followed.assigned, None)
        return followed.assigned if followed.resolve_at is None else None

    def _run(self, consumer: Consumer) -> None:
        while not self._closed:
            self._reassign(consumer)
            waiting = [tp for tp, f in self._followed.items() if f.pending is not None]
            try:
                # the first record as soon as it comes, then what is queued behind it (a
                # batch ``consume`` waits for its whole batch or its whole timeout: followers
                # were woken up to half a second after the commit)
                first = consumer.poll(_VISIBLE_LOOK_S if waiting else _CONSUME_S)
                messages = [] if first is None else [first, *consumer.consume(999, timeout=0)]
            except Exception as exc:
                if self._closed:
                    return
                log.warning("the append tail's consumer failed: %s", exc)
                self._wake_all()  # their readers look for themselves
                time.sleep(_CONSUME_S)
                continue
            changed: dict[KafkaPartition, None] = {}
            failed: dict[KafkaPartition, None] = {}
            for message in messages:
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    continue
                topic, partition = message.topic(), message.partition()
                if topic is None or partition is None or partition < 0:
                    if error is not None:
                        # an error of no one partition (a broker away): the readers look
                        log.debug("append tail: %s", error)
                    continue
                tp = self._data_of.get((topic, partition))
                if tp is None:
                    continue  # let go of meanwhile
                if error is not None:
                    failed[tp] = None
                    if self._followed[tp].assigned == tp:
                        # the partition deleted, or its records expired under the tail: its
                        # readers read it again (a changelog's error is no news of the
                        # data: a topic deleted is told by _check_changelogs)
                        changed[tp] = None
                    continue
                value = message.value() or b""
                self.received_bytes += len(value)
                followed = self._followed[tp]
                if followed.assigned == tp:
                    changed[tp] = None  # a record of the partition itself
                    continue
                data_end = data_end_of(value)
                if data_end is None:
                    changed[tp] = None  # not a delta this version knows: look anyway
                elif data_end > followed.floor:
                    followed.floor = data_end
                    if followed.pending is None:
                        followed.pending_since = time.monotonic()
                    followed.pending = data_end
            for tp in failed:
                self._assign_again(consumer, tp)
            self._check_changelogs(consumer, changed)
            self._resolve(consumer, changed)
            self._readable(changed)
            with self._lock:
                followers = [f for tp in changed for f in self._followers.get(tp, ())]
            _call(followers)

    def _readable(self, changed: dict[KafkaPartition, None]) -> None:
        """Add to ``changed`` the partitions whose last delta's records are readable now
        (their ends asked in one request per leader, however many)."""
        pending = [tp for tp, followed in self._followed.items() if followed.pending is not None]
        if not pending:
            return
        ends: dict[KafkaPartition, int] = {}
        asked = []
        for tp in pending:
            followed = self._followed[tp]
            assert followed.pending is not None
            local = None if followed.assigned == tp else self._local_ends(*followed.assigned)
            if local is not None and local[0] >= followed.pending:
                # this process's writer made that commit: it says when readers see it (it
                # asks Kafka for that itself, before it answers the commit's callers)
                ends[tp] = local[1]
            else:
                asked.append(tp)
        self.end_looks += len(asked)
        try:
            if len(asked) > _ASKED_ONE_BY_ONE:
                ends.update(self._ends_of(asked))
            else:
                for tp in asked:
                    ends[tp] = self._end_of(*tp)
        except Exception as exc:  # Kafka away: their readers look when their waits end
            log.debug("the ends of %d partitions: %s", len(asked), exc)
        now = time.monotonic()
        for tp in pending:
            followed = self._followed[tp]
            assert followed.pending is not None
            readable = ends.get(tp, -1) >= followed.pending
            if readable or now - followed.pending_since > _VISIBLE_WAIT_S:
                followed.pending = None
                changed[tp] = None

    def _assign_again(self, consumer: Consumer, tp: KafkaPartition) -> None:
        """Fetch ``tp`` (or its changelog) again from its end: after an error (a topic
        deleted and made again under the tail, whose offsets start over; records expired
        below it) librdkafka fetches it no more.  Its followers are called after this, so
        that their readers' next look sees what came before it."""
        with self._lock:
            if tp not in self._followers:
                return
        followed = self._followed.get(tp)
        if followed is None or followed.resolve_at is not None:
            return
        if followed.assigned != tp:
            # the changelog is named by the topic's identity: a topic made again has another,
            # looked up (now and until it is there) by _resolve
            try:
                consumer.incremental_unassign([TopicPartition(*followed.assigned)])
            except Exception as exc:
                log.debug("unassigning %s/%d: %s", *followed.assigned, exc)
            self._data_of.pop(followed.assigned, None)
            followed.resolve_at = 0.0
            followed.pending = None
            return
        try:
            end = self._end_of(*tp)
            consumer.incremental_unassign([TopicPartition(*tp)])
            consumer.incremental_assign([TopicPartition(tp[0], tp[1], end)])
        except Exception as exc:  # not there (yet): the next error tries again
            log.debug("assigning %s/%d again: %s", *tp, exc)

    def _check_changelogs(self, consumer: Consumer, changed: dict[KafkaPartition, None]) -> None:
        """Every :data:`_CHECK_EVERY_S`: the partitions whose changelog Kafka no longer has
        (their topic deleted, maybe made again) are looked up again, their followers woken."""
        now = time.monotonic()
        if now - self._checked < _CHECK_EVERY_S:
            return
        self._checked = now
        changelogs = {
            f.assigned[0]
            for tp, f in self._followed.items()
            if f.resolve_at is None and f.assigned != tp
        }
        for name in changelogs:
            try:
                topic = consumer.list_topics(name, timeout=_CHECK_EVERY_S).topics.get(name)
            except Exception as exc:  # Kafka away: looked for again next time
                log.debug("looking for %s: %s", name, exc)
                continue
            error = None if topic is None else topic.error
            if error is None or error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            for tp, followed in list(self._followed.items()):
                if followed.assigned[0] == name and followed.resolve_at is None:
                    self._assign_again(consumer, tp)
                    changed[tp] = None

    def _resolve(self, consumer: Consumer, changed: dict[KafkaPartition, None]) -> None:
        """Follow again each partition whose changelog could not be fetched, once its topic
        is there (made again: a new identity, so a new changelog)."""
        now = time.monotonic()
        for tp, followed in self._followed.items():
            if followed.resolve_at is None or now < followed.resolve_at:
                continue
            followed.resolve_at = now + _RESOLVE_EVERY_S
            try:
                state = self._state_of(*tp)
            except Exception as exc:
                log.debug("the changelog of %s/%d: %s", *tp, exc)
                continue
            assigned = (state[0], tp[1])
            offset = state[1]
            if assigned == tp and followed.floor >= 0:
                offset = min(offset, followed.floor)  # the records since the follow's start
            try:
                consumer.incremental_assign([TopicPartition(*assigned, offset)])
            except Exception as exc:
                log.debug("assigning %s/%d: %s", *assigned, exc)
                continue
            if assigned != followed.assigned:
                # the topic made again: its readers read it, and its offsets start over
                followed.floor = -1
                changed[tp] = None
            followed.assigned = assigned
            followed.resolve_at = None
            self._data_of[assigned] = tp

    def _wake_all(self) -> None:
        with self._lock:
            followers = [f for fs in self._followers.values() for f in fs]
        _call(followers)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            consumer, self._consumer = self._consumer, None
            self._followers.clear()
            self._requests.clear()
        if self._thread is not None:
            self._thread.join(_CONSUME_S * 4)
        if consumer is not None:
            consumer.close()
