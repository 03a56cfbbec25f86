"""Push delivery: the gateway POSTs batches of messages to subscribers' HTTP endpoints.

A subscription names an endpoint, the topics (or a topic prefix), a batch size and a linger
time.  Each batch holds messages in partition order, each with its topic, partition and
offset, so a receiver deduplicates a retried batch by those three.  A batch is retried with
exponential backoff until the endpoint answers 2xx; only then do the subscription's positions
move.  Only the answer's status counts: a few KiB of its body at most are read, and each POST
has one deadline as a whole (``timeout_ms``).  Every subscription runs in its own task with its
own HTTP client, so a failing endpoint delays only its own subscription.

Subscriptions and positions live in :class:`~delivery.internal_state.InternalState`, so they
survive restarts.  With several gateway processes over one store, a lease decides which
process delivers a subscription; positions are written only by the lease holder.

A subscription belongs to the client (token owner) that created it; each owner may hold at
most ``max_per_owner`` of them.  Endpoints are checked against a
:class:`~delivery.push_targets.PushTargetPolicy` when a subscription is created and on every
connection delivery makes (see :mod:`delivery.push_targets`).

The owner's grant is checked again while delivering, not only at the creation: tokens change
(a rotation removes the old one, an operator narrows a ``read`` glob) and a subscription must
not outlive its owner's right to read.  A topic its owner may no longer read (or every topic,
when no token has the owner's name any more) is *suspended*: nothing of it is delivered, its
positions stay where they were, and it resumes from there once the grant is back.  What
decides is a :class:`HolderGrants` the gateway gives (its configured tokens).
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import anyio.to_thread
import httpx
import orjson

from audit.records import in_prefix, is_audit_topic
from audit.windows import WindowCounts
from delivery.append_watch import AppendWatch
from delivery.filters import MessageFilter, filter_from_json
from delivery.framing import message_json
from delivery.internal_state import Doc, InternalState, is_internal
from delivery.partition_reader import PartitionReader
from delivery.push_targets import PushTargetPolicy, guarded_client
from log_store.errors import (
    BadRequest,
    CorruptData,
    LimitReached,
    LogbrokerError,
    OffsetOutOfRange,
    StoreUnavailable,
    UnknownTopic,
)
from log_store.interface import LogStore

_log = logging.getLogger(__name__)

SUBSCRIPTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_REGISTRY_KEY = "push/subscriptions"
LEASE_MS = 5_000
_SUPERVISE_S = 1.0
_LOOP_RETRY_S = 1.0
"""A delivery loop that failed (Kafka or a partition's owner away, say) tries again after this."""
_DAMAGED_LOOK_S = 30.0
"""How often a partition stopped at a damaged batch is read again (an operator may have
dropped the damaged segment meanwhile: docs/operations.md, "A batch fails its checksum")."""
_STOP_GRACE_S = 5.0
PUSH_MEDIA_TYPE = "application/json"
ANSWER_BODY_BYTES = 4 * 1024
"""How much of an endpoint's answer body push delivery reads: only the status counts.  Past
it (plus the rest of the one network read that crossed it, at most 64 KiB) the connection is
dropped."""
DEFAULT_MAX_PER_OWNER = 100
_OWNER_FIELD = "owner"


class HolderGrants(Protocol):
    """Whether a subscription's owner may read a topic now (the gateway's current tokens)."""

    def refusal(self, owner: str | None, topic: str) -> str | None:
        """Why ``owner`` (``None``: made while auth was off) may not read ``topic`` now;
        ``None`` if it may."""


class OpenGrants:
    """No tokens: every subscription may read every topic."""

    def refusal(self, owner: str | None, topic: str) -> str | None:
        return None


class UnknownSubscription(BadRequest):
    """No push subscription of this name."""


class SubscriptionExists(BadRequest):
    """A push subscription of this name exists with other settings."""


class NotSubscriptionOwner(BadRequest):
    """A subscription of this name exists and belongs to another client."""


class LeaseLost(LogbrokerError):
    """Another process took over a subscription; this one must stop delivering it."""


@dataclass(frozen=True)
class PushSubscription:
    """One push subscription's settings."""

    name: str
    endpoint: str
    topics: tuple[str, ...] = ()
    prefix: str | None = None
    batch_size: int = 500
    batch_bytes: int = 4 * 1024 * 1024
    linger_ms: int = 200
    timeout_ms: int = 10_000
    min_backoff_ms: int = 100
    max_backoff_ms: int = 30_000
    reset: str = "earliest"
    filter: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not SUBSCRIPTION_NAME.fullmatch(self.name):
            raise BadRequest("subscription name must be 1-200 characters of [A-Za-z0-9._-]")
        url = urlsplit(self.endpoint)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise BadRequest(f"endpoint must be an http(s) URL, got {self.endpoint!r}")
        if bool(self.topics) == (self.prefix is not None):
            raise BadRequest("give topics or a prefix (one of the two)")
        if self.prefix is not None and not self.prefix:
            raise BadRequest("prefix must not be empty")
        _in_range("batch_size", self.batch_size, 1, 100_000)
        _in_range("batch_bytes", self.batch_bytes, 1, 64 * 1024 * 1024)
        _in_range("linger_ms", self.linger_ms, 0, 60_000)
        _in_range("timeout_ms", self.timeout_ms, 10, 600_000)
        _in_range("min_backoff_ms", self.min_backoff_ms, 1, 600_000)
        _in_range("max_backoff_ms", self.max_backoff_ms, self.min_backoff_ms, 3_600_000)
        if self.reset not in ("earliest", "latest"):
            raise BadRequest("reset must be earliest or latest")
        filter_from_json(self.filter)

    @property
    def message_filter(self) -> MessageFilter:
        return filter_from_json(self.filter)

    def to_json(self) -> Doc:
        return {
            "name": self.name,
            "endpoint": self.endpoint,
            "topics": list(self.topics),
            "prefix": self.prefix,
            "batch_size": self.batch_size,
            "batch_bytes": self.batch_bytes,
            "linger_ms": self.linger_ms,
            "timeout_ms": self.timeout_ms,
            "min_backoff_ms": self.min_backoff_ms,
            "max_backoff_ms": self.max_backoff_ms,
            "reset": self.reset,
            "filter": dict(self.filter),
        }

    @classmethod
    def from_json(cls, raw: object) -> PushSubscription:
        if not isinstance(raw, dict):
            raise BadRequest("a subscription must be a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise BadRequest(f"unknown subscription fields: {', '.join(sorted(unknown))}")
        for name in ("name", "endpoint"):
            if not isinstance(raw.get(name), str):
                raise BadRequest(f"subscription needs {name} (a string)")
        kwargs = dict(raw)
        topics = kwargs.get("topics") or []
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise BadRequest("topics must be a list of topic names")
        kwargs["topics"] = tuple(topics)
        for name in (
            "batch_size",
            "batch_bytes",
            "linger_ms",
            "timeout_ms",
            "min_backoff_ms",
            "max_backoff_ms",
        ):
            if name in kwargs and (
                not isinstance(kwargs[name], int) or isinstance(kwargs[name], bool)
            ):
                raise BadRequest(f"{name} must be an integer")
        if kwargs.get("filter") is None:
            kwargs["filter"] = {}
        return cls(**kwargs)


def _in_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise BadRequest(f"{name} must be in {low}..{high}, got {value}")


def _key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def _state_key(name: str) -> str:
    return f"push/state/{name}"


def _settings(raw: Doc) -> PushSubscription:
    return PushSubscription.from_json({k: v for k, v in raw.items() if k != _OWNER_FIELD})


class SubscriptionRegistry:
    """Create, list, describe and delete subscriptions (stored, so they survive restarts).

    Each stored subscription carries its ``owner`` (None when made without auth).
    """

    def __init__(
        self,
        store: LogStore,
        state: InternalState,
        max_per_owner: int = DEFAULT_MAX_PER_OWNER,
        grants: HolderGrants | None = None,
    ) -> None:
        self._store = store
        self._state = state
        self.max_per_owner = max_per_owner
        self.grants: HolderGrants = grants or OpenGrants()

    def create(self, sub: PushSubscription, owner: str | None = None) -> bool:
        """Store ``sub`` for ``owner``; True if new, False if an identical one exists (a
        repeated create).  A name taken by another owner is :class:`NotSubscriptionOwner`;
        an owner's ``max_per_owner + 1``-th subscription is :class:`LimitReached`.

        A named topic need not exist yet: its data is delivered from its start once it does.
        """
        stored = {**sub.to_json(), _OWNER_FIELD: owner}

        def change(doc: Doc | None) -> tuple[Doc, bool]:
            doc = doc or {}
            existing = doc.get(sub.name)
            if existing is not None:
                if existing.get(_OWNER_FIELD) != owner:
                    raise NotSubscriptionOwner(
                        f"subscription {sub.name!r} belongs to another client; choose another name"
                    )
                if existing != stored:
                    raise SubscriptionExists(
                        f"subscription {sub.name!r} exists with other settings; delete it first"
                    )
                return doc, False
            held = sum(1 for raw in doc.values() if raw.get(_OWNER_FIELD) == owner)
            if held >= self.max_per_owner:
                raise LimitReached(
                    f"this client holds {held} push subscriptions, its limit; delete one first",
                    "max_subscriptions_per_token",
                    self.max_per_owner,
                )
            doc[sub.name] = stored
            return doc, True

        created = self._state.update(_REGISTRY_KEY, change)
        self._store_initial_positions(sub)
        return created

    def _store_initial_positions(self, sub: PushSubscription) -> None:
        """Positions are stored before the create is answered: with ``reset=latest``, what is
        written after the answer is delivered even if no batch was pushed before a restart or a
        handover.  A repeated create finds them stored and changes nothing."""
        parts = _partitions(self._store, sub)

        def change(doc: Doc | None) -> tuple[Doc, None]:
            doc = doc or {"offsets": {}}
            if not doc.get("initialized"):
                _place_new_partitions(doc, parts, sub.reset, sub.name)
            return doc, None

        self._state.update(_state_key(sub.name), change)

    def delete(self, name: str) -> None:
        def change(doc: Doc | None) -> tuple[Doc, None]:
            if not doc or name not in doc:
                raise UnknownSubscription(f"no push subscription named {name!r}")
            del doc[name]
            return doc, None

        self._state.update(_REGISTRY_KEY, change)
        self._state.update(_state_key(name), lambda _doc: (None, None))

    def list(self) -> list[PushSubscription]:
        return [sub for sub, _ in self.list_owned()]

    def list_owned(self) -> builtins.list[tuple[PushSubscription, str | None]]:
        """Every subscription with its owner, by name."""
        doc = self._state.get(_REGISTRY_KEY) or {}
        return [(_settings(raw), raw.get(_OWNER_FIELD)) for _, raw in sorted(doc.items())]

    def owner_of(self, name: str) -> tuple[bool, str | None]:
        """Whether ``name`` exists, and its owner."""
        raw = (self._state.get(_REGISTRY_KEY) or {}).get(name)
        return (raw is not None, None if raw is None else raw.get(_OWNER_FIELD))

    def get(self, name: str) -> PushSubscription:
        doc = self._state.get(_REGISTRY_KEY) or {}
        if name not in doc:
            raise UnknownSubscription(f"no push subscription named {name!r}")
        return _settings(doc[name])

    def skipped(self, name: str) -> dict[str, int]:
        """Per kind (:data:`SKIP_KINDS`), the messages ``name`` passed over undelivered."""
        st = self._state.get(_state_key(name)) or {}
        return _skipped_of(st)

    def status(self, name: str) -> Doc:
        """Settings, positions, lag, the last error, who delivers it now, its owner, and the
        topics suspended because the owner may not read them (as this gateway's tokens say)."""
        raw = (self._state.get(_REGISTRY_KEY) or {}).get(name)
        if raw is None:
            raise UnknownSubscription(f"no push subscription named {name!r}")
        sub = _settings(raw)
        owner = raw.get(_OWNER_FIELD)
        st = self._state.get(_state_key(name)) or {}
        offsets: dict[str, int] = st.get("offsets", {})
        partitions = []
        for p in _partitions(self._store, sub):
            committed = offsets.get(_key(p.topic, p.partition))
            partitions.append(
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "position": committed,
                    "start_offset": p.start,
                    "end_offset": p.end,
                    "lag": None if committed is None else p.end - committed,
                }
            )
        present = {str(p["topic"]) for p in partitions}
        suspended = suspended_topics(self.grants, owner, sorted(present | set(sub.topics)))
        return {
            "subscription": sub.to_json(),
            "owner": owner,
            "suspended": [{"topic": t, "reason": r} for t, r in sorted(suspended.items())],
            "missing_topics": [t for t in sub.topics if t not in present],
            "holder": st.get("holder"),
            "delivered_messages": st.get("delivered", 0),
            "delivered_batches": st.get("batches", 0),
            "last_error": st.get("last_error"),
            "damaged": [
                {"topic": k.rsplit("/", 1)[0], "partition": int(k.rsplit("/", 1)[1]), **v}
                for k, v in sorted((st.get("damaged") or {}).items())
            ],
            "skipped_messages": _skipped_of(st),
            "last_skip": st.get("last_skip"),
            "partitions": partitions,
        }


def suspended_topics(
    grants: HolderGrants, owner: str | None, topics: builtins.list[str]
) -> dict[str, str]:
    """Of ``topics``, those ``owner`` may not read now, each with the reason."""
    out: dict[str, str] = {}
    for topic in topics:
        reason = grants.refusal(owner, topic)
        if reason is not None:
            out[topic] = reason
    return out


NOT_ENVELOPE = "not_envelope"
LOST_TO_RETENTION = "lost_to_retention"
SKIP_KINDS = (NOT_ENVELOPE, LOST_TO_RETENTION)
"""What a subscription passes over undelivered: a record that is not an envelope (another
producer's, in a Kafka topic), or messages retention dropped before they were delivered."""


def _skipped_of(state: Doc) -> dict[str, int]:
    counts = state.get("skipped") or {}
    return {kind: int(counts.get(kind, 0)) for kind in SKIP_KINDS}


@dataclass(frozen=True)
class _Skip:
    kind: str
    partition: tuple[str, int]
    offset: int
    messages: int
    reason: str

    def to_json(self) -> Doc:
        topic, partition = self.partition
        return {
            "at_ms": int(time.time() * 1000),
            "kind": self.kind,
            "topic": topic,
            "partition": partition,
            "offset": self.offset,
            "messages": self.messages,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class _Partition:
    topic: str
    topic_id: str
    partition: int
    start: int
    end: int


def _partitions(store: LogStore, sub: PushSubscription) -> list[_Partition]:
    if sub.prefix is not None:
        topics = sorted(
            t.name
            for t in store.list_topics()
            if in_prefix(t.name, sub.prefix) and not is_internal(t.name)
        )
    else:
        topics = list(sub.topics)
    out: list[_Partition] = []
    for topic in topics:
        try:
            info = store.describe_topic(topic)
        except UnknownTopic:
            continue
        for p in info.partitions:
            out.append(_Partition(topic, info.topic_id, p.partition, p.start_offset, p.end_offset))
    return out


def _place_new_partitions(doc: Doc, parts: list[_Partition], reset: str, name: str) -> bool:
    """Give every partition without a stored position one, in ``doc``; True if any changed.

    ``reset`` applies once, to the partitions there when the positions are first stored (at
    the subscription's creation); partitions found later, and topics created again (a new
    topic id: the stored offsets belong to the old topic), are read from their start.
    """
    offsets: dict[str, int] = doc.setdefault("offsets", {})
    topic_ids: dict[str, str] = doc.setdefault("topic_ids", {})
    latest = not doc.get("initialized") and reset == "latest"
    changed = not doc.get("initialized")
    doc["initialized"] = True
    for topic_id, topic in sorted({(p.topic_id, p.topic) for p in parts}):
        known = topic_ids.get(topic)
        if known is not None and known != topic_id:
            _log.warning(
                "push %s: topic %s was created again; delivering the new topic from its start",
                name,
                topic,
            )
            for key in [k for k in offsets if k.rpartition("/")[0] == topic]:
                del offsets[key]
        if known != topic_id:
            topic_ids[topic] = topic_id
            changed = True
    for p in parts:
        key = _key(p.topic, p.partition)
        if key not in offsets:
            offsets[key] = p.end if latest else p.start
            changed = True
        elif offsets[key] > p.end:
            # Past the end: offsets of an older topic of this name (created again unnoticed).
            offsets[key] = p.start
            changed = True
    return changed


def count_pushed(counts: WindowCounts, batch: list[dict[str, Any]]) -> None:
    """Count a delivered batch's data messages and their lines for the audit (the raw ones
    in one step: one journal append a batch, see :mod:`audit.journal`)."""
    raw: dict[tuple[str, int], list[int]] = {}
    for m in batch:
        if m.get("kind", "chunk") not in ("chunk", "legacy_data") or is_audit_topic(m["topic"]):
            continue
        text = m.get("data")
        if text is not None:
            tally = raw.setdefault((m["topic"], m["create_time"]), [0, 0])
            tally[0] += 1
            tally[1] += text.count("\n")
        elif "data_b64" in m:
            data = base64.b64decode(m["data_b64"])
            counts.add_chunk(m["topic"], m["create_time"], m.get("codec", "raw"), data)
    if raw:
        counts.add_many([(topic, t, n, lines) for (topic, t), (n, lines) in raw.items()])


class _Delivery:
    """The delivery loop of one subscription in this process, while it holds the lease."""

    def __init__(
        self, owner: PushDelivery, sub: PushSubscription, client: str | None = None
    ) -> None:
        self.owner = owner
        self.sub = sub
        self.client = client
        """Whose subscription it is (the token owner that made it; None: made without auth)."""
        self.suspended: dict[str, str] = {}
        """Topics the client may not read now, with the reason: nothing of them is read."""
        self.checked = False
        self.stopping = False
        self.task: asyncio.Task[None] | None = None
        self.positions: dict[tuple[str, int], int] = {}
        self.topic_ids: dict[str, str] = {}
        self.placed = False
        self.rotation = 0
        self.skips: list[_Skip] = []
        """What the batch being collected passed over undelivered, recorded with its positions."""
        self.damaged: dict[tuple[str, int], tuple[int, float]] = {}
        """Partitions stopped at a batch that fails its checksum: the batch's offset, and when
        to read it again.  The other partitions go on."""

    async def run(self) -> None:
        timeout = self.sub.timeout_ms / 1000
        async with guarded_client(self.owner.targets, timeout) as client:
            while not self.stopping:
                try:
                    await self._refresh_positions()
                    await self._check_grants()
                    batch, next_positions = await self._collect()
                    if not batch:
                        continue
                    topics = {m["topic"] for m in batch}
                    if not await anyio.to_thread.run_sync(self._still_known, topics):
                        continue  # the next refresh starts the new topic over
                    delivered = await self._post(client, batch)
                    if not delivered:
                        return
                    await anyio.to_thread.run_sync(self._commit, next_positions, len(batch))
                    self.positions.update(next_positions)
                    if self.sub.message_filter.matches_all:
                        count_pushed(self.owner.audit_counts(self.sub.name), batch)
                except LeaseLost:
                    _log.info("push %s: another process took it over", self.sub.name)
                    return
                except asyncio.CancelledError:
                    raise
                except StoreUnavailable as exc:
                    # expected while Kafka or a partition's owner is away (a broker or a
                    # gateway killed): retried as documented, one line and no trace
                    _log.warning("push %s: %s; retrying", self.sub.name, exc)
                    await anyio.to_thread.run_sync(self._record_error, f"unavailable: {exc}")
                    await asyncio.sleep(_LOOP_RETRY_S)
                except Exception as exc:
                    _log.exception("push %s: delivery loop failed; retrying", self.sub.name)
                    await anyio.to_thread.run_sync(self._record_error, f"internal: {exc}")
                    await asyncio.sleep(_LOOP_RETRY_S)

    async def _refresh_positions(self) -> None:
        """Positions for partitions not seen yet (new topics under a prefix, topics created
        again), stored before anything is delivered from them."""
        parts = await anyio.to_thread.run_sync(_partitions, self.owner.store, self.sub)
        current = {(p.topic, p.partition) for p in parts}
        unchanged = all(self.topic_ids.get(p.topic) == p.topic_id for p in parts)
        # Also when a topic came back after a look that found it gone (then no positions).
        if self.placed and unchanged and current == set(self.positions):
            return
        offsets = await anyio.to_thread.run_sync(self._place, parts)
        self.positions = {
            (p.topic, p.partition): offsets[_key(p.topic, p.partition)] for p in parts
        }
        self.topic_ids = {p.topic: p.topic_id for p in parts}
        self.placed = True

    async def _check_grants(self) -> None:
        """Suspend the topics the client may no longer read, resume those it may again.

        A suspended topic's positions do not move, so it resumes exactly where it stopped.
        The suspended topics are stored with the positions (only when they change), so that
        a gateway started with the grant back logs the resumption too.
        """
        topics = sorted({topic for topic, _ in self.positions})
        now = suspended_topics(self.owner.grants, self.client, topics)
        if self.checked and now == self.suspended:
            return
        before = await anyio.to_thread.run_sync(self._record_suspended, now)
        self.checked = True
        self.suspended = now
        for topic, reason in sorted(now.items()):
            if before.get(topic) != reason:
                _log.warning("push %s: suspended for topic %s: %s", self.sub.name, topic, reason)
        for topic in sorted(set(before) - set(now)):
            if topic in topics:
                _log.warning(
                    "push %s: resumed for topic %s: its owner may read it again; delivering "
                    "from where it stopped",
                    self.sub.name,
                    topic,
                )

    def _record_suspended(self, now: dict[str, str]) -> dict[str, str]:
        """Store the suspended topics; those stored before."""
        holder = self.owner.holder_id

        def change(doc: Doc | None) -> tuple[Doc | None, dict[str, str]]:
            if doc is None or doc.get("holder") != holder:
                raise LeaseLost(self.sub.name)
            before = dict(doc.get("suspended") or {})
            if before == now:
                return doc, before
            if now:
                doc["suspended"] = now
            else:
                doc.pop("suspended", None)
            return doc, before

        return self.owner.state.update(_state_key(self.sub.name), change)

    def _place(self, parts: list[_Partition]) -> dict[str, int]:
        holder = self.owner.holder_id

        def change(doc: Doc | None) -> tuple[Doc, dict[str, int]]:
            if doc is None or doc.get("holder") != holder:
                raise LeaseLost(self.sub.name)
            _place_new_partitions(doc, parts, self.sub.reset, self.sub.name)
            return doc, dict(doc["offsets"])

        return self.owner.state.update(_state_key(self.sub.name), change)

    def _still_known(self, topics: set[str]) -> bool:
        """Checked after reading: an unchanged topic id proves the batch came from the topic
        the positions belong to, not from one of the same name created since."""
        for topic in topics:
            try:
                topic_id = self.owner.store.describe_topic(topic).topic_id
            except UnknownTopic:
                topic_id = None
            if topic_id != self.topic_ids.get(topic):
                _log.warning("push %s: %s changed while it was read", self.sub.name, topic)
                return False
        return True

    async def _collect(self) -> tuple[list[dict[str, Any]], dict[tuple[str, int], int]]:
        """Wait for messages, linger for more, and return up to one batch."""
        sub = self.sub
        batch: list[dict[str, Any]] = []
        batch_bytes = 0
        scanned: dict[tuple[str, int], int] = {}
        deadline: float | None = None
        self.skips = []
        started = time.monotonic()
        order = sorted(
            tp
            for tp in self.positions
            if tp[0] not in self.suspended and self.damaged.get(tp, (0, 0.0))[1] <= started
        )
        # Start each batch one partition further, so a backlog in one does not starve others.
        self.rotation = (self.rotation + 1) % max(1, len(order))
        order = order[self.rotation :] + order[: self.rotation]
        while not self.stopping:
            for tp in order:
                if len(batch) >= sub.batch_size or batch_bytes >= sub.batch_bytes:
                    break
                offset = scanned.get(tp, self.positions[tp])
                try:
                    result = await anyio.to_thread.run_sync(
                        self._read, tp, offset, sub.batch_bytes - batch_bytes
                    )
                except OffsetOutOfRange as exc:
                    # Retention dropped what this subscription had not delivered yet.
                    _log.warning("push %s: %s; skipping to %d", sub.name, exc, exc.start_offset)
                    self.skips.append(
                        _Skip(LOST_TO_RETENTION, tp, offset, exc.start_offset - offset, str(exc))
                    )
                    scanned[tp] = exc.start_offset
                    continue
                except UnknownTopic:
                    continue
                except CorruptData as exc:
                    await self._stop_at_damage(tp, exc)
                    continue
                if self.damaged.pop(tp, None) is not None:
                    _log.warning("push %s: %s partition %d is read again", sub.name, *tp)
                    await anyio.to_thread.run_sync(self._record_damaged, tp, None)
                room = sub.batch_size - len(batch)
                taken = result.messages[:room]
                # The incarnation of the topic (checked again by _still_known before the
                # POST): a topic deleted and made again repeats (topic, partition, offset).
                topic_id = self.topic_ids.get(tp[0])
                for m in taken:
                    pushed = message_json(tp[0], tp[1], m)
                    pushed["topic_id"] = topic_id
                    batch.append(pushed)
                    batch_bytes += len(m.value)
                if len(taken) < len(result.messages):
                    scanned[tp] = taken[-1].offset + 1
                else:
                    scanned[tp] = result.next_offset
                self.skips.extend(
                    _Skip(NOT_ENVELOPE, tp, n.offset, 1, n.reason)
                    for n in result.not_envelopes
                    if n.offset < scanned[tp]
                )
            full = len(batch) >= sub.batch_size or batch_bytes >= sub.batch_bytes
            now = time.monotonic()
            if batch and deadline is None:
                deadline = now + sub.linger_ms / 1000
            if full or (deadline is not None and now >= deadline):
                break
            if not batch and any(self.positions[tp] != off for tp, off in scanned.items()):
                # Everything scanned was filtered out: remember how far we got.
                await anyio.to_thread.run_sync(self._commit, dict(scanned), 0)
                self.positions.update(scanned)
            wait_s = _SUPERVISE_S if deadline is None else max(0.0, deadline - now)
            positions = [(t, p, scanned.get((t, p), self.positions[t, p])) for t, p in order]
            if positions:
                await self.owner.watch.wait_any(positions, wait_s)
            else:  # nothing to wait on (every topic suspended, or none there yet)
                await asyncio.sleep(wait_s)
            if deadline is None and not batch:
                return [], {}
        return batch, scanned

    async def _stop_at_damage(self, tp: tuple[str, int], exc: CorruptData) -> None:
        """Stop delivering partition ``tp`` at a damaged batch (waiting does not mend it) and
        say so once per batch, in the log and the subscription's ``last_error``; the other
        partitions go on, and ``tp`` is read again every :data:`_DAMAGED_LOOK_S`."""
        said = self.damaged.get(tp, (None, 0.0))[0] == exc.offset
        self.damaged[tp] = (exc.offset, time.monotonic() + _DAMAGED_LOOK_S)
        if said:
            return
        _log.error(
            "push %s: %s partition %d stopped at offset %d: %s (see docs/operations.md, "
            "'A batch fails its checksum')",
            self.sub.name,
            tp[0],
            tp[1],
            exc.offset,
            exc,
        )
        await anyio.to_thread.run_sync(self._record_error, f"corrupt_data: {exc}")
        entry = {"offset": exc.offset, "error": str(exc)}
        await anyio.to_thread.run_sync(self._record_damaged, tp, entry)

    def _record_damaged(self, tp: tuple[str, int], entry: dict[str, Any] | None) -> None:
        """Show (or, with None, stop showing) partition ``tp`` as stopped at a damaged batch
        in the subscription's status (``damaged``)."""
        holder = self.owner.holder_id

        def change(doc: Doc | None) -> tuple[Doc | None, None]:
            if doc is None or doc.get("holder") != holder:
                raise LeaseLost(self.sub.name)
            damaged = doc.setdefault("damaged", {})
            if entry is None:
                damaged.pop(_key(*tp), None)
            else:
                damaged[_key(*tp)] = entry
            if not damaged:
                doc.pop("damaged")
            return doc, None

        self.owner.state.update(_state_key(self.sub.name), change)

    def _read(self, tp: tuple[str, int], offset: int, max_bytes: int) -> Any:
        return self.owner.reader.read(
            tp[0], tp[1], offset, max(1, max_bytes), self.sub.message_filter
        )

    async def _post(self, client: httpx.AsyncClient, batch: list[dict[str, Any]]) -> bool:
        """POST until a 2xx; False if stopped first (the positions then stay where they were)."""
        body = orjson.dumps({"subscription": self.sub.name, "messages": batch})
        backoff = self.sub.min_backoff_ms / 1000
        while True:
            try:
                status = await self._answer_status(client, body)
                if 200 <= status < 300:
                    return True
                error = f"endpoint answered {status}"
                if 300 <= status < 400:
                    error += " (redirects are not followed)"
            except TimeoutError:
                error = f"no answer within timeout_ms ({self.sub.timeout_ms} ms)"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            await anyio.to_thread.run_sync(self._record_error, error)
            if self.stopping:
                return False
            await asyncio.sleep(backoff)
            if self.stopping:
                return False
            backoff = min(backoff * 2, self.sub.max_backoff_ms / 1000)

    async def _answer_status(self, client: httpx.AsyncClient, body: bytes) -> int:
        """POST ``body`` once and return the endpoint's status.

        The POST as a whole (connecting, sending, the answer) has ``timeout_ms``
        (:class:`TimeoutError` past it), not only each read: an endpoint that dribbles its
        answer is cut.  Only the status counts: at most :data:`ANSWER_BODY_BYTES` of the
        answer's body are read (undecoded), so that a short answer leaves the connection
        reusable; a longer one, or one still coming at the deadline after a status, drops
        the connection and keeps the status.
        """
        status: int | None = None
        try:
            async with asyncio.timeout(self.sub.timeout_ms / 1000):
                async with client.stream(
                    "POST",
                    self.sub.endpoint,
                    content=body,
                    headers={
                        "Content-Type": PUSH_MEDIA_TYPE,
                        "X-Logbroker-Subscription": self.sub.name,
                    },
                ) as response:
                    status = response.status_code
                    read = 0
                    async for piece in response.aiter_raw():
                        read += len(piece)
                        if read > ANSWER_BODY_BYTES:
                            break  # closing the response unread drops the connection
        except (TimeoutError, httpx.HTTPError):
            if status is None:
                raise
        assert status is not None
        return status

    def _commit(self, positions: dict[tuple[str, int], int], delivered: int) -> None:
        """Move the positions; count what the batch delivered and what it passed over."""
        holder = self.owner.holder_id
        skips = self.skips

        def change(doc: Doc | None) -> tuple[Doc, None]:
            if doc is None or doc.get("holder") != holder:
                raise LeaseLost(self.sub.name)
            for (topic, partition), offset in positions.items():
                doc.setdefault("offsets", {})[_key(topic, partition)] = offset
            for skip in skips:
                counts = doc.setdefault("skipped", {})
                counts[skip.kind] = counts.get(skip.kind, 0) + skip.messages
                doc["last_skip"] = skip.to_json()
            if delivered:
                doc["delivered"] = doc.get("delivered", 0) + delivered
                doc["batches"] = doc.get("batches", 0) + 1
                doc["last_error"] = None
            return doc, None

        self.owner.state.update(_state_key(self.sub.name), change)
        self.skips = []

    def _record_error(self, error: str) -> None:
        holder = self.owner.holder_id

        def change(doc: Doc | None) -> tuple[Doc | None, None]:
            if doc is None or doc.get("holder") != holder:
                return doc, None
            doc["last_error"] = {"at_ms": int(time.time() * 1000), "error": error}
            return doc, None

        self.owner.state.update(_state_key(self.sub.name), change)


class PushDelivery:
    """Runs every subscription this process holds the lease of, in the current event loop."""

    def __init__(
        self,
        store: LogStore,
        state: InternalState,
        watch: AppendWatch,
        reader: PartitionReader,
        *,
        targets: PushTargetPolicy | None = None,
        max_per_owner: int = DEFAULT_MAX_PER_OWNER,
        grants: HolderGrants | None = None,
    ) -> None:
        self.store = store
        self.state = state
        self.watch = watch
        self.reader = reader
        self.targets = targets or PushTargetPolicy()
        self.grants: HolderGrants = grants or OpenGrants()
        self.registry = SubscriptionRegistry(store, state, max_per_owner, self.grants)
        self.holder_id = secrets.token_hex(8)
        self._running: dict[str, _Delivery] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self.audit: dict[str, WindowCounts] = {}
        """Per subscription without a filter: messages and lines delivered and committed
        (the audit's tier ``push:<subscription>``)."""
        self.new_counts: Callable[[str], WindowCounts] = lambda name: WindowCounts()
        """Makes a subscription's counts (the gateway's journal them, see
        ``ingest_api.audit_api``)."""

    def audit_counts(self, name: str) -> WindowCounts:
        """The counts of subscription ``name`` in this process (made on first use)."""
        counts = self.audit.get(name)
        if counts is None:
            counts = self.audit[name] = self.new_counts(name)
        return counts

    async def start(self) -> None:
        self._supervisor = asyncio.create_task(self._supervise(), name="push-supervisor")

    def suspended_topics(self) -> int:
        """Topics suspended now in the deliveries this process runs."""
        return sum(len(d.suspended) for d in self._running.values())

    def poke(self) -> None:
        """Look at the subscriptions now (after a create or delete through this process)."""
        self._wake.set()

    async def _supervise(self) -> None:
        # Until stop() says so, not only until a cancel: a cancel can be swallowed on its way
        # (by a delivery's stop caught mid-wait, by Python 3.11's asyncio.wait_for) and the
        # supervisor, and the gateway's shutdown with it, would go on for ever.
        while not self._stopping:
            try:
                await self._reconcile()
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:  # expected while the store is away: no trace
                _log.warning("push supervisor: %s; retrying", exc)
            except Exception:
                _log.exception("push supervisor failed; retrying")
            # Not asyncio.wait_for: on Python 3.11 it drops a cancel that arrives in the loop
            # turn its awaitable finished in (a poke as the gateway stops); asyncio.timeout
            # passes on every cancel but its own.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_SUPERVISE_S):
                    await self._wake.wait()
            self._wake.clear()

    async def _reconcile(self) -> None:
        # Abandoned on cancel: with the store unreachable a call blocks for its operation
        # timeout, and a stopping gateway must not wait for a look it no longer needs.
        owned = await anyio.to_thread.run_sync(self.registry.list_owned, abandon_on_cancel=True)
        subs = {s.name: s for s, _ in owned}
        clients = {s.name: client for s, client in owned}
        for name, running in list(self._running.items()):
            finished = running.task is not None and running.task.done()
            changed = subs.get(name) != running.sub or clients.get(name) != running.client
            if name not in subs or changed or finished:
                await self._stop_one(running)
                del self._running[name]
        for name, sub in subs.items():
            held = await anyio.to_thread.run_sync(self._lease, name, abandon_on_cancel=True)
            if not held:
                if name in self._running:
                    await self._stop_one(self._running.pop(name))
                continue
            if name not in self._running:
                delivery = _Delivery(self, sub, clients[name])
                delivery.task = asyncio.create_task(delivery.run(), name=f"push {name}")
                self._running[name] = delivery

    def _lease(self, name: str) -> bool:
        """Take or renew the lease of ``name``; True if this process holds it now."""
        now = int(time.time() * 1000)
        me = self.holder_id

        def change(doc: Doc | None) -> tuple[Doc, bool]:
            doc = doc or {"offsets": {}}
            if doc.get("holder") not in (None, me) and doc.get("until", 0) > now:
                return doc, False
            doc["holder"] = me
            doc["until"] = now + LEASE_MS
            return doc, True

        return self.state.update(_state_key(name), change)

    def _release(self, name: str) -> None:
        me = self.holder_id

        def change(doc: Doc | None) -> tuple[Doc | None, None]:
            if doc is not None and doc.get("holder") == me:
                doc["holder"] = None
                doc["until"] = 0
            return doc, None

        self.state.update(_state_key(name), change)

    async def _stop_one(self, delivery: _Delivery) -> None:
        delivery.stopping = True
        task = delivery.task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), _STOP_GRACE_S)
            except (TimeoutError, asyncio.CancelledError) as exc:
                task.cancel()
                await asyncio.wait([task])  # its end, whatever it was
                current = asyncio.current_task()
                if isinstance(exc, asyncio.CancelledError) and current and current.cancelling():
                    raise  # the caller's own cancel (the supervisor's, at a stop): passed on
            except Exception:
                _log.exception("push %s stopped with an error", delivery.sub.name)

    async def stop(self) -> None:
        """Finish in-flight batches (a few seconds at most), then release every lease.

        The leases are released together, for a few seconds at most: a lease not released
        (the store is unreachable) expires after ``LEASE_MS`` anyway.
        """
        self._stopping = True
        self._wake.set()
        if self._supervisor is not None:
            self._supervisor.cancel()
            # its end, whatever it was; a cancel of this stop itself is not swallowed
            await asyncio.wait([self._supervisor])
        running = list(self._running.values())
        self._running.clear()
        await asyncio.gather(*(self._stop_one(d) for d in running))
        if not running:
            return

        async def release(name: str) -> None:
            with contextlib.suppress(Exception):
                await anyio.to_thread.run_sync(self._release, name, abandon_on_cancel=True)

        releases = [asyncio.ensure_future(release(d.sub.name)) for d in running]
        _done, late = await asyncio.wait(releases, timeout=_STOP_GRACE_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        if late:
            _log.warning("push: %d lease(s) not released in time; they expire", len(late))
