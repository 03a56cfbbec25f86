"""The log store on Apache Kafka: the same ``LogStore`` as the embedded one, exactly once.

- Topics are Kafka topics; each has a state topic, the changelog of its partitions' state
  areas (see :mod:`log_store.kafka.state_changelog`).
- Writes run at the partition's single writer, :class:`PartitionOwner`: in this process if
  the placement says it owns the partition, else at the owner's process.
- Reads use read_committed consumers; a partition's end offset is its last stable offset.
- Topic-level state (the pins of sources to partitions) lives in the state area of a *home*
  partition chosen by a stable hash of the key over the topic's *home count*, the partition
  count when the topic's first topic-level state was written, recorded in partition 0's
  state; since that count never changes, growing the topic never moves a key's home, and the
  home partition's single writer makes put-if-absent atomic across every process.
- Idle source expiry (``session_dedup.source_expiry``) finds its candidates through
  :class:`~log_store.interface.StateScan`: each process scans the partitions it owns, and the
  deletions are transactions of the owners like any write.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec

from log_store.errors import (
    BadRequest,
    LogbrokerError,
    OffsetOutOfRange,
    PartitionUnavailable,
    StoreUnavailable,
    UnknownPartition,
    UnknownTopic,
)
from log_store.interface import (
    AppendResult,
    PartitionState,
    ReadResult,
    StoreCapabilities,
    TopicConfig,
    TopicInfo,
    TransactionFn,
    retention_after,
)
from log_store.kafka import naming
from log_store.kafka.append_tail import STATE_LOOKBACK, AppendTail, StateStart
from log_store.kafka.failures import OwnerGone, PartitionGone, WriterFenced, as_store_error
from log_store.kafka.fetcher import FetcherPool, Watermarks
from log_store.kafka.outage import KafkaOutage
from log_store.kafka.partition_owner import OwnerContext, PartitionOwner, Pending
from log_store.kafka.placement import OnDemand, Placement
from log_store.kafka.readiness import WriteReadiness
from log_store.kafka.remote_transaction import NotOwner
from log_store.kafka.settings import KafkaSettings
from log_store.kafka.state_changelog import ReplayedState
from log_store.kafka.state_scan import StateListings
from log_store.kafka.topic_admin import KafkaTopic, TopicAdmin, check_config
from log_store.topic_names import validate_topic_name

log = logging.getLogger(__name__)

TOPIC_RECORD_KEY = "__topic"
TOPIC_STATE_PREFIX = "topic/"
_MAX_ATTEMPTS = 10
STOP_GRACE_S = 1.5
"""A gateway's stop beyond one operation timeout: leaving the group, closing the clients."""
_MAX_BACKOFF_S = 2.0
_TOPIC_CACHE_S = 2.0
_INSTALLATION_ASK_S = 2.0
"""What Kafka is given to say its cluster id (asked by ``/healthz`` until it answered once)."""


def home_partition(key: str, home_count: int) -> int:
    """The partition whose state holds topic-level key ``key`` (same in every release)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % home_count


def _now_ms() -> int:
    return int(time.time() * 1000)


_BOUNDS_S = 2.0
"""What a look at the bounds of a fetch's partitions together (``reads_of``) waits for Kafka;
those it did not answer are asked one by one by their reads, as ever."""

_TAIL_END_S = 0.5
"""How long the append tail asks for the end of a partition it fetches no more (it serves
every long-poll of the gateway meanwhile)."""


class KafkaLogStore:
    """The partitioned log on Kafka.  See ``log_store.interface.LogStore`` and docs/kafka.md."""

    capabilities = StoreCapabilities(
        dense_offsets=False, store_retention=False, segment_files=False, exact_read_identity=False
    )

    def __init__(self, settings: KafkaSettings, *, placement: Placement | None = None) -> None:
        self.settings = settings
        self.placement: Placement = placement or OnDemand()
        self._admin = TopicAdmin(settings)
        self._watermarks = Watermarks(settings)
        self._fetchers = FetcherPool(settings, self._watermarks)
        self._tail = AppendTail(
            settings,
            lambda kafka_topic, partition: self._watermarks.get(
                kafka_topic, partition, "follow", timeout_s=_TAIL_END_S
            )[1],
            self._changelog_now,
            self._ends_now,
            self._ends_here,
        )
        self._ctx = OwnerContext(
            settings,
            self._admin,
            self._watermarks,
            self._fetchers,
            retry=self._retry,
            on_takeover=self._note_takeover,
            assigned=self._assigned_here,
        )
        self._owners: dict[tuple[str, int], PartitionOwner] = {}
        self._lock = threading.Lock()
        self._topics: dict[str, tuple[KafkaTopic, float]] = {}
        self._records: dict[str, dict[str, Any]] = {}
        self._replayed: dict[tuple[str, int], ReplayedState] = {}
        self._replay_lock = threading.RLock()
        self._listings = StateListings()
        self.commits = self._ctx.commits
        """Kafka transactions committed here and the callers' transactions they carried."""
        self._outage = KafkaOutage(
            lambda timeout_s: self._admin.reachable(timeout_s),
            (self._admin.serve_log, self._watermarks.serve_log, self._ctx.serve_log),
            lines=settings.lines,
        ).start()
        self._readiness = WriteReadiness(
            lambda timeout_s: self._admin.reachable(timeout_s), self.commits, self._outage
        )
        self.takeovers: deque[tuple[str, int, float, int]] = deque(maxlen=1000)
        """Recent takeovers: (topic, partition, seconds, state entries)."""
        self.takeover_listener: Callable[[str, int, float, int], None] | None = None
        self._closed = False
        self._installation: str | None = None
        self._changelog_topics: dict[str, str] = {}
        """The topic (name) of each changelog the append tail followed (see ``_ends_here``)."""
        self._looked = threading.local()
        """This thread's ``reads_of``: (topic, partition) -> (Kafka name, start, LSO)."""

    # -- Kafka away -----------------------------------------------------------------------------
    def _unless_away(self, what: str) -> None:
        """StoreUnavailable at once while Kafka is known to be away (see ``outage``): a read or
        a topic request would wait ``operation_timeout_s`` for the same answer.  Writes are
        not refused so: they go to their partition's owner as ever."""
        reason = self._outage.away()
        if reason is not None:
            raise StoreUnavailable(f"Kafka unavailable ({what}): {reason}")

    # -- topics ---------------------------------------------------------------------------------
    def _topic(self, name: str, *, fresh: bool = False) -> KafkaTopic:
        validate_topic_name(name)
        cached = self._topics.get(name)
        if cached is not None and not fresh and time.monotonic() - cached[1] < _TOPIC_CACHE_S:
            return cached[0]
        try:
            topic = self._admin.describe(name)
        except UnknownTopic:
            self._topics.pop(name, None)
            raise
        self._topics[name] = (topic, time.monotonic())
        return topic

    def _check_partition(self, name: str, partition: int) -> KafkaTopic:
        if not isinstance(partition, int) or partition < 0:
            raise UnknownPartition(f"partition must be a non-negative integer, got {partition!r}")
        topic = self._topic(name)
        if partition >= topic.partitions:
            topic = self._topic(name, fresh=True)
            if partition >= topic.partitions:
                raise UnknownPartition(
                    f"topic {name!r} has partitions 0..{topic.partitions - 1}, not {partition}"
                )
        return topic

    def check_partition(self, name: str, partition: int) -> None:
        """Raise ``UnknownTopic`` unless Kafka has the partition now (asked afresh); a topic
        found deleted is forgotten here.

        Asked for a partition a write (or a routing read) was sent to, whose owner is not
        found: a partition the topic does not have is :class:`PartitionGone` (the topic it
        was routed in was deleted and made again with fewer partitions)."""
        try:
            topic = self._topic(name, fresh=True)
        except UnknownTopic:
            self._forget_topic(name)
            raise
        if partition >= topic.partitions:
            raise PartitionGone(
                f"topic {name!r} has partitions 0..{topic.partitions - 1}, not {partition}"
            )

    def _info(self, topic: KafkaTopic, *, with_partitions: bool) -> TopicInfo:
        config = self._admin.config(topic.name)
        config = TopicConfig(
            partitions=topic.partitions,
            retention_ms=config.retention_ms,
            retention_bytes=config.retention_bytes,
            segment_bytes=config.segment_bytes,
        )
        created_ms = 0
        try:
            record = self._topic_record(topic, create=False)
            if record is not None:
                created_ms = int(record["created_ms"])
        except (StoreUnavailable, UnknownPartition) as exc:
            log.info("topic record of %s not readable now: %s", topic.name, exc)
        partitions = self._admin.partition_infos(topic) if with_partitions else []
        return TopicInfo(topic.name, topic.topic_id, config, created_ms, partitions)

    def create_topic(
        self, name: str, config: TopicConfig | None = None, *, exist_ok: bool = False
    ) -> TopicInfo:
        validate_topic_name(name)
        config = config or TopicConfig()
        check_config(config)
        self._unless_away(f"creating {name}")
        topic = self._admin.create(name, config, exist_ok=exist_ok)
        self._topics[name] = (topic, time.monotonic())
        self.placement.topics_changed()
        return self._info(topic, with_partitions=False)

    def delete_topic(self, name: str) -> None:
        validate_topic_name(name)
        self._unless_away(f"deleting {name}")
        topic = self._topic(name, fresh=True)
        with self._lock:
            owners = [o for (t, _p), o in self._owners.items() if t == name]
        for owner in owners:
            owner.close(wait=True)
        # Fence every partition's writer, wherever it runs, before the data goes: none of
        # them can commit afterwards, also not into a topic of the same name created later.
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda p: self._fence(topic, p), range(topic.partitions)))
        self._admin.delete(topic)
        self._forget_topic(name)

    def _fence(self, topic: KafkaTopic, partition: int) -> None:
        txn_id = naming.transactional_id(self.settings.namespace, topic.name, partition)
        producer = Producer(self.settings.producer_config(txn_id))
        try:
            producer.list_topics(topic.kafka_name, timeout=self.settings.operation_timeout_s)
            producer.init_transactions(self.settings.operation_timeout_s)
        except KafkaException as exc:
            raise as_store_error(exc, f"fencing the writers of {topic.name}") from exc

    def _forget_topic(self, name: str) -> None:
        self._topics.pop(name, None)
        with self._lock:
            stale = [key for key in self._owners if key[0] == name]
            for key in stale:
                self._owners.pop(key).close(wait=False)
        self._fetchers.forget(naming.data_topic(self.settings.namespace, name))

    def set_partitions(self, name: str, count: int) -> TopicInfo:
        validate_topic_name(name)
        self._unless_away(f"growing {name}")
        topic = self._topic(name, fresh=True)
        self._admin.grow(topic, count)
        self.placement.topics_changed()
        deadline = time.monotonic() + self.settings.operation_timeout_s
        while topic.partitions < count and time.monotonic() < deadline:
            time.sleep(0.05)  # the new partitions take a moment to show in the metadata
            topic = self._topic(name, fresh=True)
        return self._info(topic, with_partitions=False)

    def alter_topic(
        self,
        name: str,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        segment_bytes: int | None = None,
    ) -> TopicInfo:
        validate_topic_name(name)
        self._unless_away(f"altering {name}")
        topic = self._topic(name, fresh=True)
        current = self._admin.config(name)
        config = TopicConfig(
            partitions=topic.partitions,
            retention_ms=retention_after(retention_ms, current.retention_ms),
            retention_bytes=retention_after(retention_bytes, current.retention_bytes),
            segment_bytes=segment_bytes or current.segment_bytes,
        )
        check_config(config)
        self._admin.alter(name, config)
        return self._info(topic, with_partitions=False)

    def list_topics(self) -> list[TopicInfo]:
        self._unless_away("listing topics")
        infos = []
        for topic in self._admin.fetch_topics(self._admin.names()):
            try:
                infos.append(self._info(topic, with_partitions=False))
            except UnknownTopic:
                continue  # deleted since the listing
        return infos

    def describe_topic(self, name: str) -> TopicInfo:
        validate_topic_name(name)
        self._unless_away(f"describing {name}")
        return self._info(self._topic(name, fresh=True), with_partitions=True)

    def current_topic_id(self, name: str) -> str:
        try:
            return self._topic(name, fresh=True).topic_id
        except UnknownTopic:
            self._forget_topic(name)
            raise

    # -- the topic record and topic-level state ---------------------------------------------------
    def _topic_record(self, topic: KafkaTopic, *, create: bool) -> dict[str, Any] | None:
        """Partition 0's record of the topic: when it was created and its home count."""
        record = self._records.get(topic.topic_id)
        if record is not None:
            return record
        if create:
            raw = self._state_values(topic.name, 0, [TOPIC_RECORD_KEY])[TOPIC_RECORD_KEY]
        else:
            # describing a topic never waits for partition 0's owner: its changelog says
            raw = self._replay(topic, 0).get(TOPIC_RECORD_KEY)
        if raw is None and create:
            proposed = json.dumps(
                {"created_ms": _now_ms(), "home_partitions": topic.partitions}
            ).encode()
            won: list[bytes] = []

            def put_if_absent(state: PartitionState) -> Sequence[bytes]:
                current = state.get(TOPIC_RECORD_KEY)
                if current is None:
                    state.put(TOPIC_RECORD_KEY, proposed)
                won.append(current or proposed)
                return ()

            self.transact(topic.name, 0, put_if_absent)
            raw = won[-1]
        if raw is None:
            return None
        record = dict(json.loads(raw))
        self._records[topic.topic_id] = record
        return record

    def put_topic_state_if_absent(self, topic: str, key: str, value: bytes) -> bytes:
        return self.put_topic_state_many_if_absent(topic, {key: value})[key]

    def put_topic_state_many_if_absent(
        self, topic: str, items: Mapping[str, bytes]
    ) -> dict[str, bytes]:
        kafka = self._topic(topic, fresh=True)
        record = self._topic_record(kafka, create=True)
        assert record is not None
        homes: dict[int, dict[str, bytes]] = {}
        for key, value in items.items():
            homes.setdefault(home_partition(key, int(record["home_partitions"])), {})[key] = value
        won: dict[str, bytes] = {}
        functions: list[tuple[str, int, TransactionFn]] = []
        for home, wanted in homes.items():

            def put_if_absent(
                state: PartitionState, wanted: dict[str, bytes] = wanted
            ) -> Sequence[bytes]:
                found = {}
                for key, value in wanted.items():
                    current = state.get(TOPIC_STATE_PREFIX + key)
                    if current is None:
                        state.put(TOPIC_STATE_PREFIX + key, value)
                        current = value
                    found[key] = current
                won.update(found)
                return ()

            functions.append((topic, home, put_if_absent))
        futures = self.submit_many(functions)  # one request per owner elsewhere
        for (_topic, home, _fn), future in zip(functions, futures, strict=True):
            try:
                future.result()
            except PartitionUnavailable as exc:  # only the keys of that home wait for it
                raise exc.holding(homes[home]) from None
        return {key: won[key] for key in items}

    def get_topic_state(self, topic: str, key: str) -> bytes | None:
        return self.get_topic_state_many(topic, [key])[key]

    def get_topic_state_many(self, topic: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        kafka = self._topic(topic)
        record = self._topic_record(kafka, create=False)
        if record is None:
            return dict.fromkeys(keys)
        homes: dict[int, list[str]] = {}
        for key in keys:
            homes.setdefault(home_partition(key, int(record["home_partitions"])), []).append(key)
        found: dict[str, bytes | None] = {}
        for home, wanted in homes.items():
            try:
                values = self._state_values(topic, home, [TOPIC_STATE_PREFIX + k for k in wanted])
            except UnknownPartition as exc:
                # a home of the topic as cached here, missing now: that topic was deleted
                # (and made again with fewer partitions); the caller looks it up again
                self._topics.pop(topic, None)
                raise PartitionGone(str(exc)) from None
            except PartitionUnavailable as exc:  # only the keys of that home wait for it
                raise exc.holding(wanted) from None
            for key in wanted:
                found[key] = values[TOPIC_STATE_PREFIX + key]
        return {key: found[key] for key in keys}

    # -- writes ---------------------------------------------------------------------------------
    def submit(
        self, topic: str, partition: int, fn: TransactionFn
    ) -> concurrent.futures.Future[AppendResult]:
        validate_topic_name(topic)
        if not isinstance(partition, int) or partition < 0:
            raise UnknownPartition(f"partition must be a non-negative integer, got {partition!r}")
        future: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
        self._dispatch(topic, partition, Pending(fn, future))
        return future

    def submit_many(
        self, items: Sequence[tuple[str, int, TransactionFn]]
    ) -> list[concurrent.futures.Future[AppendResult]]:
        """``submit`` of several transactions (one client request's partitions) at once.

        Those of partitions owned by other gateways are forwarded together: one request per
        owner carries all of them (see ``remote_transaction``)."""
        futures: list[concurrent.futures.Future[AppendResult]] = []
        forwarded: list[
            tuple[str, int, TransactionFn, concurrent.futures.Future[AppendResult]]
        ] = []
        for topic, partition, _fn in items:  # all checked before any is dispatched
            validate_topic_name(topic)
            if not isinstance(partition, int) or partition < 0:
                raise UnknownPartition(
                    f"partition must be a non-negative integer, got {partition!r}"
                )
        for topic, partition, fn in items:
            future: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
            futures.append(future)
            remote = self.placement.remote()
            if (
                not self._closed
                and remote is not None
                and not self.placement.owns(topic, partition)
            ):
                forwarded.append((topic, partition, fn, future))
            else:
                self._dispatch(topic, partition, Pending(fn, future))
        if forwarded:
            remote = self.placement.remote()
            assert remote is not None
            remote.submit_many(forwarded)
        return futures

    def _dispatch(self, topic: str, partition: int, txn: Pending) -> None:
        """Hand ``txn`` to the partition's owner: here (taking it over if needed) or remote."""
        if self._closed:
            self._fail(txn, StoreUnavailable("log store is closed"))
            return
        if not self.placement.owns(topic, partition):
            if txn.local_only:
                self._fail(txn, NotOwner(f"{topic}/{partition} is not owned here"))
                return
            remote = self.placement.remote()
            if remote is None:
                self._fail(txn, StoreUnavailable(f"no owner of {topic}/{partition} is known"))
                return
            remote.submit(topic, partition, txn.fn, txn.future)
            return
        for _ in range(3):
            owner = self._owner(topic, partition)
            try:
                owner.submit(txn)
                return
            except OwnerGone:
                self._drop_owner(owner)
        self._fail(txn, StoreUnavailable(f"{topic}/{partition} keeps changing hands; retry"))

    @staticmethod
    def _fail(txn: Pending, error: BaseException) -> None:
        if txn.start():
            txn.future.set_exception(error)

    def _owner(self, topic: str, partition: int, *, eager: bool = False) -> PartitionOwner:
        key = (topic, partition)
        stale: PartitionOwner | None = None
        with self._lock:
            owner = self._owners.get(key)
            if owner is not None and self._of_a_deleted_topic(owner):
                stale, owner = owner, None
            if owner is None or owner.closed:
                owner = PartitionOwner(self._ctx, topic, partition).start(eager=eager)
                self._owners[key] = owner
        if stale is not None:
            stale.close(wait=False)
        return owner

    def _of_a_deleted_topic(self, owner: PartitionOwner) -> bool:
        """Whether ``owner`` took over a topic of its name that this process has since seen
        replaced (another process deleted it and made it again): its transactions would see
        the deleted topic's id and be refused (see ``TOPIC_ID_KEY``), for ever.  From the
        topics cached here, without asking Kafka; only a look at the topic newer than the
        owner's own counts (an older one would replace the owner of the new topic)."""
        cached = self._topics.get(owner.topic)
        return (
            cached is not None
            and owner.topic_id is not None
            and cached[1] > owner.topic_seen_at
            and cached[0].topic_id != owner.topic_id
        )

    def _drop_owner(self, owner: PartitionOwner) -> None:
        with self._lock:
            if self._owners.get((owner.topic, owner.partition)) is owner:
                del self._owners[(owner.topic, owner.partition)]
        owner.close(wait=False)

    def _retry(self, owner: PartitionOwner, txn: Pending, reason: BaseException) -> None:
        """An owner lost the partition before running ``txn``: send it wherever it is owned now.

        Runs in the old owner's thread.  A fenced writer here means another process took the
        partition over: the next attempt takes it back (on demand) or goes to the new owner.
        """
        self._drop_owner(owner)
        txn.attempts += 1
        if txn.local_only and not self.placement.owns(owner.topic, owner.partition):
            txn.future.set_exception(NotOwner(f"{owner.topic}/{owner.partition} moved away"))
            return
        if txn.attempts > _MAX_ATTEMPTS or self._closed:
            txn.future.set_exception(
                StoreUnavailable(
                    f"{owner.topic}/{owner.partition} is being taken over by another writer "
                    f"({reason}); retry"
                )
            )
            return
        if isinstance(reason, WriterFenced):
            # Two writers taking one partition from each other: each takeover fences the other's
            # open transaction, so without a growing pause neither commits.  Exponential backoff
            # with jitter lets the one that waits less finish a transaction first.
            time.sleep(random.uniform(0.0, min(_MAX_BACKOFF_S, 0.05 * 2**txn.attempts)))
        self._dispatch(owner.topic, owner.partition, txn)

    def _assigned_here(self, topic: str, partition: int) -> bool:
        """Whether the gateways' group gives this process the partition now (a process that
        writes on demand is given none: it may write any)."""
        return not isinstance(self.placement, OnDemand) and self.placement.owns(topic, partition)

    def _note_takeover(self, topic: str, partition: int, seconds: float, entries: int) -> None:
        self.takeovers.append((topic, partition, seconds, entries))
        listener = self.takeover_listener
        if listener is not None:
            listener(topic, partition, seconds, entries)

    # -- the owner's side of remote transactions ------------------------------------------------
    def submit_local(
        self, topic: str, partition: int, fn: TransactionFn
    ) -> concurrent.futures.Future[AppendResult]:
        """Run ``fn`` here as the partition's owner, or fail with ``NotOwner``."""
        validate_topic_name(topic)
        future: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
        self._dispatch(topic, partition, Pending(fn, future, local_only=True))
        return future

    def read_local_state(
        self, topic: str, partition: int, keys: Sequence[str]
    ) -> tuple[dict[str, bytes | None], int]:
        """Values of ``keys`` and the next offset, as this process's owner of the partition
        has them; ``NotOwner`` if this process does not own it (or no longer)."""
        validate_topic_name(topic)
        if not self.placement.owns(topic, partition):
            raise NotOwner(f"{topic}/{partition} is not owned here")
        owner = self._owner(topic, partition, eager=True)
        owner.wait_ready(self.settings.operation_timeout_s)
        try:
            return owner.read_state(keys)
        except OwnerGone:
            self._drop_owner(owner)
        if not self.placement.owns(topic, partition):
            raise NotOwner(f"{topic}/{partition} is not owned here")
        owner = self._owner(topic, partition, eager=True)
        owner.wait_ready(self.settings.operation_timeout_s)
        try:
            return owner.read_state(keys)
        except OwnerGone:
            # not an error a peer can name: it asks again (a topic deleted meanwhile shows
            # as UnknownTopic at the next takeover)
            self._drop_owner(owner)
            raise StoreUnavailable(f"{topic}/{partition} keeps changing hands; retry") from None

    def take_over(self, topic: str, partition: int) -> PartitionOwner:
        """Become the partition's writer now (a gateway does this for partitions it is given)."""
        return self._owner(topic, partition, eager=True)

    def release(self, topic: str, partition: int, *, wait: bool = True) -> None:
        """Stop writing the partition here; queued transactions go to its next owner."""
        with self._lock:
            owner = self._owners.pop((topic, partition), None)
        if owner is not None:
            owner.close(wait=wait)

    def local_owner(self, topic: str, partition: int) -> PartitionOwner | None:
        with self._lock:
            owner = self._owners.get((topic, partition))
        return owner if owner is not None and not owner.closed else None

    def _owner_of(self, kafka: KafkaTopic, partition: int) -> PartitionOwner | None:
        """The local owner of the partition of ``kafka`` (this identity of the topic).

        An owner of a deleted topic of the same name (another process deleted it, and maybe
        made it again) is dropped: its table and state topic are the deleted topic's, and it
        would answer every state read from them with ``UnknownTopic``, for ever."""
        owner = self.local_owner(kafka.name, partition)
        if owner is not None and self._of_a_deleted_topic(owner):
            self._drop_owner(owner)
            return None
        return owner

    def transact(self, topic: str, partition: int, fn: TransactionFn) -> AppendResult:
        return self.submit(topic, partition, fn).result()

    def append(self, topic: str, partition: int, values: Sequence[bytes]) -> AppendResult:
        kept = list(values)
        return self.transact(topic, partition, lambda _state: kept)

    # -- reads ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def reads_of(self, partitions: Sequence[tuple[str, int]]) -> Iterator[None]:
        """The bounds of ``partitions`` asked together: one ``ListOffsets`` per leader for
        their starts and one for their last stable offsets, both at once, instead of a
        watermark look (two requests, one after the other) per partition.  Each partition's
        first ``read``, ``end_offset`` or ``follow_appends`` in this thread, within the
        context, answers from that look; one Kafka did not answer asks on its own, as ever."""
        looked = self._bounds_now(partitions) if len(partitions) > 1 else {}
        outer = getattr(self._looked, "bounds", None)
        self._looked.bounds = looked
        try:
            yield
        finally:
            self._looked.bounds = outer

    def _bounds_now(
        self, partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[str, int, int]]:
        if self._outage.away() is not None:
            return {}  # every read says so at once
        names: dict[TopicPartition, tuple[str, int]] = {}
        topics: dict[str, KafkaTopic | None] = {}
        for topic, partition in dict.fromkeys(partitions):
            if topic not in topics:
                try:
                    topics[topic] = self._topic(topic)
                except LogbrokerError:
                    topics[topic] = None  # asked once here; its reads say why
            kafka = topics[topic]
            if kafka is None or not isinstance(partition, int):
                continue
            if 0 <= partition < kafka.partitions:  # else its read looks again
                names[TopicPartition(kafka.kafka_name, partition)] = (topic, partition)
        if not names:
            return {}
        try:
            asked = {
                spec: self._admin.client.list_offsets(
                    {tp: spec_of() for tp in names},
                    isolation_level=IsolationLevel.READ_COMMITTED,
                    request_timeout=_BOUNDS_S,
                )
                for spec, spec_of in (("start", OffsetSpec.earliest), ("end", OffsetSpec.latest))
            }
        except Exception as exc:  # each read looks on its own, and says what Kafka answers
            log.debug("the bounds of %d partitions: %s", len(names), exc)
            return {}
        found: dict[tuple[str, int], tuple[str, int, int]] = {}
        for tp, start_future in asked["start"].items():
            try:
                low = int(start_future.result().offset)
                end = int(asked["end"][tp].result().offset)
            except Exception:  # not answered (a leader moving, a topic just made): its own look
                continue
            if low >= 0 and end >= low:
                found[names[tp]] = (tp.topic, low, end)
        return found

    def _looked_up(self, topic: str, partition: int, kafka_name: str) -> tuple[int, int] | None:
        """The bounds ``reads_of`` looked up for the partition, once; None: ask Kafka."""
        looked = getattr(self._looked, "bounds", None)
        if not looked:
            return None
        bounds = looked.pop((topic, partition), None)
        if bounds is None or bounds[0] != kafka_name:
            return None
        return bounds[1], bounds[2]

    def read(
        self, topic: str, partition: int, offset: int, max_bytes: int = 1024 * 1024
    ) -> ReadResult:
        validate_topic_name(topic)
        self._unless_away(f"reading {topic}/{partition}")
        kafka = self._check_partition(topic, partition)
        looked = self._looked_up(topic, partition, kafka.kafka_name)
        if offset < 0:
            low, end = looked or self._watermarks.get(kafka.kafka_name, partition)
            raise OffsetOutOfRange(f"offset {offset} is negative", low, end)
        try:
            result = self._fetchers.read(
                kafka.kafka_name,
                partition,
                offset,
                max(1, max_bytes),
                what=f"{topic}/{partition}",
                bounds=looked,
            )
        except UnknownTopic:
            self._forget_topic(topic)
            raise
        # Read by name: the id is the look's (see StoreCapabilities.exact_read_identity).
        return dataclasses.replace(result, topic_id=kafka.topic_id)

    def end_offset(self, topic: str, partition: int) -> int:
        validate_topic_name(topic)
        self._unless_away(f"the end of {topic}/{partition}")
        kafka = self._check_partition(topic, partition)
        looked = self._looked_up(topic, partition, kafka.kafka_name)
        return (looked or self._watermarks.get(kafka.kafka_name, partition))[1]

    def wait_for_data(self, topic: str, partition: int, offset: int, timeout_s: float) -> bool:
        validate_topic_name(topic)
        self._unless_away(f"waiting on {topic}/{partition}")
        kafka = self._check_partition(topic, partition)
        return self._fetchers.wait(kafka.kafka_name, partition, offset, timeout_s)

    def follow_appends(
        self, topic: str, partition: int, on_append: Callable[[], None]
    ) -> Callable[[], None]:
        validate_topic_name(topic)
        self._unless_away(f"following {topic}/{partition}")
        kafka = self._check_partition(topic, partition)
        looked = self._looked_up(topic, partition, kafka.kafka_name)
        _low, end = looked or self._watermarks.get(kafka.kafka_name, partition, "follow")
        changelog = naming.state_topic(self.settings.namespace, kafka.topic_id)
        self._changelog_topics[changelog] = topic
        return self._tail.follow(kafka.kafka_name, partition, end, on_append, changelog)

    def _changelog_start(self, kafka: KafkaTopic, partition: int) -> StateStart | None:
        """Where the append tail reads a partition's changelog from when it looks it up
        again; None: the topic has no changelog (made by a version without one, until its
        first writer makes it)."""
        state_topic = naming.state_topic(self.settings.namespace, kafka.topic_id)
        try:
            low, end = self._watermarks.get(state_topic, partition, "follow", timeout_s=_TAIL_END_S)
        except LogbrokerError:
            return None
        return state_topic, max(low, end - STATE_LOOKBACK)

    def _ends_now(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The last stable offsets of ``partitions`` (Kafka names), asked in one
        ``ListOffsets`` per leader; those Kafka did not answer are left out."""
        futures = self._admin.client.list_offsets(
            {TopicPartition(topic, p): OffsetSpec.latest() for topic, p in partitions},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=_TAIL_END_S,
        )
        ends: dict[tuple[str, int], int] = {}
        for tp, future in futures.items():
            with contextlib.suppress(Exception):  # not answered: asked again in a moment
                ends[tp.topic, tp.partition] = int(future.result().offset)
        return ends

    def _ends_here(self, changelog: str, partition: int) -> tuple[int, int] | None:
        """(committed end, readable end) of the data partition whose changelog partition is
        ``changelog``/``partition``, as this process's writer of it knows them; None: no
        writer of it here (see ``AppendTail``)."""
        name = self._changelog_topics.get(changelog)
        if name is None:
            return None
        with self._lock:
            owner = self._owners.get((name, partition))
        return None if owner is None else owner.ends_known(changelog)

    def _changelog_now(self, kafka_topic: str, partition: int) -> StateStart:
        """``_changelog_start`` of a topic looked up afresh by its Kafka name (the data
        partition itself when it has no changelog); raises if the topic is not there."""
        name = naming.logbroker_topic(self.settings.namespace, kafka_topic)
        if name is None:
            raise UnknownTopic(f"{kafka_topic} is not a topic of this installation")
        kafka = self._topic(name, fresh=True)
        state = self._changelog_start(kafka, partition)
        if state is not None:
            return state
        _low, end = self._watermarks.get(kafka_topic, partition, "follow", timeout_s=_TAIL_END_S)
        return kafka_topic, end

    def get_state(self, topic: str, partition: int, key: str) -> bytes | None:
        return self._state_values(topic, partition, [key])[key]

    def get_state_many(
        self, topic: str, partition: int, keys: Sequence[str]
    ) -> dict[str, bytes | None]:
        """``get_state`` of many keys of one partition in one step (one owner's read)."""
        return self._state_values(topic, partition, keys)

    def _state_values(
        self, topic: str, partition: int, keys: Sequence[str]
    ) -> dict[str, bytes | None]:
        """Committed values of ``keys``: from the owner, here or remote, or the changelog."""
        kafka = self._check_partition(topic, partition)
        if self.placement.owns(topic, partition):
            owner = self._owner_of(kafka, partition)
            if owner is not None and owner.taking_over:
                # Its takeover is under way (the partition was just given: a new topic's
                # first write reads partition 0's topic record here).  Dropped as gone, it
                # would be taken over again by the next transaction, fencing this takeover,
                # whose queued writes would then take it over a third time.
                with contextlib.suppress(StoreUnavailable):
                    owner.wait_ready(self.settings.operation_timeout_s)
            if owner is not None:
                try:
                    return owner.read_state(keys)[0]
                except OwnerGone:
                    self._drop_owner(owner)
        else:
            remote = self.placement.remote()
            if remote is not None:
                return remote.read_state(topic, partition, keys)
        table = self._replay(kafka, partition)
        return {key: table.get(key) for key in keys}

    def _replay(self, topic: KafkaTopic, partition: int) -> dict[str, bytes]:
        """The partition's state read from its changelog, without becoming its writer.

        Never ``OffsetOutOfRange``: that is a reader's answer (416), and a write or a
        topic's description that reads state must not give it.  A changelog position that
        Kafka says is out of range is read again from the changelog's start or last
        snapshot, once; if it still is, the caller is told to retry (503).  (Seen right after
        a topic was deleted and made again, for about a second: writes were answered 416
        "offset is outside 0..4 of the state of dc1.hw/0", and a push-client parked the file.)
        """
        try:
            return self._replay_once(topic, partition)
        except OffsetOutOfRange as exc:
            log.warning("the state of %s/%d: %s; reading it again", topic.name, partition, exc)
            with self._replay_lock:
                self._replayed.pop((topic.topic_id, partition), None)
        try:
            return self._replay_once(topic, partition)
        except OffsetOutOfRange as exc:
            with self._replay_lock:
                self._replayed.pop((topic.topic_id, partition), None)
            raise StoreUnavailable(
                f"the state of {topic.name}/{partition} moved while it was read ({exc}); retry"
            ) from exc

    def _replay_once(self, topic: KafkaTopic, partition: int) -> dict[str, bytes]:
        state_topic = naming.state_topic(self.settings.namespace, topic.topic_id)
        with self._replay_lock:
            key = (topic.topic_id, partition)
            try:
                low, end = self._watermarks.get(state_topic, partition, "the state changelog")
            except UnknownTopic:
                return {}  # never written: the state topic is made by the first writer
            replayed = self._replayed.get(key)
            if replayed is None or replayed.position < low:
                snapshot = self._ctx.committed_snapshot(state_topic, partition)
                replayed = ReplayedState(position=low if snapshot is None else snapshot)
                self._replayed[key] = replayed
            self._fetchers.replay(
                state_topic,
                partition,
                replayed.position,
                end,
                replayed.apply,
                what=f"the state of {topic.name}/{partition}",
            )
            replayed.position = max(replayed.position, end)
            return replayed.table

    # -- finding state nobody uses (StateScan) ----------------------------------------------------
    def owns_partition(self, topic: str, partition: int) -> bool:
        """True if this process is (or may become) the partition's writer: idle source expiry
        looks at these partitions only, so every partition is looked at by its owner alone."""
        return self.placement.owns(topic, partition)

    def scan_state(
        self, topic: str, partition: int, prefix: str, after: str = "", limit: int = 1000
    ) -> list[tuple[str, bytes]]:
        """A page of the partition's state under ``prefix``, as this process's owner of it has
        the table (else as its changelog says): a hint, see ``state_scan``."""
        kafka = self._check_partition(topic, partition)
        return self._listings.page(
            kafka.topic_id,
            partition,
            prefix,
            after,
            limit,
            lambda: self._state_items(kafka, partition, prefix),
        )

    def _state_items(
        self, kafka: KafkaTopic, partition: int, prefix: str
    ) -> list[tuple[str, bytes]]:
        owner = self._owner_of(kafka, partition)
        if owner is not None and self.placement.owns(kafka.name, partition):
            # an owner being taken over again has no table to show: the changelog has one
            with contextlib.suppress(OwnerGone):
                return owner.state_items(prefix)
        with self._replay_lock:
            table = self._replay(kafka, partition)
            return [(k, v) for k, v in table.items() if k.startswith(prefix)]

    def scan_topic_state(
        self, topic: str, prefix: str, after: str = "", limit: int = 1000
    ) -> list[tuple[str, bytes]]:
        """``scan_state`` of the topic-level state kept in the home partitions this process
        owns (every home under ``OnDemand``): each gateway scans the pins it is the writer of."""
        kafka = self._topic(topic, fresh=True)
        record = self._topic_record(kafka, create=False)
        if record is None:
            return []
        found: list[tuple[str, bytes]] = []
        inner_after = TOPIC_STATE_PREFIX + after if after else ""
        for home in range(int(record["home_partitions"])):
            if not self.placement.owns(topic, home):
                continue
            page = self.scan_state(topic, home, TOPIC_STATE_PREFIX + prefix, inner_after, limit)
            found.extend((key[len(TOPIC_STATE_PREFIX) :], value) for key, value in page)
        found.sort()
        return found[:limit]

    def delete_topic_state_if(
        self, topic: str, items: Mapping[str, bytes], *, deletions_key: str | None = None
    ) -> int:
        """Delete each topic-state key whose value is the one given, in its home partition's
        transaction; then raise the count under ``deletions_key`` by the number deleted.

        Kafka has no transaction across two owners, so the count is raised right *after* the
        deletions (the embedded store does both in one transaction).  That order keeps the
        count's promise for every reader that looks again after it was raised; a reader that
        looks again in between sees it unchanged, and a caller that gave a key's owner state
        then must look at that state again after this returns (``source_expiry`` does)."""
        kafka = self._topic(topic, fresh=True)
        record = self._topic_record(kafka, create=False)
        if record is None:
            return 0
        home_count = int(record["home_partitions"])
        homes: dict[int, dict[str, bytes]] = {}
        for key, value in items.items():
            homes.setdefault(home_partition(key, home_count), {})[key] = value
        deleted: dict[int, int] = {}
        functions: list[tuple[str, int, TransactionFn]] = []
        for home, doomed in homes.items():

            def delete_if(
                state: PartitionState, home: int = home, doomed: dict[str, bytes] = doomed
            ) -> Sequence[bytes]:
                count = 0  # a function may run again (a forwarded one after a conflict)
                for key, value in doomed.items():
                    if state.get(TOPIC_STATE_PREFIX + key) == value:
                        state.put(TOPIC_STATE_PREFIX + key, b"")
                        count += 1
                deleted[home] = count
                return ()

            functions.append((topic, home, delete_if))
        for future in self.submit_many(functions):
            future.result()
        total = sum(deleted.values())
        if total and deletions_key is not None:

            def raise_count(state: PartitionState) -> Sequence[bytes]:
                raw = state.get(TOPIC_STATE_PREFIX + deletions_key)
                count = int.from_bytes(raw, "big") if raw else 0
                state.put(TOPIC_STATE_PREFIX + deletions_key, (count + total).to_bytes(8, "big"))
                return ()

            self.transact(topic, home_partition(deletions_key, home_count), raise_count)
        return total

    # -- retention --------------------------------------------------------------------------------
    def apply_retention(self, now_ms: int | None = None) -> dict[tuple[str, int], int]:
        """Nothing to do: Kafka applies each topic's ``retention.ms``/``retention.bytes``."""
        return {}

    def delete_segments_before(self, topic: str, partition: int, offset: int) -> int:
        if offset < 0:
            raise BadRequest("offset must not be negative")
        kafka = self._check_partition(topic, partition)
        low, end = self._watermarks.get(kafka.kafka_name, partition)
        target = min(offset, end)
        if target <= low:
            return low
        return self._admin.delete_records(kafka.kafka_name, partition, target)

    def unavailable_spans(self) -> list[tuple[float, float]]:
        return self._watermarks.unavailable_spans()

    @property
    def tail_end_looks(self) -> int:
        """Partitions' ends the append tail asked Kafka for, to see commits readable."""
        return self._tail.end_looks

    @property
    def partition_looks(self) -> int:
        """Looks at one partition's bounds (start and LSO) so far, by reads, waits, follows
        and the owners' checks that their commits are readable."""
        return self._watermarks.looks

    def installation_id(self) -> str:
        if self._installation is None:
            # an installation is a namespace of a cluster: two may share one cluster
            cluster = self._admin.reachable(_INSTALLATION_ASK_S)
            where = cluster or "bootstrap " + self.settings.bootstrap
            self._installation = f"kafka:{where}:{self.settings.namespace}"
        return self._installation

    def readiness(self) -> str | None:
        """None if this gateway can take writes now, else why not: see ``readiness`` (one
        look of at most about 1.2 s)."""
        # a gateway whose group member failed for good writes nothing until a new one joined
        out_of_group = getattr(self.placement, "out_of_group", None)
        if out_of_group is not None:
            return f"this gateway is out of the gateway group: {out_of_group}"
        return self._readiness.reason()

    @property
    def stop_budget_s(self) -> float:
        """What a gateway's whole stop over this store may take (its parts share it): one
        operation timeout, for what was in flight when the stop came, and a grace."""
        return self.settings.operation_timeout_s + STOP_GRACE_S

    def close(self) -> None:
        self.close_within(None)

    def close_within(self, wait_s: float | None) -> None:
        """Close; the owners finish what is queued, waited for ``wait_s`` at most in all
        (``None``: each for its own bound).  An owner still waiting on Kafka then is left
        behind, as after a crash: nothing it holds was acknowledged."""
        if self._closed:
            return
        self._closed = True
        self._outage.close()
        with self._lock:
            owners, self._owners = list(self._owners.values()), {}
        deadline = None if wait_s is None else time.monotonic() + wait_s
        for owner in owners:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            owner.close(wait=True, timeout_s=left)
        remote = self.placement.remote()
        if remote is not None:
            remote.close()
        self._tail.close()
        self._fetchers.close()
        self._watermarks.close()
        self._ctx.close()

    def __enter__(self) -> KafkaLogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def owner_error(exc: BaseException) -> LogbrokerError:
    """How a failure inside an owner is reported to a caller of another process."""
    return exc if isinstance(exc, LogbrokerError) else as_store_error(exc, "transaction")
