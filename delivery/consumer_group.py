"""Consumer groups: members share a subscription's partitions and commit offsets server-side.

Members join, heartbeat and leave.  A partition has at most one owner; ownership moves only
when the owner releases it (asked to, when the group rebalances) or is dead (no heartbeat for
its session timeout).  A commit is accepted only from the partition's owner, so a member that
was presumed dead cannot move a position that its successor now owns.  With commit-after-
process, a clean leave hands over exactly where the member stopped: nothing is read twice.

All state is one JSON document per group in :class:`~delivery.internal_state.InternalState`,
changed only inside the store's partition lock: any gateway process can serve any request.

A group belongs to the client (token owner) whose join or commit created it; a join or commit
by another owner is refused (:class:`NotGroupOwner`) inside the same atomic update, so two
clients racing to create one group name cannot both get it.

An owner may create at most ``max_groups_per_token`` groups.  The names an owner created are
one more document (``group-owner/<owner>``); a new group's name is entered there before the
group's own document is made, and taken out again if another owner won the name.  A crash
between the two leaves the name entered: it counts until the owner creates that group (which
uses the entry), never more than once.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from audit.records import in_prefix
from delivery.internal_state import Doc, InternalState, is_internal
from log_store.errors import (
    BadRequest,
    LimitReached,
    OffsetOutOfRange,
    PartitionDamaged,
    StoreUnavailable,
    UnknownPartition,
    UnknownTopic,
)
from log_store.interface import LogStore

GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
DEFAULT_SESSION_TIMEOUT_MS = 10_000
MIN_SESSION_TIMEOUT_MS = 500
MAX_SESSION_TIMEOUT_MS = 300_000
RESETS = ("earliest", "latest")
DEFAULT_MAX_GROUPS_PER_OWNER = 1000

TopicPartition = tuple[str, int]
_log = logging.getLogger(__name__)


class UnknownGroup(BadRequest):
    """No member ever joined a group of this name."""


class UnknownMember(BadRequest):
    """The member left or was expired; it must join again."""


class NotPartitionOwner(BadRequest):
    """A commit for a partition the committing member does not own."""


class SubscriptionConflict(BadRequest):
    """A join whose topics differ from those of the group's live members."""


class NotGroupOwner(BadRequest):
    """The group exists and belongs to another client."""


class TopicRecreated(BadRequest):
    """A commit for an older topic of the same name: the topic was deleted and created again."""


MAX_SUBSCRIBED_TOPICS = 1_000
"""Topics one group or push subscription may name (a prefix reads any number)."""


def check_subscribed_topics(topics: Sequence[str]) -> None:
    """Refuse a list of topics a client asks for that names one twice or too many: every look
    at the subscription's partitions, and every status answer, costs as much as the list."""
    if len(topics) > MAX_SUBSCRIBED_TOPICS:
        raise BadRequest(
            f"a subscription names at most {MAX_SUBSCRIBED_TOPICS} topics, this one "
            f"{len(topics)}; subscribe to a prefix instead"
        )
    seen: set[str] = set()
    for topic in topics:
        if topic in seen:
            raise BadRequest(f"topic {topic!r} is named twice")
        seen.add(topic)


@dataclass(frozen=True)
class Subscription:
    """What a group reads: named topics, or every topic whose name starts with a prefix."""

    topics: tuple[str, ...] = ()
    prefix: str | None = None

    def __post_init__(self) -> None:
        # The prefix "" is every topic (the audit's aside, as for any prefix not naming it).
        if bool(self.topics) == (self.prefix is not None):
            raise BadRequest("subscribe to a list of topics or to a prefix (one of the two)")

    def to_json(self) -> Doc:
        return {"topics": sorted(self.topics), "prefix": self.prefix}

    @classmethod
    def from_json(cls, raw: Doc) -> Subscription:
        return cls(tuple(raw.get("topics") or ()), raw.get("prefix"))


@dataclass(frozen=True)
class AssignedPartition:
    topic: str
    partition: int
    offset: int
    topic_id: str | None = None
    """The identity of the topic ``offset`` belongs to (it changes when the topic is created
    again, and the offset then restarts at the new topic's start)."""


@dataclass(frozen=True)
class MemberState:
    """What a member is told on join and on every heartbeat."""

    group: str
    member_id: str
    generation: int
    session_timeout_ms: int
    assignment: list[AssignedPartition] = field(default_factory=list)
    revoke: list[TopicPartition] = field(default_factory=list)
    missing_topics: list[str] = field(default_factory=list)
    """Topics the group names that do not exist (yet): it waits for them."""

    @property
    def heartbeat_interval_ms(self) -> int:
        return max(100, self.session_timeout_ms // 3)

    def to_json(self) -> Doc:
        return {
            "group": self.group,
            "member_id": self.member_id,
            "generation": self.generation,
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "missing_topics": self.missing_topics,
            "assignment": [
                {
                    "topic": a.topic,
                    "partition": a.partition,
                    "offset": a.offset,
                    "topic_id": a.topic_id,
                }
                for a in self.assignment
            ],
            "revoke": [{"topic": t, "partition": p} for t, p in self.revoke],
        }


def validate_group(name: str) -> str:
    if not GROUP_NAME.fullmatch(name):
        raise BadRequest("group name must be 1-200 characters of [A-Za-z0-9._-]")
    return name


def _key(tp: TopicPartition) -> str:
    return f"{tp[0]}/{tp[1]}"


def _tp(key: str) -> TopicPartition:
    topic, _, partition = key.rpartition("/")
    return topic, int(partition)


@dataclass(frozen=True)
class _Bounds:
    """Each partition's (start, end) offsets and each topic's id, read before the state
    transaction."""

    offsets: dict[str, tuple[int, int]]
    topic_ids: dict[str, str] = field(default_factory=dict)
    created_ms: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return sorted(self.offsets)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _noting_outages(
    method: Callable[Concatenate[GroupCoordinator, _P], _R],
) -> Callable[Concatenate[GroupCoordinator, _P], _R]:
    """A request of a member: a store away while it is served is noted (``_outage_watch``)."""

    @functools.wraps(method)
    def served(self: GroupCoordinator, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        self._hearing()
        with self._outage_watch():
            return method(self, *args, **kwargs)

    return served


class GroupCoordinator:
    """Join, heartbeat, leave, commit and describe consumer groups of one store.

    A member is expired after its session timeout without a heartbeat, not counting the time
    this process could not reach the store (a Kafka outage): its heartbeats then failed here,
    they were not missed, so a reader that kept trying keeps its partitions and its commit
    of what it printed meanwhile is taken.  Another gateway that saw no failure knows of no
    outage: a member that moves to it right after one may still be expired there.

    Nor does the time before this process heard its first group request count: a gateway
    killed and started again knows nothing of its own downtime, and no member could be heard
    while no gateway ran, so every session is counted from then at the earliest.  A member
    that really died before (or while another gateway over the same store was up) is thus
    expired up to one session later than it would have been.
    """

    def __init__(
        self,
        store: LogStore,
        state: InternalState,
        clock: Callable[[], float] = time.time,
        *,
        max_per_owner: int = DEFAULT_MAX_GROUPS_PER_OWNER,
    ) -> None:
        self._store = store
        self._state = state
        self._clock = clock
        self.max_per_owner = max_per_owner
        self._outage_since: int | None = None
        """When this process last found the store away (ms), until it answers again."""
        self._outages: collections.deque[tuple[int, int]] = collections.deque(maxlen=32)
        """Recent spans (ms) during which this process could not reach the store."""
        self._heard_since: int | None = None
        """When (ms) this process got its first group request: before, it heard no member."""

    # -- requests ---------------------------------------------------------------------------
    @_noting_outages
    def join(
        self,
        group: str,
        subscription: Subscription,
        *,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        reset: str = "latest",
        owner: str | None = None,
        check_owner: bool = False,
    ) -> MemberState:
        """Add a member; its partitions are in the answer (and in every heartbeat's).

        A new group belongs to ``owner``; with ``check_owner``, joining a group of another
        owner is :class:`NotGroupOwner`.
        """
        validate_group(group)
        if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            raise BadRequest(
                f"session_timeout_ms must be in {MIN_SESSION_TIMEOUT_MS}..{MAX_SESSION_TIMEOUT_MS}"
            )
        if reset not in RESETS:
            raise BadRequest(f"reset must be one of {', '.join(RESETS)}")
        bounds = self._bounds(subscription)
        member_id = secrets.token_hex(8)
        now = self._now()

        created: list[bool] = []

        def change(doc: Doc | None) -> tuple[Doc, MemberState]:
            created[:] = [doc is None]
            doc = _owned_doc(group, doc, owner, check_owner)
            self._expire(doc, now)
            wanted = subscription.to_json()
            if doc["members"] and doc.get("subscription") != wanted:
                raise SubscriptionConflict(
                    f"group {group} reads {_describe_sub(doc['subscription'])}; this member "
                    f"asked for {_describe_sub(wanted)}; use another group name"
                )
            doc["subscription"] = wanted
            doc.setdefault("reset", reset)
            doc["members"][member_id] = {"seen": now, "timeout": session_timeout_ms}
            self._rebalance(doc, bounds)
            return doc, self._member_state(group, doc, member_id, bounds.missing)

        with self._counted(group, owner):
            member = self._state.update(_doc_key(group), change)
        # a group made before the index was kept is listed from its next join on
        if created[0] or group not in self.names():
            self._remember(group)
        return member

    @_noting_outages
    def heartbeat(
        self, group: str, member_id: str, release: Iterable[TopicPartition] = ()
    ) -> MemberState:
        """Keep a member alive, take back what it releases, tell it what it owns now."""
        doc = self._existing(group)
        if not doc.get("subscription"):
            raise UnknownMember(f"member {member_id} is not in group {group}; join first")
        bounds = self._bounds(Subscription.from_json(doc["subscription"]))
        released = [_key(tp) for tp in release]
        now = self._now()

        def change(doc: Doc | None) -> tuple[Doc, MemberState]:
            doc = self._require_member(group, doc, member_id, now)
            for key in released:
                if doc["owners"].get(key) == member_id:
                    del doc["owners"][key]
            self._rebalance(doc, bounds)
            return doc, self._member_state(group, doc, member_id, bounds.missing)

        return self._state.update(_doc_key(group), change)

    @_noting_outages
    def leave(self, group: str, member_id: str) -> None:
        """Remove a member at once; its partitions go to the others on their next heartbeat."""
        self._existing(group)
        now = self._now()

        def change(doc: Doc | None) -> tuple[Doc | None, None]:
            doc = self._require_member(group, doc, member_id, now)
            del doc["members"][member_id]
            doc["owners"] = {k: m for k, m in doc["owners"].items() if m != member_id}
            doc["generation"] += 1
            return doc, None

        self._state.update(_doc_key(group), change)

    @_noting_outages
    def commit(
        self,
        group: str,
        member_id: str | None,
        offsets: Sequence[tuple[str, int, int]],
        topic_ids: Mapping[str, str] | None = None,
        *,
        owner: str | None = None,
        check_owner: bool = False,
    ) -> None:
        """Record positions (the next offset to read).  Only a partition's owner may commit;
        without a member id, only partitions that nobody owns (manual offset management).

        ``topic_ids`` names the topic identity the offsets were read from (as assignments
        give it); a commit for an older topic of the same name is refused."""
        validate_group(group)
        bounds = self._topic_bounds(sorted({topic for topic, _, _ in offsets}))
        checked: list[tuple[str, int]] = []
        for topic, partition, offset in offsets:
            key = _key((topic, partition))
            if key not in bounds.offsets:
                raise UnknownPartition(f"{topic} has no partition {partition}")
            claimed = (topic_ids or {}).get(topic)
            if claimed is not None and claimed != bounds.topic_ids[topic]:
                raise TopicRecreated(
                    f"{topic}'s topic id is {bounds.topic_ids[topic]}, not {claimed}: either the "
                    "topic was deleted and created again since these offsets were read "
                    "(heartbeat to get the new topic's positions), or the id is wrong"
                )
            start, end = bounds.offsets[key]
            if not start <= offset <= end:
                raise OffsetOutOfRange(
                    f"cannot commit offset {offset} for {topic}/{partition}: valid offsets are "
                    f"{start}..{end}",
                    start,
                    end,
                )
            checked.append((key, offset))
        now = self._now()

        created: list[bool] = []

        def change(doc: Doc | None) -> tuple[Doc, None]:
            created[:] = [doc is None]
            if member_id is not None:
                if doc is not None:
                    _owned_doc(group, doc, owner, check_owner)
                doc = self._require_member(group, doc, member_id, now)
            else:
                doc = _owned_doc(group, doc, owner, check_owner)
                self._expire(doc, now)
            _adopt_topic_ids(doc, bounds)
            for key, offset in checked:
                holder = doc["owners"].get(key)
                if holder != member_id:
                    who = "nobody" if holder is None else "another member"
                    raise NotPartitionOwner(
                        f"partition {key} of group {group} is owned by {who}; "
                        "only its owner may commit (join again to get partitions)"
                        if member_id is not None
                        else f"partition {key} of group {group} is owned by a live member; "
                        "commit with its member_id"
                    )
                doc["offsets"][key] = offset
            return doc, None

        with self._counted(group, owner, creates=member_id is None):
            self._state.update(_doc_key(group), change)
        if created[0]:
            self._remember(group)

    def names(self) -> list[str]:
        """Every group created since the index was kept (the dashboard lists them), sorted."""
        return sorted((self._state.get(_INDEX_KEY) or {}).get("groups", {}))

    def _remember(self, group: str) -> None:
        """Add a new group to the index; a separate update, so a crash between the two can
        leave a group unlisted (never a listed group that does not exist)."""

        def change(doc: Doc | None) -> tuple[Doc | None, None]:
            doc = doc or {"groups": {}}
            doc["groups"][group] = self._now()
            return doc, None

        self._state.update(_INDEX_KEY, change)

    def owner_of(self, group: str) -> tuple[bool, str | None]:
        """Whether the group exists, and which client it belongs to (None: made without auth)."""
        if not GROUP_NAME.fullmatch(group):
            return False, None
        doc = self._state.get(_doc_key(group))
        return (doc is not None, None if doc is None else doc.get("owner"))

    def describe(self, group: str) -> Doc:
        """Members, owners, committed offsets and lag of a group.  A partition whose end
        cannot be read because its files are damaged (embedded store) is described all the
        same, with no end offset or lag and why (``damaged``): one must not hide the others."""
        described = self.positions(group)
        partitions = []
        for p in described["partitions"]:
            try:
                end: int | None = self._store.end_offset(p["topic"], p["partition"])
                damaged = None
            except PartitionDamaged as exc:
                end, damaged = None, str(exc)
            except BadRequest:
                continue
            partitions.append(with_end(p, end, damaged))
        described["partitions"] = partitions
        return described

    def positions(self, group: str) -> Doc:
        """What :meth:`describe` says without reading the partitions' ends: members, owners
        and committed offsets (for a caller that has the ends already, the dashboard)."""
        self._hearing()
        doc = self._existing(group)
        self._expire(doc, self._now())
        return {
            "group": group,
            "subscription": doc.get("subscription"),
            "generation": doc["generation"],
            "members": [
                {"member_id": m, "last_seen_ms": v["seen"], "session_timeout_ms": v["timeout"]}
                for m, v in sorted(doc["members"].items())
            ],
            "partitions": [
                {
                    "topic": _tp(key)[0],
                    "partition": _tp(key)[1],
                    "committed": doc["offsets"].get(key),
                    "owner": doc["owners"].get(key),
                }
                for key in sorted(set(doc["offsets"]) | set(doc["owners"]))
            ],
        }

    # -- internals ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _counted(self, group: str, owner: str | None, *, creates: bool = True) -> Iterator[None]:
        """Run a change that may create ``group`` for ``owner``, counted against the limit.

        The name is entered in the owner's list first (:class:`LimitReached` if the list is
        full), and taken out again if the change fails while the group does not exist, or
        exists as another owner's.
        """
        if not creates or self._state.get(_doc_key(group)) is not None:
            yield
            return
        entered = self._enter_group(group, owner)
        try:
            yield
        except BaseException:
            if entered:
                exists, holder = self.owner_of(group)
                if not exists or holder != owner:
                    self._state.update(_owner_key(owner), _removing(group))
            raise

    def _enter_group(self, group: str, owner: str | None) -> bool:
        """Enter ``group`` in ``owner``'s list; True if it was not there yet."""
        maximum = self.max_per_owner

        def change(doc: Doc | None) -> tuple[Doc, bool]:
            doc = doc or {"groups": []}
            names: list[str] = doc["groups"]
            if group in names:
                return doc, False
            if len(names) >= maximum:
                raise LimitReached(
                    f"this client created {len(names)} consumer groups, its limit",
                    "max_groups_per_token",
                    maximum,
                )
            names.append(group)
            return doc, True

        return self._state.update(_owner_key(owner), change)

    def _now(self) -> int:
        return int(self._clock() * 1000)

    def _existing(self, group: str) -> Doc:
        validate_group(group)
        doc = self._state.get(_doc_key(group))
        if doc is None:
            raise UnknownGroup(f"no consumer group named {group!r}; join it first")
        return doc

    def _require_member(self, group: str, doc: Doc | None, member_id: str, now: int) -> Doc:
        if doc is None:
            raise UnknownGroup(f"no consumer group named {group!r}; join it first")
        self._expire(doc, now)
        member = doc["members"].get(member_id)
        if member is None:
            raise UnknownMember(
                f"member {member_id} is not in group {group} (it left or missed its session "
                "timeout); join again"
            )
        member["seen"] = now
        return doc

    def _hearing(self) -> None:
        """Note the first group request: from then on, this process hears members."""
        if self._heard_since is None:
            self._heard_since = self._now()

    @contextlib.contextmanager
    def _outage_watch(self) -> Iterator[None]:
        """Remember when the store did not answer this process: a member whose heartbeats
        failed then did not miss them (see :meth:`_expire`)."""
        # from when the request came: a store away may take the operation timeout to fail it
        asked = self._now()
        try:
            yield
        except StoreUnavailable:
            if self._outage_since is None or asked < self._outage_since:
                self._outage_since = asked
            raise
        if self._outage_since is not None:
            self._outages.append((self._outage_since, self._now()))
            self._outage_since = None

    def _away_spans(self, now: int) -> list[tuple[int, int]]:
        """When (ms) no member could be heard here, in order: before this process got its
        first group request (it did not run, or had just started: a restarted gateway does
        not know how long it was down), its own requests that failed because the store was
        away, one still failing ending now (this update runs, so it answers again), and what
        the store saw (a read that waited for Kafka to come back)."""
        spans = [(0, now if self._heard_since is None else self._heard_since)]
        spans += self._outages
        if self._outage_since is not None:
            spans.append((self._outage_since, now))
        spans += [(int(a * 1000), int(b * 1000)) for a, b in self._store.unavailable_spans()]
        return sorted(spans)

    @staticmethod
    def _unheard(spans: list[tuple[int, int]], seen: int, now: int) -> int:
        """Of the time since ``seen``, how long the store was away (a heartbeat then could not
        be recorded, so it does not count against the member); overlaps counted once."""
        unheard, covered = 0, seen
        for start, end in spans:
            start, end = max(start, covered), min(end, now)
            if end > start:
                unheard += end - start
                covered = end
        return unheard

    def _expire(self, doc: Doc, now: int) -> None:
        spans = self._away_spans(now)
        dead = [
            m
            for m, v in doc["members"].items()
            if now - v["seen"] - self._unheard(spans, v["seen"], now) > v["timeout"]
        ]
        for m in dead:
            del doc["members"][m]
        if dead:
            doc["owners"] = {k: m for k, m in doc["owners"].items() if m in doc["members"]}
            doc["generation"] += 1

    def _bounds(self, subscription: Subscription) -> _Bounds:
        """The partitions the subscription covers now.  A named topic that does not exist
        (yet, or any more) has none: the group waits for it, like ``tail -F``."""
        if subscription.prefix is None:
            return self._topic_bounds(list(subscription.topics), missing_ok=True)
        topics = [
            t.name
            for t in self._store.list_topics()
            if in_prefix(t.name, subscription.prefix) and not is_internal(t.name)
        ]
        bounds = self._topic_bounds(topics, missing_ok=True)
        bounds.missing.clear()  # deleted since the listing: nothing to wait for
        return bounds

    def _topic_bounds(self, topics: Sequence[str], *, missing_ok: bool = False) -> _Bounds:
        bounds = _Bounds({})
        for topic in topics:
            try:
                info = self._store.describe_topic(topic)
            except UnknownTopic:
                if missing_ok:
                    bounds.missing.append(topic)
                    continue  # not created yet, or deleted since the listing
                raise
            bounds.topic_ids[topic] = info.topic_id
            bounds.created_ms[topic] = info.created_ms
            for p in info.partitions:
                bounds.offsets[_key((topic, p.partition))] = (p.start_offset, p.end_offset)
        return bounds

    @staticmethod
    def _rebalance(doc: Doc, bounds: _Bounds) -> None:
        """Give unowned partitions to members under their share; ask the ones over it to
        release.  Sticky: a member keeps what it owns up to its share."""
        keys = bounds.keys
        wanted = set(keys)
        owners: dict[str, str] = {k: m for k, m in doc["owners"].items() if k in wanted}
        # A group's first placement; partitions found later (a topic created after the
        # group, or under its prefix) are read from their start.  A group made by a commit
        # before any join has offsets but was never placed: its other partitions follow the
        # join's reset.  (Groups of earlier versions did not say "placed": one with offsets
        # was placed before.)
        placed = doc.get("placed")
        first_time = placed is False or (placed is None and not doc["offsets"])
        doc["placed"] = True
        _adopt_topic_ids(doc, bounds)
        for key in keys:
            if key not in doc["offsets"]:
                start, end = bounds.offsets[key]
                # "latest" applies to a new group only; partitions found later (a new topic
                # under a prefix) are read from their start, so nothing written there is lost.
                latest = first_time and doc.get("reset") == "latest"
                doc["offsets"][key] = end if latest else start
        members = sorted(doc["members"])
        changed = owners != doc["owners"]
        if members:
            owned: dict[str, list[str]] = {m: [] for m in members}
            for key in keys:
                if key in owners:
                    owned[owners[key]].append(key)
            base, extra = divmod(len(keys), len(members))
            by_load = sorted(members, key=lambda m: (-len(owned[m]), m))
            quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_load)}
            revoking: dict[str, list[str]] = {}
            for m in members:
                revoking[m] = owned[m][quota[m] :]
            free = [k for k in keys if k not in owners]
            for key in free:
                m = min(members, key=lambda m: (len(owned[m]) - len(revoking[m]) - quota[m], m))
                if len(owned[m]) - len(revoking[m]) >= quota[m]:
                    break
                owners[key] = m
                owned[m].append(key)
                changed = True
            doc["revoke"] = {m: r for m, r in revoking.items() if r}
        else:
            doc["revoke"] = {}
        if changed:
            doc["generation"] += 1
        doc["owners"] = owners

    def _member_state(
        self, group: str, doc: Doc, member_id: str, missing: Sequence[str] = ()
    ) -> MemberState:
        revoke = set(doc.get("revoke", {}).get(member_id, []))
        topic_ids: dict[str, str] = doc.get("topic_ids", {})
        assignment = [
            AssignedPartition(
                *_tp(key),
                offset=int(doc["offsets"].get(key, 0)),
                topic_id=topic_ids.get(_tp(key)[0]),
            )
            for key, owner in sorted(doc["owners"].items())
            if owner == member_id and key not in revoke
        ]
        return MemberState(
            group=group,
            member_id=member_id,
            generation=int(doc["generation"]),
            session_timeout_ms=int(doc["members"][member_id]["timeout"]),
            assignment=assignment,
            revoke=[_tp(k) for k in sorted(revoke)],
            missing_topics=list(missing),
        )


def _adopt_topic_ids(doc: Doc, bounds: _Bounds) -> None:
    """Offsets belong to one topic identity: when a topic was created again, its partitions'
    offsets restart at the new topic's start (an old offset would skip or stall)."""
    known: dict[str, str] = doc.setdefault("topic_ids", {})
    created: dict[str, int] = doc.setdefault("topic_created_ms", {})
    for topic, topic_id in bounds.topic_ids.items():
        old = known.get(topic)
        if old is not None and old != topic_id and bounds.created_ms[topic] < created.get(topic, 0):
            continue  # bounds read before a concurrent request saw the newer topic
        if old is not None and old != topic_id:
            _log.warning("%s was created again; its group offsets restart at its start", topic)
            for key in [k for k in doc["offsets"] if _tp(k)[0] == topic]:
                start_end = bounds.offsets.get(key)
                if start_end is None:
                    del doc["offsets"][key]
                else:
                    doc["offsets"][key] = start_end[0]
        known[topic] = topic_id
        created[topic] = bounds.created_ms[topic]


def _new_doc() -> Doc:
    return {
        "members": {},
        "owners": {},
        "offsets": {},
        "generation": 0,
        "subscription": None,
        "placed": False,
    }


def _owned_doc(group: str, doc: Doc | None, owner: str | None, check_owner: bool) -> Doc:
    """The group's document, new ones owned by ``owner``; another owner's is refused."""
    if doc is None:
        doc = _new_doc()
        doc["owner"] = owner
    elif check_owner and doc.get("owner") != owner:
        raise NotGroupOwner(f"group {group!r} belongs to another client; use another group name")
    return doc


_INDEX_KEY = "groups-index"


def _doc_key(group: str) -> str:
    return f"group/{group}"


def _owner_key(owner: str | None) -> str:
    """The document listing the groups ``owner`` created (None: made without auth)."""
    return "group-owner/" if owner is None else f"group-owner/{owner}"


def _removing(group: str) -> Callable[[Doc | None], tuple[Doc | None, None]]:
    def change(doc: Doc | None) -> tuple[Doc | None, None]:
        if doc is not None and group in doc["groups"]:
            doc["groups"].remove(group)
        return doc, None

    return change


def _describe_sub(raw: Any) -> str:
    if not raw:
        return "nothing"
    if raw.get("prefix") is not None:
        return f"the prefix {raw['prefix']!r}"
    return "topics " + ", ".join(raw.get("topics") or [])


def with_end(position: Doc, end: int | None, damaged: str | None) -> Doc:
    """A partition of :meth:`GroupCoordinator.positions` with its end offset and lag, as
    :meth:`GroupCoordinator.describe` shows it; a damaged one says why and has no lag."""
    committed = position["committed"]
    row = {
        "topic": position["topic"],
        "partition": position["partition"],
        "committed": committed,
        "end_offset": end,
        "lag": None if committed is None or end is None or damaged else end - committed,
        "owner": position["owner"],
    }
    if damaged is not None:
        row["damaged"] = damaged
    return row
