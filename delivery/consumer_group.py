"""Consumer groups: members share a subscription's partitions and commit offsets server-side.

Members join, heartbeat and leave.  A partition has at most one owner; ownership moves only
when the owner releases it (asked to, when the group rebalances) or is dead (no heartbeat for
its session timeout).  A commit is accepted only from the partition's owner, so a member that
was presumed dead cannot move a position that its successor now owns.  With commit-after-
process, a clean leave hands over exactly where the member stopped: nothing is read twice.

All state is one JSON document per group in :class:`~delivery.internal_state.InternalState`,
changed only inside the store's partition lock: any gateway process can serve any request.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from delivery.internal_state import Doc, InternalState, is_internal
from log_store.errors import BadRequest, OffsetOutOfRange, UnknownPartition, UnknownTopic
from log_store.interface import LogStore

GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
DEFAULT_SESSION_TIMEOUT_MS = 10_000
MIN_SESSION_TIMEOUT_MS = 500
MAX_SESSION_TIMEOUT_MS = 300_000
RESETS = ("earliest", "latest")

TopicPartition = tuple[str, int]


class UnknownGroup(BadRequest):
    """No member ever joined a group of this name."""


class UnknownMember(BadRequest):
    """The member left or was expired; it must join again."""


class NotPartitionOwner(BadRequest):
    """A commit for a partition the committing member does not own."""


class SubscriptionConflict(BadRequest):
    """A join whose topics differ from those of the group's live members."""


@dataclass(frozen=True)
class Subscription:
    """What a group reads: named topics, or every topic whose name starts with a prefix."""

    topics: tuple[str, ...] = ()
    prefix: str | None = None

    def __post_init__(self) -> None:
        if bool(self.topics) == (self.prefix is not None):
            raise BadRequest("subscribe to a list of topics or to a prefix (one of the two)")
        if self.prefix is not None and not self.prefix:
            raise BadRequest("prefix must not be empty")

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


@dataclass(frozen=True)
class MemberState:
    """What a member is told on join and on every heartbeat."""

    group: str
    member_id: str
    generation: int
    session_timeout_ms: int
    assignment: list[AssignedPartition] = field(default_factory=list)
    revoke: list[TopicPartition] = field(default_factory=list)

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
            "assignment": [
                {"topic": a.topic, "partition": a.partition, "offset": a.offset}
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
    """Each partition's (start, end) offsets, read before the state transaction."""

    offsets: dict[str, tuple[int, int]]

    @property
    def keys(self) -> list[str]:
        return sorted(self.offsets)


class GroupCoordinator:
    """Join, heartbeat, leave, commit and describe consumer groups of one store."""

    def __init__(
        self, store: LogStore, state: InternalState, clock: Callable[[], float] = time.time
    ) -> None:
        self._store = store
        self._state = state
        self._clock = clock

    # -- requests ---------------------------------------------------------------------------
    def join(
        self,
        group: str,
        subscription: Subscription,
        *,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        reset: str = "latest",
    ) -> MemberState:
        """Add a member; its partitions are in the answer (and in every heartbeat's)."""
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

        def change(doc: Doc | None) -> tuple[Doc, MemberState]:
            doc = doc or _new_doc()
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
            return doc, self._member_state(group, doc, member_id)

        return self._state.update(_doc_key(group), change)

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
            return doc, self._member_state(group, doc, member_id)

        return self._state.update(_doc_key(group), change)

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

    def commit(
        self, group: str, member_id: str | None, offsets: Sequence[tuple[str, int, int]]
    ) -> None:
        """Record positions (the next offset to read).  Only a partition's owner may commit;
        without a member id, only partitions that nobody owns (manual offset management)."""
        validate_group(group)
        checked: list[tuple[str, int]] = []
        for topic, partition, offset in offsets:
            info = self._partition_bounds(topic, partition)
            if not info[0] <= offset <= info[1]:
                raise OffsetOutOfRange(
                    f"cannot commit offset {offset} for {topic}/{partition}: valid offsets are "
                    f"{info[0]}..{info[1]}",
                    info[0],
                    info[1],
                )
            checked.append((_key((topic, partition)), offset))
        now = self._now()

        def change(doc: Doc | None) -> tuple[Doc, None]:
            if member_id is not None:
                doc = self._require_member(group, doc, member_id, now)
            else:
                doc = doc or _new_doc()
                self._expire(doc, now)
            for key, offset in checked:
                owner = doc["owners"].get(key)
                if owner != member_id:
                    who = "nobody" if owner is None else "another member"
                    raise NotPartitionOwner(
                        f"partition {key} of group {group} is owned by {who}; "
                        "only its owner may commit (join again to get partitions)"
                        if member_id is not None
                        else f"partition {key} of group {group} is owned by a live member; "
                        "commit with its member_id"
                    )
                doc["offsets"][key] = offset
            return doc, None

        self._state.update(_doc_key(group), change)

    def describe(self, group: str) -> Doc:
        """Members, owners, committed offsets and lag of a group."""
        doc = self._existing(group)
        self._expire(doc, self._now())
        partitions = []
        for key in sorted(set(doc["offsets"]) | set(doc["owners"])):
            topic, partition = _tp(key)
            try:
                end = self._store.end_offset(topic, partition)
            except BadRequest:
                continue
            committed = doc["offsets"].get(key)
            partitions.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "committed": committed,
                    "end_offset": end,
                    "lag": None if committed is None else end - committed,
                    "owner": doc["owners"].get(key),
                }
            )
        return {
            "group": group,
            "subscription": doc.get("subscription"),
            "generation": doc["generation"],
            "members": [
                {"member_id": m, "last_seen_ms": v["seen"], "session_timeout_ms": v["timeout"]}
                for m, v in sorted(doc["members"].items())
            ],
            "partitions": partitions,
        }

    # -- internals ----------------------------------------------------------------------------
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

    @staticmethod
    def _expire(doc: Doc, now: int) -> None:
        dead = [m for m, v in doc["members"].items() if now - v["seen"] > v["timeout"]]
        for m in dead:
            del doc["members"][m]
        if dead:
            doc["owners"] = {k: m for k, m in doc["owners"].items() if m in doc["members"]}
            doc["generation"] += 1

    def _partition_bounds(self, topic: str, partition: int) -> tuple[int, int]:
        info = self._store.describe_topic(topic)
        for p in info.partitions:
            if p.partition == partition:
                return p.start_offset, p.end_offset
        raise UnknownPartition(f"{topic} has no partition {partition}")

    def _bounds(self, subscription: Subscription) -> _Bounds:
        if subscription.prefix is not None:
            topics = [
                t.name
                for t in self._store.list_topics()
                if t.name.startswith(subscription.prefix) and not is_internal(t.name)
            ]
        else:
            topics = list(subscription.topics)
        offsets: dict[str, tuple[int, int]] = {}
        for topic in topics:
            try:
                info = self._store.describe_topic(topic)
            except UnknownTopic:
                if subscription.prefix is not None:
                    continue  # deleted between the listing and now
                raise
            for p in info.partitions:
                offsets[_key((topic, p.partition))] = (p.start_offset, p.end_offset)
        return _Bounds(offsets)

    @staticmethod
    def _rebalance(doc: Doc, bounds: _Bounds) -> None:
        """Give unowned partitions to members under their share; ask the ones over it to
        release.  Sticky: a member keeps what it owns up to its share."""
        keys = bounds.keys
        wanted = set(keys)
        owners: dict[str, str] = {k: m for k, m in doc["owners"].items() if k in wanted}
        first_time = not doc["offsets"]
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

    def _member_state(self, group: str, doc: Doc, member_id: str) -> MemberState:
        revoke = set(doc.get("revoke", {}).get(member_id, []))
        assignment = [
            AssignedPartition(*_tp(key), offset=int(doc["offsets"].get(key, 0)))
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
        )


def _new_doc() -> Doc:
    return {"members": {}, "owners": {}, "offsets": {}, "generation": 0, "subscription": None}


def _doc_key(group: str) -> str:
    return f"group/{group}"


def _describe_sub(raw: Any) -> str:
    if not raw:
        return "nothing"
    if raw.get("prefix") is not None:
        return f"the prefix {raw['prefix']!r}"
    return "topics " + ", ".join(raw.get("topics") or [])
