"""The one writer of a partition: a transactional producer, the state table, group commit.

Kafka Streams gives each task its own transactional producer; here each owned partition has
one, with the transactional id ``<ns>logbroker-<topic>-<partition>``.  Whoever takes a
partition over calls ``init_transactions`` with that id, which makes the cluster abort the
previous writer's open transaction and refuse any later commit of it (``PRODUCER_FENCED``): at
any moment at most one writer can commit to the partition, and a writer that lost it learns so
at its next commit and commits nothing.

Takeover, in this order: fence (``init_transactions``), then read the changelog's last snapshot
and the deltas after it up to the last stable offset (see ``state_changelog``), then read the
data partition's end.  Every transaction of the old writer is then either in that table and
below that end, or aborted.

Group commit: transactions submitted while a Kafka transaction is in flight wait, and are run
together in the next one: each function runs against the table plus what the earlier ones of
its group changed, the records of all of them are produced to the data partition and their
state changes to the changelog partition (one delta record, or several parts of a delta too
large for one: see ``state_changelog``), and ``commit_transaction`` commits both.  Each caller
is answered only after that commit returned and the records are visible to read_committed
readers.  The next transaction begins once the previous one's markers are readable (see
``_await_markers``).  Offsets are known before the commit: this writer is the partition's only
one, so its records follow each other and each commit marker takes exactly one offset; the
offsets Kafka reports are checked against that before committing.

A transaction holding a record larger than the topics take (``max.message.bytes``) is
refused before anything is produced (``RecordTooLarge``), and a size error from Kafka fails the
transactions of the commit as that too: they would fail the same way again, so they are not
retried, and the owner stays the partition's owner (it takes the partition over again, in
place, before its next transaction: the aborted records moved the offsets).

Any failure whose outcome is not certain (a commit that timed out, a fenced producer) marks
the owner *broken*: before its next transaction it takes the partition over again, which
settles the uncertain transaction one way or the other and rebuilds the table from what Kafka
holds, so a retried chunk is then answered ``duplicate`` if the first try did commit.  A
commit whose request was sent but whose answer never came is remembered (per partition, by
the store's owners together); the next takeover of that partition in this process reads the
committed record at the offset its first record was given: if it is byte for byte that
record (whose envelope carries its write time in ms), the commit went through, and the
transactions that asked (``late_commit_hook``) are told, so the write that only a duplicate
answered is still counted once (the gateway's audit).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from log_store.errors import (
    LogbrokerError,
    OffsetOutOfRange,
    StoreUnavailable,
    UnknownPartition,
    UnknownTopic,
)
from log_store.interface import (
    TOPIC_ID_KEY,
    AppendResult,
    LateCommitHook,
    Record,
    TransactionFn,
    late_commit_hook,
)
from log_store.kafka import naming, topic_admin
from log_store.kafka.failures import (
    OwnerGone,
    PartitionGone,
    RecordTooLarge,
    WriterFenced,
    as_commit_error,
    as_store_error,
    ask_again,
    is_coordinator_moving,
    is_fenced,
    is_too_large,
    kafka_error,
    without_tracebacks,
)
from log_store.kafka.fetcher import FetcherPool, Watermarks
from log_store.kafka.remote_transaction import start_future
from log_store.kafka.settings import DEBUG_LOG, KafkaSettings
from log_store.kafka.state_changelog import (
    DELTA_RECORD_BYTES,
    SNAPSHOT_CHUNK_BYTES,
    ReplayedState,
    apply_changes,
    delta_records,
    snapshot_records,
)
from log_store.kafka.topic_admin import KafkaTopic, TopicAdmin

log = logging.getLogger(__name__)

_FAILED_TAKEOVER_PAUSE_S = 1.0
_GIVEN_TAKEOVER_RETRY_MAX_S = 10.0
"""An owner of a partition given to this gateway whose takeover failed tries again after
1, 2, 4, 8, then every 10 seconds (see ``PartitionOwner._wait_for_work``)."""
_MAX_GROUP = 4096
_MARKER_WAIT_S = 0.1
"""At most this long a transaction waits for the previous commit's markers (see
``PartitionOwner._await_markers``)."""
_IDENTITY_LOOK_S = 0.2
"""A commit not readable after this long is checked to be in a topic that still exists."""
_IDENTITY_LOOK_TIMEOUT_S = 1.0
"""What such a look waits for Kafka's answer: with Kafka away, it must not add a timeout."""
_DELIVERY_LOOK_EVERY_S = 1.0
"""How often a transaction whose records are not all delivered looks at its topic."""


@dataclass
class CommitCounts:
    """The Kafka transactions the owners of one store committed, and what they carried.

    ``transactions`` over ``commits`` is the mean group size: how many callers' transactions
    (one per client request and partition, usually) one Kafka commit answered."""

    commits: int = 0
    transactions: int = 0
    records: int = 0
    visibility_looks: int = 0
    """Requests for a partition's last stable offset made to see commits readable."""
    committed_at: float = float("-inf")
    """``time.monotonic()`` of the last commit."""
    refused_at: float = float("-inf")
    """``time.monotonic()`` of the last commit or takeover that failed for want of Kafka
    (``StoreUnavailable``): with :attr:`committed_at`, what ``/readyz`` knows of the writes
    (see ``readiness``)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, transactions: int, records: int) -> None:
        with self._lock:
            self.commits += 1
            self.transactions += transactions
            self.records += records
            self.committed_at = time.monotonic()

    def refused(self, failure: BaseException) -> None:
        """Note a commit or takeover that failed; only a failure for want of Kafka counts."""
        if isinstance(failure, StoreUnavailable):
            self.refused_at = time.monotonic()

    def looked(self) -> None:
        with self._lock:
            self.visibility_looks += 1


@dataclass
class OwnerContext:
    """What every owner of one store shares."""

    settings: KafkaSettings
    admin: TopicAdmin
    watermarks: Watermarks
    fetchers: FetcherPool
    retry: Retry
    """Where a transaction goes when its owner was fenced or stopped before running it."""
    on_takeover: Callable[[str, int, float, int], None] = lambda *_: None
    """Called with (topic, partition, seconds, table entries) after each takeover."""
    assigned: Callable[[str, int], bool] = lambda *_: False
    """Whether the gateways' group gives this process the partition now (never, in a process
    that writes any partition on demand): a fenced owner of such a partition was not
    expected to be (see :class:`_ProducerLog`)."""
    commits: CommitCounts = field(default_factory=CommitCounts)
    _snapshot_consumer: Consumer | None = None
    _snapshots_unanswered_since: float | None = None
    """Since when the snapshot consumer's asks have gone unanswered (no broker), if they do."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _unanswered: dict[tuple[str, int], _Unanswered] = field(default_factory=dict)
    """Per partition, its last commit whose answer never came, until it is read whether it
    went through (the owner that failed is often replaced, or the partition moved, before)."""
    _settler: threading.Thread | None = None
    _closed: threading.Event = field(default_factory=threading.Event)

    def note_unanswered(self, topic: str, partition: int, unanswered: _Unanswered) -> None:
        with self._lock:
            self._unanswered[(topic, partition)] = unanswered
            if self._settler is None and not self._closed.is_set():
                self._settler = threading.Thread(
                    target=self._settle_waiting, name="logbroker-settler", daemon=True
                )
                self._settler.start()

    def unanswered(self, topic: str, partition: int) -> _Unanswered | None:
        with self._lock:
            return self._unanswered.get((topic, partition))

    def settle(
        self,
        topic: str,
        partition: int,
        unanswered: _Unanswered,
        *,
        final: bool,
        gone: Callable[[], bool] | None = None,
    ) -> None:
        """Read whether an unanswered commit went through, and tell its hooks if it did.

        ``final``: the partition was just taken over here, which settled the commit in Kafka.
        Otherwise it is read once readers see past it: Kafka completed or aborted it (the
        transaction timeout), or another gateway took the partition over and wrote on.  Until
        then (or while Kafka is away) it stays waiting.  ``gone``: as in ``Watermarks.get``.
        """
        what = f"{topic}/{partition} after an unanswered commit"
        lost = ""  # why the records cannot be read, if they cannot
        try:
            _low, end = self.watermarks.get(unanswered.kafka_topic, partition, what, gone=gone)
            if not final and end <= unanswered.probe_offset:
                return
            found: list[Record] | None = self.fetchers.read(
                unanswered.kafka_topic, partition, unanswered.probe_offset, 1, what=what
            ).records
        except OffsetOutOfRange:
            found, lost = None, "retention removed it"
        except UnknownTopic:
            found, lost = None, "its topic was deleted"
        except LogbrokerError as exc:
            log.info("%s/%d: unanswered commit not settled yet: %s", topic, partition, exc)
            return
        with self._lock:  # the takeover here and the settler may both have read it
            if self._unanswered.get((topic, partition)) is not unanswered:
                return
            del self._unanswered[(topic, partition)]
        if found is None:
            _left_unsettled((topic, partition), unanswered, lost)
            return
        if not (
            found
            and found[0].offset == unanswered.probe_offset
            and found[0].value == unanswered.probe_value
        ):
            log.info(
                "%s/%d: the unanswered commit of %d records did not go through",
                topic,
                partition,
                unanswered.records,
            )
            return
        log.info(
            "%s/%d: the unanswered commit of %d records went through after all "
            "(their writers' retries are answered as duplicates)",
            topic,
            partition,
            unanswered.records,
        )
        _tell_committed(topic, unanswered.audited)

    def _settle_waiting(self) -> None:
        """The settler: every few seconds, reads whether the waiting unanswered commits went
        through; ends when none is left (the next one starts it again)."""
        while not self._closed.wait(_SETTLE_EVERY_S):
            now = time.monotonic()
            with self._lock:
                for key in [
                    k for k, u in self._unanswered.items() if now - u.noted_at > _UNANSWERED_KEPT_S
                ]:
                    _left_unsettled(key, self._unanswered.pop(key), "undecided for 10 minutes")
                waiting = list(self._unanswered.items())
                if not waiting:
                    self._settler = None
                    return
            for (topic, partition), unanswered in waiting:
                self.settle(topic, partition, unanswered, final=False)

    def _snapshots(self) -> Consumer:
        # A consumer of the snapshot group that never joins it: it reads the group's offsets
        # and gives its metadata to send_offsets_to_transaction.  (The AdminClient's offset
        # listing is not used: librdkafka 2.16 crashes in it when the coordinator asks to
        # retry.)
        with self._lock:
            if self._snapshot_consumer is None:
                self._snapshot_consumer = Consumer(
                    self.settings.reader_config(naming.snapshot_group(self.settings.namespace))
                )
            return self._snapshot_consumer

    def group_metadata(self) -> object:
        """The snapshot group's metadata, for ``send_offsets_to_transaction``."""
        return self._snapshots().consumer_group_metadata()

    def committed_snapshot(self, state_topic: str, partition: int) -> int | None:
        """The offset of the partition's last snapshot, committed in the snapshot's transaction.

        read_committed: an offset committed by a transaction still open is waited for.
        """
        timeout = self.settings.operation_timeout_s

        def ask(remaining_s: float) -> list[TopicPartition]:
            return self._snapshots().committed(
                [TopicPartition(state_topic, partition)], timeout=max(0.1, remaining_s)
            )

        def retried_for(exc: Exception) -> float | None:
            # the group's coordinator is still being chosen or loaded (a namespace's first
            # takeover, a broker restarted): asked again until the timeout
            if isinstance(exc, KafkaException) and is_coordinator_moving(kafka_error(exc)):
                return timeout
            return None

        try:
            committed = ask_again(ask, timeout_s=timeout, retried_for=retried_for, pause_s=0.1)
        except KafkaException as exc:
            self._snapshots_unanswered(kafka_error(exc))
            raise as_store_error(exc, "reading the snapshot position") from exc
        self._snapshots_unanswered_since = None
        for tp in committed:
            if tp.error is None and tp.offset >= 0:
                return int(tp.offset)
        return None

    def _snapshots_unanswered(self, error: KafkaError | None) -> None:
        """After :data:`~log_store.kafka.topic_admin.RENEW_AFTER_S` of asks that no broker
        answered, the snapshot consumer is let go: the next takeover makes a new one.

        Like the admin client (see ``TopicAdmin``), a librdkafka client can stay without a
        usable broker after an outage while new clients reach Kafka; every takeover of the
        gateway would fail on it.  (During an outage this makes a new consumer every few
        seconds, which fails as the old one did.)"""
        if error is None or error.code() not in topic_admin.NO_BROKER_CODES:
            self._snapshots_unanswered_since = None
            return
        now = time.monotonic()
        with self._lock:
            since = self._snapshots_unanswered_since
            if since is None:
                self._snapshots_unanswered_since = now
                return
            if now - since < topic_admin.RENEW_AFTER_S or self._closed.is_set():
                return
            old, self._snapshot_consumer = self._snapshot_consumer, None
            self._snapshots_unanswered_since = None
        if old is None:
            return
        log.warning(
            "the snapshot consumer's asks went unanswered for %.0f s: a new one is made",
            now - since,
        )
        # closed once the asks in flight on it (another takeover's) have had their timeout
        closing = threading.Timer(self.settings.operation_timeout_s + 5, old.close)
        closing.daemon = True
        closing.start()

    def serve_log(self) -> None:
        """Hand the lines the snapshot consumer logged to its ``logger`` (nothing polls it
        otherwise: it is never assigned a partition)."""
        with self._lock:
            if self._snapshot_consumer is not None:
                self._snapshot_consumer.poll(0)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            for key, unanswered in self._unanswered.items():
                _left_unsettled(key, unanswered, "the store closed")
            self._unanswered.clear()
            if self._snapshot_consumer is not None:
                self._snapshot_consumer.close()
                self._snapshot_consumer = None


class _TxnState:
    """The state area as one transaction sees it: its own puts over the group's over the table."""

    __slots__ = ("_group", "_next_offset", "_table", "_topic_id", "local")

    def __init__(
        self,
        table: dict[str, bytes],
        group: dict[str, bytes],
        next_offset: int,
        topic_id: bytes | None,
    ) -> None:
        self._table = table
        self._group = group
        self._next_offset = next_offset
        self._topic_id = topic_id
        self.local: dict[str, bytes] = {}

    def next_offset(self) -> int:
        return self._next_offset

    def get(self, key: str) -> bytes | None:
        if key == TOPIC_ID_KEY:
            return self._topic_id
        # a key deleted (an empty value) reads as absent, as it does once committed
        if key in self.local:
            return self.local[key] or None
        if key in self._group:
            return self._group[key] or None
        return self._table.get(key)

    def put(self, key: str, value: bytes) -> None:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError("state values are bytes")
        self.local[key] = bytes(value)


@dataclass(eq=False)
class Pending:
    """A transaction waiting for its commit; it may move between owners before it runs."""

    fn: TransactionFn
    future: concurrent.futures.Future[AppendResult]
    attempts: int = 0
    local_only: bool = False
    """Sent by another gateway to this one as the owner: never passed on to a third."""

    def start(self) -> bool:
        """False if the caller cancelled it before it ran (then it never runs)."""
        return start_future(self.future)


@dataclass
class _Unanswered:
    """A commit that ended without an answer (its callers were told it failed), and what to
    tell if a takeover finds it committed: see :func:`late_commit_hook`."""

    kafka_topic: str
    audited: list[tuple[LateCommitHook, int, list[bytes]]]
    """What :func:`_audited` found in it (not empty)."""
    noted_at: float = field(default_factory=time.monotonic)

    @property
    def probe_offset(self) -> int:
        """Where its first audited record went, if it was committed."""
        return self.audited[0][1]

    @property
    def probe_value(self) -> bytes:
        return self.audited[0][2][0]

    @property
    def records(self) -> int:
        return sum(len(records) for _hook, _first, records in self.audited)


_UNANSWERED_KEPT_S = 600.0
"""An unanswered commit not settled within this (Kafka did not complete or abort it, nobody
wrote to its partition since) is forgotten."""
_SETTLE_EVERY_S = 2.0


def _left_unsettled(key: tuple[str, int], unanswered: _Unanswered, why: str) -> None:
    log.warning(
        "%s/%d: not known whether a commit answered as failed (%d records) went through (%s); "
        "if it did, the audit does not count them",
        *key,
        unanswered.records,
        why,
    )


class _NotWhereExpected(StoreUnavailable):
    """Records delivered at other offsets than expected: their transaction is aborted."""


def _audited(
    base: int,
    values: list[bytes],
    outcomes: list[tuple[Pending, AppendResult | None, BaseException | None]],
) -> list[tuple[LateCommitHook, int, list[bytes]]]:
    """(hook, first offset, records) of each audited transaction of a commit (see
    :func:`late_commit_hook`) that wrote records."""
    found = []
    for txn, result, error in outcomes:
        hook = late_commit_hook(txn.fn) if error is None else None
        if hook is not None and result is not None and result.count:
            records = values[result.first_offset - base : result.last_offset - base + 1]
            found.append((hook, result.first_offset, records))
    return found


def _tell_committed(topic: str, audited: list[tuple[LateCommitHook, int, list[bytes]]]) -> None:
    """Tell the audited transactions of a commit that went through although their callers
    are answered failed."""
    for hook, _first, records in audited:
        try:
            hook(topic, records)
        except Exception:
            log.exception("a late-commit hook of %s failed", topic)


Retry = Callable[["PartitionOwner", Pending, BaseException], None]
"""What an owner does with a transaction it could not run because it lost the partition."""


_FENCING = tuple(
    KafkaError(code).str()
    for code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
)
"""What librdkafka's lines about a fenced producer say: ``FATAL ... Fatal error: Local: This
instance has been fenced by a newer instance``, ``TXNERR ... (_FENCED)`` and ``ADDPARTS ...
Broker: Producer attempted an operation with an old epoch``."""


class _ProducerLog:
    """The librdkafka ``logger`` of an owner's producer: its lines, named by the partition,
    go to the Python logger ``log_store.kafka.librdkafka``, librdkafka's FATAL and TXNERR at
    CRITICAL, the others (a failed connection) at DEBUG through
    ``KafkaSettings.lines``, as every client's of a gateway; lines reach
    it when the owner polls its producer, which it does while it commits.

    Except the lines of the producer being fenced, the design's way a writer learns it lost
    its partition: one line, the first, at INFO for a partition being given up (see
    :meth:`PartitionOwner.given_up`), which the old owner logs on a partition move if it was
    committing then (it used to print librdkafka's level-0 ``FATAL``, with ``TXNERR`` and
    ``ADDPARTS``, on stderr, paging whoever alerts on FATAL at every rebalance); at WARNING
    for a partition the group still gives this gateway (another writer took it over: this
    owner takes it back or forwards, and exactly-once holds); the others at DEBUG."""

    def __init__(self, owner: PartitionOwner) -> None:
        self._owner = owner
        self._fenced = False

    def log(self, level: int, msg: str, *args: object) -> None:
        text = (msg % args) if args else msg
        owner = self._owner
        said = next((fenced for fenced in _FENCING if fenced in text), None)
        if said is None and level >= logging.CRITICAL:
            DEBUG_LOG.logger.log(level, "%s/%d: %s", owner.topic, owner.partition, text)
        elif said is None:
            # a broker not reached, and the like: the gateway says it once for all clients
            owner._settings.lines.log(level, "%s/%d: %s", owner.topic, owner.partition, text)
        elif self._fenced:
            DEBUG_LOG.logger.debug("%s/%d: %s", owner.topic, owner.partition, text)
        elif owner.given_up():
            self._fenced = True
            DEBUG_LOG.logger.info(
                "%s/%d: its writer here was fenced by the partition's next owner, as expected "
                "of a partition given up (%s)",
                owner.topic,
                owner.partition,
                said,
            )
        else:
            self._fenced = True
            DEBUG_LOG.logger.warning(
                "%s/%d: its writer here was fenced by another writer while the gateways' group "
                "gives the partition to this gateway; taken over again by its next "
                "transaction (%s)",
                owner.topic,
                owner.partition,
                said,
            )


class PartitionOwner:
    """Owns one partition in this process until closed, fenced or its topic goes away."""

    def __init__(self, ctx: OwnerContext, topic: str, partition: int) -> None:
        self.ctx = ctx
        self.topic = topic
        self.partition = partition
        self._settings = ctx.settings
        limit = self._settings.max_message_bytes
        self._changelog_record_bytes = min(DELTA_RECORD_BYTES, SNAPSHOT_CHUNK_BYTES, limit // 4)
        """The size of the delta records and snapshot chunks this owner writes, at most."""
        self._data_record_bytes = limit - limit // 128 - 1024
        """The largest data record a transaction may hold: compressed (lz4 makes data that
        does not compress 0.4% larger) and framed, it still fits ``max.message.bytes``."""
        self._pending: list[Pending] = []
        self._cond = threading.Condition()
        self._closing = False
        self.closed = False
        self._thread: threading.Thread | None = None
        # Set by a takeover (and used by the committer thread only, apart from reads):
        self.broken = True
        self.topic_id: str | None = None
        self.topic_seen_at = 0.0
        """When (monotonic) the takeover last looked at the topic ``topic_id`` names."""
        self._kafka: KafkaTopic | None = None
        self._state_topic = ""
        self._producer: Producer | None = None
        self._table: dict[str, bytes] = {}
        self._table_lock = threading.Lock()
        self._table_changed = threading.Condition(self._table_lock)
        self._writing = False
        self._generation = 0
        self._proved_generation = 0
        self._takeovers = 0
        """The generation at the end of this writer's last successful commit."""
        self._next_offset = 0
        self._state_end = 0
        self._tail_records = 0
        self._tail_entries = 0
        self._failed_at: float | None = None
        self._failure: LogbrokerError | None = None
        self.takeover_seconds: float | None = None
        self.ready = threading.Event()
        self._takeover_started = False
        self._fatal: KafkaError | None = None
        self._acks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ack_thread: threading.Thread | None = None
        self._commits = 0
        """Commits handed to the acknowledger (written by the committer thread only)."""
        self._visible_commits = 0
        """Of those, how many the acknowledger has seen readable (their markers written)."""
        self._visibility = threading.Condition()
        self.committed_end = 0
        """The data partition's end after this writer's last commit, from when its commit
        request is sent (set back if the commit fails), or as the takeover found it: a
        changelog delta naming an end up to this is this writer's (or older, readable)."""
        self.readable_end = 0
        """The data partition's end as far as read_committed readers see it: after the last
        commit the acknowledger saw readable (or as the takeover found it)."""
        self._commit_sent = False
        """The running transaction's commit request was handed to librdkafka."""

    # -- life ---------------------------------------------------------------------------------
    def start(self, *, eager: bool = False) -> PartitionOwner:
        """Start the committer thread; ``eager`` takes the partition over at once."""
        self._takeover_started = eager
        self._ack_thread = threading.Thread(
            target=self._acknowledge,
            name=f"logbroker-acks {self.topic}/{self.partition}",
            daemon=True,
        )
        self._ack_thread.start()
        self._thread = threading.Thread(
            target=self._run,
            args=(eager,),
            name=f"logbroker-owner {self.topic}/{self.partition}",
            daemon=True,
        )
        self._thread.start()
        return self

    @property
    def taking_over(self) -> bool:
        """Whether its first takeover is under way (started eagerly, or for a transaction):
        not done, not failed, not closed.  Such an owner is about to be ready, not gone."""
        return (
            self._takeover_started
            and not self.ready.is_set()
            and self._failure is None
            and not self.closed
        )

    def wait_ready(self, timeout_s: float) -> None:
        """Return once this owner has taken the partition over, within ``timeout_s``
        (``StoreUnavailable`` after it); the ``UnknownTopic`` its takeover failed with, at
        once, if the topic is gone (it used to be waited for until the timeout)."""
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(max(0.0, min(0.05, deadline - time.monotonic()))):
            failure = self._failure
            if isinstance(failure, UnknownTopic):  # PartitionGone included
                raise failure
            if self.closed:
                raise StoreUnavailable(f"{self.topic}/{self.partition} is no longer owned here")
            if time.monotonic() >= deadline:
                raise StoreUnavailable(
                    f"taking over {self.topic}/{self.partition} takes too long; retry"
                )

    def submit(self, txn: Pending) -> None:
        """Queue ``txn`` for the next commit; its future resolves after it."""
        with self._cond:
            if self._closing:
                raise OwnerGone(f"{self.topic}/{self.partition} is no longer owned here")
            self._pending.append(txn)
            self._takeover_started = True  # the committer takes it over for this
            self._cond.notify()

    def close(self, *, wait: bool = True, timeout_s: float | None = None) -> None:
        """Stop taking transactions; commit what is queued; let the producer go.

        ``wait``: for the owner's threads, ``timeout_s`` at most in all (``None``: three
        operation timeouts each)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in (self._thread, self._ack_thread):
            if wait and thread is not None and thread is not threading.current_thread():
                if deadline is None:
                    thread.join(self._settings.operation_timeout_s * 3)
                else:
                    thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, eager: bool) -> None:
        try:
            if eager:
                self._try_takeover()
            while True:
                if not self._wait_for_work(eager):
                    return
                self._await_markers()
                with self._cond:
                    group, self._pending = self._take_group()
                if not group:
                    continue
                if self.broken and not self._try_takeover():
                    failure = self._failure or StoreUnavailable("Kafka is unavailable")
                    for txn in group:
                        if txn.start():
                            txn.future.set_exception(failure)
                    if isinstance(failure, UnknownTopic | UnknownPartition):
                        self._stop(failure)
                        return
                    continue
                self._commit(group)
        except BaseException as exc:
            log.exception("owner of %s/%d failed", self.topic, self.partition)
            self._stop(OwnerGone(f"owner of {self.topic}/{self.partition} failed: {exc}"))
        finally:
            self._stop(OwnerGone(f"{self.topic}/{self.partition} is no longer owned here"))
            self._acks.put(None)

    def _wait_for_work(self, eager: bool) -> bool:
        """Wait until a transaction is queued (True) or the owner closes with none (False).

        An ``eager`` owner (its gateway was given the partition) whose first takeover failed,
        with Kafka away or answering errors, tries again meanwhile, until it succeeds: only a
        successful takeover announces this gateway as the owner.  Before, it waited for a
        transaction to arrive here, and none did: the other gateways, finding no owner
        announced, answered writes of the partition 503 "no gateway owns" for as long as it
        lasted.  An owner that took the partition over once is not retried here: a failure
        after that (fenced by another writer, most likely) is retried by the next transaction,
        which its standing announcement brings.
        """
        delay = _FAILED_TAKEOVER_PAUSE_S
        while True:
            retrying = (
                eager
                and self.broken
                and self._takeovers == 0
                and not isinstance(self._failure, UnknownTopic | UnknownPartition)
            )
            with self._cond:
                if not self._pending and not self._closing:
                    self._cond.wait(delay if retrying else None)
                if self._pending or self._closing:
                    return bool(self._pending)
            if retrying:
                log.info("taking over %s/%d again", self.topic, self.partition)
                self._try_takeover()
                delay = min(delay * 2, _GIVEN_TAKEOVER_RETRY_MAX_S)

    def _await_markers(self) -> None:
        """Wait, at most :data:`_MARKER_WAIT_S`, until the previous commit's markers are written.

        Kafka's transaction coordinator answers a commit before it has written the commit
        markers into the partitions; until it has, it refuses to add the partitions to this
        writer's next transaction (``CONCURRENT_TRANSACTIONS``), and librdkafka then retries
        only after a fixed 20 ms.  Starting the next transaction once the acknowledger sees
        the previous one readable (a few ms) avoids that pause, and what arrives meanwhile
        joins the group (measured here with back-to-back 1 MiB transactions of one producer:
        a cycle of 31 ms became 15 ms, and the 20 ms pauses went from half of them to few).
        """
        wanted = self._commits
        deadline = time.monotonic() + _MARKER_WAIT_S
        with self._visibility:
            while self._visible_commits < wanted:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._visibility.wait(remaining)

    def _take_group(self) -> tuple[list[Pending], list[Pending]]:
        """The queued transactions one Kafka transaction takes; the rest wait for the next."""
        return self._pending[:_MAX_GROUP], self._pending[_MAX_GROUP:]

    def _stop(self, reason: LogbrokerError) -> None:
        with self._cond:
            self._closing = True
            left, self._pending = self._pending, []
        for txn in left:
            if not txn.start():
                continue
            if isinstance(reason, OwnerGone):
                self.ctx.retry(self, txn, reason)
            else:
                txn.future.set_exception(reason)
        self._drop_producer()
        self.broken = True
        self.closed = True

    # -- takeover -----------------------------------------------------------------------------
    def _try_takeover(self) -> bool:
        now = time.monotonic()
        if self._failed_at is not None and now - self._failed_at < _FAILED_TAKEOVER_PAUSE_S:
            return False  # failing fast while Kafka is away: every caller gets a quick 503
        try:
            self._take_over()
        except LogbrokerError as exc:
            self._failed_at = time.monotonic()
            self._failure = exc
            self.ctx.commits.refused(exc)
            log.warning("taking over %s/%d failed: %s", self.topic, self.partition, exc)
            return False
        except Exception as exc:
            self._failed_at = time.monotonic()
            self._failure = as_store_error(exc, f"taking over {self.topic}/{self.partition}")
            self.ctx.commits.refused(self._failure)
            log.warning("taking over %s/%d failed: %s", self.topic, self.partition, exc)
            return False
        self._failed_at = None
        self._failure = None
        return True

    def _take_over(self) -> None:
        started = time.monotonic()
        self._takeover_started = True
        self._drop_producer()
        ctx = self.ctx
        timeout = self._settings.operation_timeout_s
        kafka = ctx.admin.describe(self.topic)
        if self.partition >= kafka.partitions:
            raise PartitionGone(
                f"topic {self.topic!r} has partitions 0..{kafka.partitions - 1}, "
                f"not {self.partition}"
            )
        if self.topic_id is not None and kafka.topic_id != self.topic_id:
            raise UnknownTopic(f"topic {self.topic!r} was deleted (and maybe created again)")
        state_topic, created = ctx.admin.ensure_state_topic(kafka)
        txn_id = naming.transactional_id(self._settings.namespace, self.topic, self.partition)
        self._fatal = None
        config = {**self._settings.producer_config(txn_id), "error_cb": self._on_client_error}
        if self._settings.librdkafka_log == "gateway":
            config["logger"] = _ProducerLog(self)
        producer = Producer(config)
        try:
            # Connected first: librdkafka otherwise waits half a second for a broker to ask
            # for the transaction coordinator.
            producer.list_topics(kafka.kafka_name, timeout=timeout)
            producer.init_transactions(timeout)
        except KafkaException as exc:
            raise as_store_error(exc, f"fencing earlier writers of {self.topic}") from exc
        # The topic looked at above may have been deleted since (and made again: the data
        # topic is written by name).  A deletion fences the writers first; one that fenced
        # after it, as here, looks again, or it would write the new topic's partition with the
        # deleted one's table, its state changes into a state topic it may just have made
        # again (that one is deleted again).
        seen_at = time.monotonic()
        try:
            now = ctx.admin.describe(self.topic).topic_id
        except UnknownTopic:
            now = None
        if now != kafka.topic_id:
            if created:
                ctx.admin.delete_state_topic(kafka)
            raise UnknownTopic(f"topic {self.topic!r} was deleted (and maybe created again)")
        # From here on no earlier writer can commit: the changelog and the data end are final.
        # The topic may still be deleted now (this writer took over between the deletion's
        # fence and the deletion): a partition the topic made again lacks would be asked for
        # until the operation timeout, holding the partition's writes.
        gone = self._gone_look(kafka.topic_id)
        low, end = ctx.watermarks.get(state_topic, self.partition, "the state changelog", gone=gone)
        snapshot = ctx.committed_snapshot(state_topic, self.partition)
        if snapshot is not None and snapshot < low:
            raise StoreUnavailable(
                f"the state changelog of {self.topic}/{self.partition} starts at {low}, "
                f"after its snapshot at {snapshot}"
            )
        replayed = ReplayedState(position=low if snapshot is None else snapshot)
        try:
            ctx.fetchers.replay(
                state_topic,
                self.partition,
                replayed.position,
                end,
                replayed.apply,
                what=f"the state of {self.topic}/{self.partition}",
            )
        except OffsetOutOfRange as exc:
            # a reader's answer (416), never a writer's: the changelog moved under the
            # takeover (its topic deleted and made again); the write is retried (503)
            raise StoreUnavailable(
                f"the state of {self.topic}/{self.partition} moved while it was taken over "
                f"({exc}); retry"
            ) from exc
        _data_low, data_end = ctx.watermarks.get(
            kafka.kafka_name, self.partition, "the data", gone=gone
        )
        if replayed.data_end is not None and replayed.data_end > data_end:
            raise StoreUnavailable(
                f"{self.topic}/{self.partition}: the changelog says the data ends at "
                f"{replayed.data_end}, Kafka says {data_end}"
            )
        with self._table_lock:
            self._table = replayed.table
            self._state_end = end
            self._next_offset = data_end
            self._takeovers += 1
        # the last stable offset, so readable (commits still acknowledged meanwhile are below)
        self.committed_end = max(self.committed_end, data_end)
        self.readable_end = max(self.readable_end, data_end)
        self._producer = producer
        self._kafka = kafka
        self._state_topic = state_topic
        self.topic_id = kafka.topic_id
        self.topic_seen_at = seen_at
        self._tail_records = replayed.tail_records
        self._tail_entries = replayed.tail_entries
        self.broken = False
        self.takeover_seconds = time.monotonic() - started
        self.ready.set()
        log.info(
            "took over %s/%d in %.3f s (%d state entries, data end %d)",
            self.topic,
            self.partition,
            self.takeover_seconds,
            len(self._table),
            data_end,
        )
        ctx.on_takeover(self.topic, self.partition, self.takeover_seconds, len(self._table))
        unanswered = ctx.unanswered(self.topic, self.partition)
        if unanswered is not None:
            ctx.settle(self.topic, self.partition, unanswered, final=True, gone=gone)

    def given_up(self) -> bool:
        """Whether this owner is letting its partition go: closing, or the partition is no
        longer this gateway's (the group gave it to another, or the process writes on demand:
        a fence means another process wrote the partition, and this one gives it up)."""
        return self._closing or not self.ctx.assigned(self.topic, self.partition)

    def _on_client_error(self, error: KafkaError) -> None:
        """librdkafka's fatal errors (a fenced producer above all) arrive here, not raised;
        the others (a broker not reached) go where every client's go (``CLIENT_LINES``)."""
        if error.fatal():
            self._fatal = error
        elif self._settings.librdkafka_log == "gateway":
            self._settings.lines.error(error)

    def _failure_of(self, exc: BaseException, what: str) -> LogbrokerError:
        """The error a failed Kafka call means, knowing what the producer reported."""
        if self._fatal is not None and is_fenced(self._fatal):
            return WriterFenced(f"{what}: {self._fatal}")
        if self._fatal is not None:
            return WriterFenced(f"{what}: {self._fatal}")
        return as_commit_error(exc, what)

    def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.purge()
                producer.flush(0)
            except Exception:  # a producer that is fenced or broken is dropped all the same
                log.debug("dropping the producer of %s/%d", self.topic, self.partition)

    # -- reads of the state ---------------------------------------------------------------------
    def state_items(self, prefix: str) -> list[tuple[str, bytes]]:
        """The entries of this owner's table whose key starts with ``prefix``, unordered.

        A look without the proof :meth:`read_state` gives: the table may be stale (this owner
        fenced meanwhile).  For finding candidates that a transaction checks again (idle
        source expiry), never for answering a caller."""
        if self.broken or self.closed or self._kafka is None:
            raise OwnerGone(f"{self.topic}/{self.partition} is not owned here right now")
        with self._table_lock:
            return [(k, v) for k, v in self._table.items() if k.startswith(prefix)]

    def _topic_id_value(self) -> bytes | None:
        """What :data:`TOPIC_ID_KEY` reads as: the id of the topic this owner took over."""
        return None if self.topic_id is None else self.topic_id.encode()

    def ends_known(self, changelog: str) -> tuple[int, int] | None:
        """(:attr:`committed_end`, :attr:`readable_end`) if this owner writes the topic whose
        changelog is ``changelog`` (that identity of it) and is not closed; else None."""
        if self.closed or self._state_topic != changelog:
            return None
        return self.committed_end, self.readable_end

    def read_state(self, keys: Sequence[str]) -> tuple[dict[str, bytes | None], int]:
        """Current values of ``keys`` and the next data offset, if this owner is still current.

        Current means no other writer has committed to the partition since the values were
        taken.  Another writer must fence this one before it can commit, and a fenced writer
        commits nothing more, so either proof will do: a commit of this owner that began after
        the values were taken succeeded (under load: no extra request, no waiting for a
        pause), or, while no commit is in flight, the changelog's last stable offset is still
        where this owner's last commit left it.  Otherwise this owner is stale and
        :class:`OwnerGone` is raised.
        """
        deadline = time.monotonic() + self._settings.operation_timeout_s
        values: dict[str, bytes | None] = {}
        next_offset = proof = 0
        takeovers = -1
        while True:
            if self.broken or self.closed or self._kafka is None:
                raise OwnerGone(f"{self.topic}/{self.partition} is not owned here right now")
            with self._table_lock:
                if self._takeovers != takeovers:
                    # first look, or the table was replaced by a takeover since: (re)read it
                    values = {key: self._table.get(key) for key in keys}
                    if TOPIC_ID_KEY in values:
                        values[TOPIC_ID_KEY] = self._topic_id_value()
                    next_offset = self._next_offset
                    # a commit that begins after this point ends at this generation or later
                    proof = self._generation + (3 if self._writing else 2)
                    takeovers = self._takeovers
                if self._proved_generation >= proof:
                    return values, next_offset
                idle = not self._writing
                generation = self._generation
            if idle:
                _low, end = self.ctx.watermarks.get(self._state_topic, self.partition, "state")
                with self._table_lock:
                    # our own commit between the two looks would pass for someone else's
                    if self._generation == generation and not self._writing:
                        if end > self._state_end:
                            self.broken = True
                            raise OwnerGone(
                                f"another writer committed to {self.topic}/{self.partition}"
                            )
                        return {key: self._table.get(key) for key in keys}, self._next_offset
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StoreUnavailable(f"{self.topic}/{self.partition} is too busy to be read")
            with self._table_lock:
                if self._generation == generation and self._takeovers == takeovers:
                    self._table_changed.wait(min(remaining, 0.05))

    def _writing_changelog(self, writing: bool, *, committed: bool = False) -> None:
        """Mark a commit of this writer in flight, or over (``committed`` if it succeeded),
        for :meth:`read_state`."""
        with self._table_lock:
            self._writing = writing
            self._generation += 1
            if committed:
                self._proved_generation = self._generation
            self._table_changed.notify_all()

    # -- group commit -----------------------------------------------------------------------
    def _commit(self, group: list[Pending]) -> None:
        group = [txn for txn in group if txn.start()]
        if not group:
            return
        changes: dict[str, bytes] = {}
        values: list[bytes] = []
        outcomes: list[tuple[Pending, AppendResult | None, BaseException | None]] = []
        base = self._next_offset
        for txn in group:
            state = _TxnState(self._table, changes, base + len(values), self._topic_id_value())
            try:
                produced = [bytes(v) for v in txn.fn(state)]
            except Exception as exc:  # the transaction's own failure; the others go on
                outcomes.append((txn, None, exc))
                continue
            too_large = self._too_large(produced)
            if too_large is not None:
                # refused before Kafka sees it: Kafka would refuse it on every attempt
                outcomes.append((txn, None, too_large))
                continue
            changes.update(state.local)
            first = base + len(values)
            values.extend(produced)
            outcomes.append((txn, AppendResult(first, base + len(values) - 1), None))
        if values or changes:
            self._writing_changelog(True)
            try:
                delta_offset = self._run_transaction(base, values, changes)
            except BaseException as exc:
                self._writing_changelog(False)
                failure = (
                    exc if isinstance(exc, LogbrokerError) else self._failure_of(exc, "commit")
                )
                # The failure goes to the callers (and their retries): without its frames,
                # which hold this commit's records, delta and producer in a reference cycle
                # until the garbage collector's next full pass (measured in a test: three
                # failed attempts' records and deltas were held until gc.collect())
                without_tracebacks(failure)
                self.broken = True
                self._failed_at = None
                if not isinstance(failure, WriterFenced) and self._topic_gone():
                    failure = UnknownTopic(f"topic {self.topic!r} was deleted")
                self.ctx.commits.refused(failure)
                if (
                    values
                    and self._commit_sent
                    and not isinstance(failure, UnknownTopic | RecordTooLarge)
                ):
                    # The commit request went out: it may have gone through, even with a
                    # fenced error (a coordinator that had prepared the commit completes it
                    # when the next writer fences this one).  A takeover here reads it.  (A
                    # record refused makes the transaction abortable: librdkafka refuses to
                    # commit it, and keeping its records to look for them would only hold
                    # them.)
                    assert self._kafka is not None
                    audited = _audited(base, values, outcomes)
                    if audited:
                        unanswered = _Unanswered(self._kafka.kafka_name, audited)
                        self.ctx.note_unanswered(self.topic, self.partition, unanswered)
                for txn, _result, error in outcomes:
                    if error is not None:
                        txn.future.set_exception(error)
                    elif isinstance(failure, WriterFenced):
                        self.ctx.retry(self, txn, failure)
                    else:
                        txn.future.set_exception(failure)
                return
            with self._table_lock:
                apply_changes(self._table, changes)
                self._state_end = delta_offset + 2
                self._next_offset = base + len(values) + (1 if values else 0)
            self.committed_end = max(self.committed_end, self._next_offset)
            self._writing_changelog(False, committed=True)
            self._tail_records += 1
            self._tail_entries += len(changes)
            assert self._kafka is not None
            if values:
                visible = (self._kafka.kafka_name, base + len(values))
            else:
                visible = (self._state_topic, delta_offset + 1)
            # answered by the acknowledger once readers can see the commit; meanwhile this
            # thread goes on with the next transaction
            self._commits += 1
            # the data end readers see once the acknowledger sees ``visible`` (0: no records)
            self._acks.put((outcomes, visible, self._commits, self._next_offset if values else 0))
            self.ctx.commits.add(sum(1 for _t, _r, error in outcomes if error is None), len(values))
        else:
            self._acks.put((outcomes, None, 0, 0))
        self._maybe_snapshot()

    def _topic_gone(self, timeout_s: float | None = None, topic_id: str | None = None) -> bool:
        """True if the topic this owner writes (or the one of ``topic_id``) was deleted (or
        deleted and created again); False also if Kafka does not say within ``timeout_s``
        (default: the operation timeout)."""
        wanted = self.topic_id if topic_id is None else topic_id
        try:
            return self.ctx.admin.describe(self.topic, timeout_s=timeout_s).topic_id != wanted
        except UnknownTopic:
            return True
        except LogbrokerError:
            return False

    def _gone_look(self, topic_id: str | None = None) -> Callable[[], bool]:
        """What a wait for Kafka asks now and then (see ``Watermarks.get``): whether the topic
        this owner writes (or the one of ``topic_id``) was deleted, asked of Kafka within
        :data:`_IDENTITY_LOOK_TIMEOUT_S`."""
        return lambda: self._topic_gone(_IDENTITY_LOOK_TIMEOUT_S, topic_id)

    def _produce(
        self,
        topic: str,
        value: bytes,
        on_delivery: Callable[[object, object], None] | None,
    ) -> None:
        producer = self._producer
        assert producer is not None
        while True:
            try:
                if on_delivery is None:
                    producer.produce(topic, value, partition=self.partition)
                else:
                    producer.produce(
                        topic, value, partition=self.partition, on_delivery=on_delivery
                    )
                return
            except BufferError:
                producer.poll(0.01)

    def _too_large(self, records: Sequence[bytes]) -> RecordTooLarge | None:
        """The refusal of a transaction holding a record the topic would not take, if it does."""
        largest = max(map(len, records), default=0)
        if largest <= self._data_record_bytes:
            return None
        return RecordTooLarge(
            f"a record of {largest} bytes for {self.topic}/{self.partition}; at most "
            f"{self._data_record_bytes} bytes go in one record (the topics' max.message.bytes "
            f"is {self._settings.max_message_bytes}); nothing of it was written"
        )

    def _run_transaction(self, base: int, values: list[bytes], changes: Mapping[str, bytes]) -> int:
        """Produce ``values`` and the delta in one Kafka transaction and commit it.

        Returns the offset of the (last) delta record.  On any failure the transaction is
        aborted (or left to the next takeover to settle) and the error is raised.
        """
        producer = self._producer
        kafka = self._kafka
        assert producer is not None and kafka is not None
        timeout = self._settings.operation_timeout_s
        offsets: dict[str, int] = {}
        errors: list[object] = []

        def note(name: str) -> Callable[[object, object], None]:
            def callback(err: object, msg: object) -> None:
                if err is not None:
                    errors.append(err)
                else:
                    offsets[name] = msg.offset()  # type: ignore[attr-defined]

            return callback

        def refused(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(err)

        data_end = base + len(values) + (1 if values else 0)
        self._commit_sent = False
        committed_end = self.committed_end
        try:
            producer.begin_transaction()
            last = len(values) - 1
            for i, value in enumerate(values):
                callback = note("first") if i == 0 else note("last") if i == last else None
                self._produce(kafka.kafka_name, value, callback)
            deltas = delta_records(data_end, changes, self._changelog_record_bytes)
            for i, delta in enumerate(deltas):
                # each part with a report: a part refused (too large) is named as such
                self._produce(
                    self._state_topic, delta, note("delta") if i == len(deltas) - 1 else refused
                )
            del deltas, delta  # librdkafka holds copies
            # Delivered before the commit, to see where (see _check_placement); a topic
            # deleted meanwhile is noticed within a second (see _await_deliveries)
            deadline = time.monotonic() + timeout
            self._await_deliveries(producer, len(values), offsets, errors, deadline)
            if values and not errors and "first" in offsets:
                self._check_placement(base, len(values), offsets)
            # commit_transaction fails if a record was refused
            self._commit_sent = True
            # its delta can be readable before commit_transaction returns (the append tail
            # asks, see ``ends_known``)
            self.committed_end = max(committed_end, data_end)
            producer.commit_transaction(max(0.1, deadline - time.monotonic()))
        except BaseException as exc:
            self.committed_end = committed_end  # a delta it made readable is asked of Kafka
            error = kafka_error(exc)
            if error is not None and error.code() == KafkaError._STATE and not self._commit_sent:
                cause = self._refused_transaction_error(producer)
                if cause is not None:
                    errors.append(cause)
            timed_out = error is not None and error.code() == KafkaError._TIMED_OUT
            if not (self._commit_sent and timed_out):
                # a commit that timed out goes on in the background: librdkafka refuses to
                # abort it, and the next takeover settles it
                self._abort_quietly()
            failure = self._failure_of(exc, f"committing to {self.topic}")
            too_large = next(
                (e for e in errors if isinstance(e, KafkaError) and is_too_large(e)), None
            )
            if too_large is not None and not is_fenced(self._fatal):
                # the commit's own error may say only that a record failed
                failure = RecordTooLarge(
                    f"committing to {self.topic}: a record is larger than the topic takes "
                    f"({too_large})"
                )
            elif isinstance(exc, LogbrokerError) and not isinstance(failure, WriterFenced):
                raise
            raise failure from exc
        producer.poll(0)  # any delivery report not served yet
        if errors or "delta" not in offsets or (values and "first" not in offsets):
            raise StoreUnavailable(f"a committed record has no delivery report: {errors[:1]}")
        return offsets["delta"]

    def _refused_transaction_error(self, producer: Producer) -> KafkaError | None:
        """Why ``produce`` refused to go on with the transaction (``_STATE``), if it says.

        A record Kafka refused (too large, say) puts the transaction in an abortable state,
        and ``produce`` then answers only "Erroneous state".  ``commit_transaction`` answers
        the error itself, at once and without committing: librdkafka commits only a
        transaction in progress, which this one no longer is (nor can be again before
        it is aborted)."""
        if self._fatal is not None:
            return None
        try:
            producer.commit_transaction(min(1.0, self._settings.operation_timeout_s))
        except KafkaException as exc:
            return kafka_error(exc)
        except Exception:
            return None
        # not expected (see above): whatever it committed, the next takeover reads it
        self._commit_sent = True
        return None

    def _await_deliveries(
        self,
        producer: Producer,
        count: int,
        offsets: Mapping[str, int],
        errors: Sequence[object],
        deadline: float,
    ) -> None:
        """Serve delivery reports until every record of the transaction (``count`` data
        records and the delta) has one, or a record or the producer failed (the commit then
        fails as it did without this wait).  Waiting longer than :data:`_IDENTITY_LOOK_S`,
        it looks at the topic's identity every second: records of a deleted topic may
        never be delivered (librdkafka keeps them for ``message.timeout.ms``), and such a
        transaction is answered ``UnknownTopic`` and aborted."""
        wanted = {"delta"}
        if count:
            wanted.add("first" if count == 1 else "last")
        look_at = time.monotonic() + _IDENTITY_LOOK_S
        while not errors and self._fatal is None and not wanted <= offsets.keys():
            now = time.monotonic()
            if now >= deadline:
                raise StoreUnavailable(f"records of {self.topic} not delivered in time")
            if now >= look_at:
                look_at = now + _DELIVERY_LOOK_EVERY_S
                if self._topic_gone(_IDENTITY_LOOK_TIMEOUT_S):
                    raise UnknownTopic(
                        f"topic {self.topic!r} was deleted while its records were on their way"
                    )
            producer.poll(max(0.0, min(deadline, look_at) - time.monotonic()))

    def _check_placement(self, base: int, count: int, offsets: Mapping[str, int]) -> None:
        """Raise, to have the transaction aborted, unless its ``count`` delivered records are
        at ``base`` on, in the topic this owner took over.

        The data topic is written by name.  A transaction in flight when its topic is deleted
        and made again can have its state update in the deleted topic's changelog (named by
        topic id) and its records in the new topic: librdkafka retries a produce the name has
        no topic for until it has one again.  Committed, those records would be in the new
        topic with no trace in its seqno table, and the caller, told the write failed, would
        write them again.  The new topic's partition is empty until its own owner's takeover
        fences this one, so such records are at offset 0, not at ``base``; where ``base`` is
        0 as well, the topic's identity is asked of Kafka (once in a partition's life).
        """
        first = offsets["first"]
        last = offsets.get("last", first)
        if first != base or last != base + count - 1:
            raise _NotWhereExpected(
                f"{self.topic}/{self.partition}: records were delivered at offsets "
                f"{first}..{last}, not {base}..{base + count - 1}; not committed"
            )
        if base == 0 and self._topic_gone(_IDENTITY_LOOK_TIMEOUT_S):
            raise UnknownTopic(f"topic {self.topic!r} was deleted; not committed")

    def _abort_quietly(self) -> None:
        producer = self._producer
        if producer is None:
            return
        try:
            producer.abort_transaction(min(5.0, self._settings.operation_timeout_s))
        except Exception as exc:  # the next takeover settles whatever is left open
            log.debug("abort of %s/%d failed: %s", self.topic, self.partition, exc)

    def _acknowledge(self) -> None:
        """Answer each commit's callers, in commit order, once read_committed readers see it
        (its markers are written): an acked chunk is readable by every reader at once."""
        while True:
            item = self._acks.get()
            if item is None:
                return
            outcomes, visible, commit, data_end = item
            gone: UnknownTopic | None = None
            if visible is not None:
                try:
                    if self._await_visible(*visible):
                        self.readable_end = max(self.readable_end, data_end)
                except UnknownTopic as exc:
                    gone = exc
                except Exception as exc:  # a store closing under us: the commit stands
                    log.debug("visibility of %s/%d: %s", self.topic, self.partition, exc)
                with self._visibility:
                    self._visible_commits = commit
                    self._visibility.notify_all()
            for txn, result, error in outcomes:
                if error is not None:
                    txn.future.set_exception(error)
                elif gone is not None:
                    # committed into a topic deleted before readers saw it: its records went
                    # with it, so the caller is not told they are written (the gateway writes
                    # them again, into the topic made again)
                    txn.future.set_exception(gone)
                else:
                    assert result is not None
                    txn.future.set_result(result)

    def _await_visible(self, topic: str, wanted: int) -> bool:
        """Return True once readers see a commit ending before ``wanted`` in ``topic`` (False
        after the operation timeout, or Kafka not answering: the commit stands); raise
        ``UnknownTopic`` if the topic was deleted before they did.

        Ends are asked by name, and a topic deleted and made again has the old one's name:
        a commit the new topic's end stays below is looked up by identity now and then, so a
        commit into a deleted topic is never acknowledged as written (after the deletion was
        answered, with its records gone), nor waited for until the timeout (also not while
        Kafka answers it knows no such partition: the topic made again lacks it)."""
        started = time.monotonic()
        deadline = started + self._settings.operation_timeout_s
        identity_look = started + _IDENTITY_LOOK_S
        pause = 0.0005
        while True:
            self.ctx.commits.looked()
            try:
                _low, end = self.ctx.watermarks.get(
                    topic, self.partition, "visibility", gone=self._gone_look()
                )
            except LogbrokerError as exc:
                if self._topic_gone(_IDENTITY_LOOK_TIMEOUT_S):
                    raise UnknownTopic(
                        f"topic {self.topic!r} was deleted before its commit was readable"
                    ) from None
                log.warning("cannot see the commit of %s/%d: %s", self.topic, self.partition, exc)
                return False
            if end >= wanted:
                return True
            now = time.monotonic()
            if now >= identity_look or now > deadline:
                identity_look = now + _IDENTITY_LOOK_S
                if self._topic_gone(_IDENTITY_LOOK_TIMEOUT_S):
                    raise UnknownTopic(
                        f"topic {self.topic!r} was deleted before its commit was readable"
                    )
            if now > deadline:
                return False
            time.sleep(pause)
            # the markers usually take 1-5 ms; the next transaction of the partition waits
            # for them (see _await_markers), so the look is repeated often, not backed off
            pause = min(pause * 2, 0.002)

    # -- snapshots ------------------------------------------------------------------------------
    def _maybe_snapshot(self) -> None:
        cost = self._tail_entries + 8 * self._tail_records
        if cost < max(self._settings.snapshot_min_entries, len(self._table)):
            return
        try:
            self._snapshot()
        except Exception as exc:
            self.broken = True
            self._failed_at = None
            log.warning("snapshot of %s/%d failed: %s", self.topic, self.partition, exc)

    def _snapshot(self) -> None:
        producer = self._producer
        assert producer is not None
        timeout = self._settings.operation_timeout_s
        records = snapshot_records(self._next_offset, self._table, self._changelog_record_bytes)
        offsets: dict[str, int] = {}
        errors: list[object] = []

        def note(name: str) -> Callable[[object, object], None]:
            def callback(err: object, msg: object) -> None:
                if err is not None:
                    errors.append(err)
                else:
                    offsets[name] = msg.offset()  # type: ignore[attr-defined]

            return callback

        self._writing_changelog(True)
        try:
            producer.begin_transaction()
            for i, record in enumerate(records):
                callback = (
                    note("first") if i == 0 else note("last") if i == len(records) - 1 else None
                )
                self._produce(self._state_topic, record, callback)
            if producer.flush(timeout) > 0 or errors:
                raise StoreUnavailable(f"snapshot records not delivered: {errors[:1]}")
            first = offsets["first"]
            producer.send_offsets_to_transaction(
                [TopicPartition(self._state_topic, self.partition, first)],
                self.ctx.group_metadata(),
                timeout,
            )
            producer.commit_transaction(timeout)
        except BaseException:
            self._abort_quietly()
            self._writing_changelog(False)
            raise
        last = offsets.get("last", first)
        with self._table_lock:
            self._state_end = last + 2
        self._writing_changelog(False, committed=True)
        self._tail_records = 0
        self._tail_entries = 0
        self.ctx.admin.delete_records_later(self._state_topic, self.partition, first)
        log.info(
            "snapshot of %s/%d: %d entries at changelog offset %d",
            self.topic,
            self.partition,
            len(self._table),
            first,
        )
