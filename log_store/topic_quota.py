"""How many topics, and how many partitions per topic, clients may make a store hold.

Topics are created on first use (a write of a new log type, a legacy commit, a mirror's first
copy of a topic).  Every such creation goes through one :class:`TopicQuota`, which refuses a
new topic beyond ``max_topics`` and a partition count beyond ``max_partitions_per_topic`` with
:class:`~log_store.errors.LimitReached`, so a client holding a token cannot fill the catalog
or the file system with topics.  A topic created or altered by an operator (``POST /v1/topics``,
``PATCH /v1/topics/{topic}``, ``logbroker topics create|alter``) is held to the same
``max_partitions_per_topic`` (:meth:`TopicQuota.create_new`, :meth:`TopicQuota.alter`): a topic
grown past it would be refused by every replica call naming its partition count, and the limit
is raised in the configuration, not around it.  An operator's creation counts against
``max_topics`` too, counted afresh rather than from the cached count.

The topic count is read from the catalog at most once per ``count_ttl_s`` (and after each
creation), so a refusal at the limit costs no catalog scan; several processes creating topics
at the same moment may overshoot the limit by the creations of that second.

A creation on a client's behalf names its ``creator`` (the gateway passes the token's owner):
one creator may have created at most ``max_topics_per_creator`` of the store's topics, so one
client cannot take the whole of ``max_topics`` from the others.  The creator is recorded in the
new topic's own topic-level state (:data:`CREATOR_KEY`, first wins), which every backend keeps
with the topic: in the embedded store's catalog, on Kafka in the topic's state topic, which
every gateway reads.  So the count survives a restart, is the same in every process and every
gateway over one Kafka cluster, and a deleted topic stops counting.  A topic created without a
creator (an operator's, logbroker's own, one created before creators were recorded, or one
whose creator was not recorded because the process died in between) counts against
``max_topics`` only.  Each process reads a topic's creator once (it never changes for a
``topic_id``); creations with a creator are serialized within a process, so only creations
in other processes, in the same second, can overshoot a share.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from log_store.errors import BadRequest, LimitReached, TopicExists, UnknownTopic
from log_store.interface import UNLIMITED, LogStore, TopicConfig, TopicInfo

DEFAULT_MAX_TOPICS = 10_000
DEFAULT_MAX_PARTITIONS_PER_TOPIC = 64
CREATOR_KEY = "created-by"
"""The topic-state key holding, UTF-8, who created the topic on first use (see the module)."""
UNRECORDED_S = 60.0
"""A topic younger than this whose creator is not (yet) recorded is looked at again at the next
count: the process creating it records its creator right after the creation."""


@dataclass(frozen=True)
class TopicLimits:
    max_topics: int = DEFAULT_MAX_TOPICS
    """Topics in the store, logbroker's internal topic included."""
    max_partitions_per_topic: int = DEFAULT_MAX_PARTITIONS_PER_TOPIC
    max_topics_per_creator: int | None = None
    """Topics one creator may have created on first use (None: no share, ``max_topics`` only)."""


@dataclass(frozen=True)
class TopicChange:
    """What :meth:`TopicQuota.alter` changes: ``None`` leaves a setting as it is, and
    :data:`~log_store.interface.UNLIMITED` removes a retention limit."""

    partitions: int | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None
    segment_bytes: int | None = None


class TopicQuota:
    """Creates and grows topics on clients' behalf, within :class:`TopicLimits`."""

    def __init__(self, store: LogStore, limits: TopicLimits, count_ttl_s: float = 1.0) -> None:
        self._store = store
        self.limits = limits
        self._ttl_s = count_ttl_s
        self._count = 0
        self._counted_at = float("-inf")
        self._lock = threading.Lock()
        self._creating = threading.Lock()
        """Held from a creator's check to its creator's record: one creation at a time."""
        self._creators: dict[str, str | None] | None = None
        """Per ``topic_id``, its recorded creator; None until a share was first checked (a
        gateway whose clients never create topics never reads them)."""
        self._by_creator: dict[str, int] = {}

    def topic_count(self) -> int:
        """The number of topics, at most ``count_ttl_s`` old."""
        with self._lock:
            self._recount(with_creators=False)
            return self._count

    def created_by(self, creator: str) -> int:
        """How many of the store's topics ``creator`` created, at most ``count_ttl_s`` old."""
        with self._lock:
            self._recount(with_creators=True)
            return self._by_creator.get(creator, 0)

    def created_counts(self) -> dict[str, int]:
        """The topics each creator created, as last counted (for a gauge: no store access, and
        no wait for a count in progress, which a hung disk may hold; empty until a creation
        with a creator was checked)."""
        return dict(self._by_creator)  # replaced whole by each count, never changed in place

    def _recount(self, *, with_creators: bool) -> None:
        """Count the topics again if the count is ``count_ttl_s`` old (with ``self._lock``);
        once creators were asked for, every count reads the creators of topics new to it."""
        now = time.monotonic()
        counted = self._creators is not None or not with_creators
        if counted and now - self._counted_at < self._ttl_s:
            return
        topics = self._store.list_topics()
        self._count = len(topics)
        self._counted_at = now
        if self._creators is None and not with_creators:
            return
        known = self._creators or {}
        creators: dict[str, str | None] = {}
        now_ms = time.time() * 1000
        for topic in topics:
            if topic.topic_id in known:
                creators[topic.topic_id] = known[topic.topic_id]
                continue
            try:
                recorded = self._store.get_topic_state(topic.name, CREATOR_KEY)
            except UnknownTopic:
                continue  # deleted since the listing
            if recorded is not None:
                creators[topic.topic_id] = recorded.decode()
            elif topic.created_ms and now_ms - topic.created_ms >= UNRECORDED_S * 1000:
                creators[topic.topic_id] = None  # nobody's for good
            # else nobody's for now: its creator may be on its way, looked for next time
        by_creator: dict[str, int] = {}
        for creator in creators.values():
            if creator is not None:
                by_creator[creator] = by_creator.get(creator, 0) + 1
        self._creators = creators
        self._by_creator = by_creator

    def check_partitions(self, partitions: int) -> int:
        """``partitions`` if a topic may have that many, else :class:`LimitReached`."""
        maximum = self.limits.max_partitions_per_topic
        if partitions > maximum:
            raise LimitReached(
                f"a topic may have at most {maximum} partitions (limits.max_partitions_per_topic "
                f"in the gateway's configuration), {partitions} were asked for",
                "max_partitions_per_topic",
                maximum,
            )
        return partitions

    def create(self, name: str, partitions: int, creator: str | None = None) -> TopicInfo:
        """Create ``name`` with ``partitions`` unless it exists; the topic as it is now.

        With ``creator``, a new topic also counts against the creator's share, and is
        recorded as the creator's."""
        self.check_partitions(partitions)
        with self._creating if self._shared(creator) else contextlib.nullcontext():
            return self._create(name, partitions, creator)

    def _shared(self, creator: str | None) -> bool:
        return creator is not None and self.limits.max_topics_per_creator is not None

    def _create(self, name: str, partitions: int, creator: str | None) -> TopicInfo:
        if self.topic_count() >= self.limits.max_topics:
            # Two writers of a new log type at one below the limit: the other one's creation
            # is what reached it.  The topic is there; it is not a new one.
            with contextlib.suppress(UnknownTopic):
                return self._store.describe_topic(name)
            raise self._at_max_topics(name, "")
        if creator is not None and self._shared(creator):
            created = self.created_by(creator)
            if created >= self._share():
                with contextlib.suppress(UnknownTopic):  # created meanwhile, by another
                    return self._store.describe_topic(name)
                raise self._over_share(creator, created, [name])
        with contextlib.suppress(TopicExists):  # another process created it meanwhile
            self._store.create_topic(name, TopicConfig(partitions=partitions), exist_ok=True)
        if creator is not None:
            # first wins: of two creators racing for a name, one is charged with it
            self._store.put_topic_state_if_absent(name, CREATOR_KEY, creator.encode())
        with self._lock:
            self._counted_at = float("-inf")
        return self._store.describe_topic(name)

    def _share(self) -> int:
        share = self.limits.max_topics_per_creator
        assert share is not None
        return share

    def _over_share(self, creator: str, created: int, names: Sequence[str]) -> LimitReached:
        share = self._share()
        refused = (
            f"topic {names[0]!r} was not created"
            if len(names) == 1
            else f"this request would create {len(names)} more ({_names(names)}); none was created"
        )
        return LimitReached(
            f"the token of {creator!r} has created {created} of the store's topics and may "
            f"create {share} (limits.max_topics_per_token in the gateway's configuration); "
            f"{refused}",
            "max_topics_per_token",
            share,
        )

    def create_all(
        self, names: Sequence[str], partitions: int, creator: str | None = None
    ) -> list[TopicInfo]:
        """Create those of ``names`` that do not exist, or none of them: all of one request's
        new topics are admitted or refused together, so a request refused at ``max_topics``
        (or at its creator's share) leaves no topic behind to count against the limit.  The
        topics as they are now.

        Requests creating topics at the same moment are each checked against the same count:
        the second to create may still be refused half-way, by :meth:`create`'s own check
        (with a creator, only by a request in another process).
        """
        self.check_partitions(partitions)
        with self._creating if self._shared(creator) else contextlib.nullcontext():
            found: dict[str, TopicInfo] = {}
            for name in names:
                with contextlib.suppress(UnknownTopic):
                    found[name] = self._store.describe_topic(name)
            missing = [name for name in dict.fromkeys(names) if name not in found]
            # one new topic is checked by create alone, as it always was
            if len(missing) > 1 and self.topic_count() + len(missing) > self.limits.max_topics:
                raise LimitReached(
                    f"the store holds {self.topic_count()} topics and this request would "
                    f"create {len(missing)} ({_names(missing)}), over the limit of "
                    f"{self.limits.max_topics}; none was created",
                    "max_topics",
                    self.limits.max_topics,
                )
            if len(missing) > 1 and creator is not None and self._shared(creator):
                created = self.created_by(creator)
                if created + len(missing) > self._share():
                    raise self._over_share(creator, created, missing)
            found.update((name, self._create(name, partitions, creator)) for name in missing)
            return [found[name] for name in names]

    def _at_max_topics(self, name: str, where: str) -> LimitReached:
        return LimitReached(
            f"the store holds {self.limits.max_topics} topics, its limit{where}; topic "
            f"{name!r} was not created",
            "max_topics",
            self.limits.max_topics,
        )

    def create_new(self, name: str, config: TopicConfig) -> TopicInfo:
        """Create ``name`` with ``config``: an operator's creation, which names a new topic.

        :class:`TopicExists` if the name is taken (also by a creation racing this one);
        :class:`LimitReached` over ``max_partitions_per_topic`` or at ``max_topics``, counted
        afresh; the store refuses a bad name or setting (:class:`BadRequest`).  A refused
        creation creates nothing.
        """
        self.check_partitions(config.partitions)
        with contextlib.suppress(UnknownTopic):
            self._store.describe_topic(name)
            raise TopicExists(f"topic {name!r} exists")
        with self._lock:
            self._counted_at = float("-inf")
        if self.topic_count() >= self.limits.max_topics:
            raise self._at_max_topics(name, " (limits.max_topics in the gateway's configuration)")
        info = self._store.create_topic(name, config)
        with self._lock:
            self._counted_at = float("-inf")
        return info

    def delete(self, name: str) -> TopicInfo:
        """Delete ``name`` and its data; the topic as it was (:class:`UnknownTopic` if none).

        The store fences every partition's writer before the data goes, and a topic made again
        under the name has a new ``topic_id``: nothing keyed by the old one passes to it.
        """
        info = self._store.describe_topic(name)
        self._store.delete_topic(name)
        with self._lock:
            self._counted_at = float("-inf")
        return info

    def ensure(self, name: str, partitions: int) -> TopicInfo:
        """The topic ``name`` with at least ``partitions`` partitions, created or grown."""
        self.check_partitions(partitions)
        try:
            info = self._store.describe_topic(name)
        except UnknownTopic:
            info = self.create(name, partitions)
        if len(info.partitions) < partitions:
            self._store.set_partitions(name, partitions)
            info = self._store.describe_topic(name)
        return info

    def alter(self, name: str, change: TopicChange) -> TopicInfo:
        """Grow ``name`` and change its retention within the limits; the topic as it is now.

        Everything is checked before anything is changed: a partition count over
        ``max_partitions_per_topic`` (:class:`LimitReached`), one below the topic's (partitions
        never shrink), a negative retention or too small a segment (:class:`BadRequest`) leave
        the topic as it was.
        """
        info = self._store.describe_topic(name)
        grow = change.partitions is not None and change.partitions != info.config.partitions
        if change.partitions is not None and grow:
            if change.partitions < info.config.partitions:
                raise BadRequest(
                    f"topic {name!r} has {info.config.partitions} partitions; partitions never "
                    f"shrink ({change.partitions} were asked for)"
                )
            self.check_partitions(change.partitions)
        for setting in ("retention_ms", "retention_bytes"):
            value = getattr(change, setting)
            if value is not None and value < 0 and value != UNLIMITED:
                raise BadRequest(f"{setting} must not be negative (or unlimited), got {value}")
        if (change.retention_ms, change.retention_bytes, change.segment_bytes) != (None,) * 3:
            # the store checks the segment size: refused here, nothing was grown yet
            info = self._store.alter_topic(
                name,
                retention_ms=change.retention_ms,
                retention_bytes=change.retention_bytes,
                segment_bytes=change.segment_bytes,
            )
        if grow and change.partitions is not None:
            self._store.set_partitions(name, change.partitions)
        return self._store.describe_topic(name)


def _names(names: Sequence[str], shown: int = 5) -> str:
    listed = ", ".join(map(repr, names[:shown]))
    return listed if len(names) <= shown else f"{listed}, ..."
