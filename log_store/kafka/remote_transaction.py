"""Transactions on a partition owned by another gateway: optimistic, checked by the owner.

A transaction function runs where the request arrived, against the owner's state as read over
the wire; what it read travels with what it wrote, and the owner commits it only if every key
it read still has the value it read (and, if it asked, the next offset is still the one it
was told).  Otherwise the owner answers *conflict* with the current values, and the function
runs again.  Since a function's result depends only on the values it read, a commit that
passes the check is exactly what running the function at the owner would have done: the
owner's single writer stays the one serialization point, while the CPU work (encoding the
envelopes of a write) is spent at the gateway that received it.

Values read are cached per partition, so a source written through the same gateway again
needs one round trip (the commit), not two; a stale cached value only costs a conflict.

The transport is a :class:`PeerLink` (HTTP between gateways, in ``ingest_api``): this module
knows nothing of HTTP.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from log_store.errors import (
    BadRequest,
    LimitReached,
    LogbrokerError,
    PartitionUnavailable,
    RecordTooLarge,
    StoreUnavailable,
    UnknownPartition,
    UnknownTopic,
)
from log_store.interface import (
    AppendResult,
    LateCommitHook,
    PartitionState,
    TransactionFn,
    known_record_lines,
    late_commit_hook,
)

log = logging.getLogger(__name__)

_MAX_ROUNDS = 12
_CACHE_ENTRIES = 200_000
_OWNER_WAIT_S = 2.0
_REFUSED_FOR_S = 1.0
"""An owner whose address has refused every connection tried for this long (and at least
``_REFUSED_TIMES`` times) is taken for dead: a forward to it gives up at once (see
:class:`_RefusingOwners`)."""
_REFUSED_TIMES = 3
_REFUSED_RETRY_S = 0.2
"""Between two tries of an owner that refused, the wait for another owner's announcement."""
_REFUSAL_GAP_S = 5.0
"""Refusals further apart than this are not one streak (nobody tried in between)."""
_ANSWER_MARGIN_S = 2.0
"""A forwarded transaction is answered within the operation timeout and this much: the owner's
answer to the forward, and the one-by-one path after a conflict or a moved owner, share that
deadline.  (Each used to wait the timeout and 10 s more in turn: writes through a gateway
that did not own their partitions, with Kafka away, were refused after 20-35 s or not
answered within a client's 40 s.)"""
BATCH_BYTES = 8 * 1024 * 1024
"""A batch of forwarded transactions closes at this size (a larger one goes alone)."""


def digest(value: bytes | None) -> str:
    """A short fingerprint of a state value; ``-`` for an absent key."""
    if value is None:
        return "-"
    return hashlib.blake2b(value, digest_size=16).hexdigest()


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode()


def _unb64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


_START_LOCK = threading.Lock()


def start_future(future: concurrent.futures.Future[AppendResult]) -> bool:
    """Whether a transaction may run now, marking its future running: True if it was waiting
    or runs already (a transaction passed on to another owner after its first owner began
    it: fenced, or the partition moved); False if its caller cancelled it or it has its
    answer.  Two owners or paths may ask at once."""
    with _START_LOCK:
        if future.running():
            return True
        if future.done() and not future.cancelled():
            return False
        return future.set_running_or_notify_cancel()


class NotOwner(LogbrokerError):
    """The gateway asked does not own the partition (any more)."""


class PeerUnreachable(LogbrokerError):
    """The gateway announced as owner did not answer."""


class PeerRefused(PeerUnreachable):
    """No connection to the announced owner's address was made: refused (or reset while
    connecting), no route to its host, or the attempt unanswered (a host that is down or
    drops packets).  Nothing of this try reached any gateway."""


# -- the wire ---------------------------------------------------------------------------------
@dataclass
class PreparedTransaction:
    """What a function read and wrote, for the owner to check and commit."""

    expect: dict[str, str] = field(default_factory=dict)
    """key -> digest of the value the function read."""
    expect_next_offset: int | None = None
    puts: dict[str, bytes] = field(default_factory=dict)
    records: list[bytes] = field(default_factory=list)
    counted_at_owner: bool = False
    """The function is audited (see ``late_commit_hook``): the owner counts the records with
    its own hook when it commits them (or finds them committed late); the sender does not."""
    record_lines: list[int] | None = None
    """Each record's line count where the sender counted it, -1 where not (see
    ``known_record_lines``): the owner counts these rather than decompressing."""

    def header(self) -> dict[str, Any]:
        """Everything but the records' bytes (those follow the JSON header on the wire)."""
        header: dict[str, Any] = {
            "expect": self.expect,
            "expect_next_offset": self.expect_next_offset,
            "puts": {k: _b64(v) for k, v in self.puts.items()},
            "record_lengths": [len(r) for r in self.records],
        }
        if self.counted_at_owner:
            header["counted_at_owner"] = True
        if self.record_lines is not None:
            header["record_lines"] = self.record_lines
        return header

    @classmethod
    def from_header(cls, header: Mapping[str, Any], records: list[bytes]) -> PreparedTransaction:
        """The transaction a :meth:`header` describes; ``ValueError`` if it is not one."""
        expect = header.get("expect")
        if not isinstance(expect, dict):
            raise ValueError("expect must be an object")
        next_offset = header.get("expect_next_offset")
        if next_offset is not None and not isinstance(next_offset, int):
            raise ValueError("expect_next_offset must be an integer")
        puts = header.get("puts")
        if not isinstance(puts, dict):
            raise ValueError("puts must be an object")
        lines = header.get("record_lines")
        if lines is not None and (
            not isinstance(lines, list)
            or len(lines) != len(records)
            or not all(type(n) is int and n >= -1 for n in lines)
        ):
            raise ValueError("record_lines must hold an integer >= -1 for each record")
        return cls(
            {str(k): str(v) for k, v in expect.items()},
            next_offset,
            {str(k): _unb64(v) or b"" for k, v in puts.items()},
            records,
            header.get("counted_at_owner", False) is True,
            lines,
        )

    def encode(self) -> bytes:
        raw = json.dumps(self.header()).encode()
        return b"".join([len(raw).to_bytes(4, "big"), raw, *self.records])

    @classmethod
    def decode(cls, body: bytes) -> PreparedTransaction:
        """Parse a body; ``ValueError`` if it is not one."""
        if len(body) < 4:
            raise ValueError("too short")
        size = int.from_bytes(body[:4], "big")
        header = json.loads(body[4 : 4 + size])
        if not isinstance(header, dict):
            raise ValueError("the header must be an object")
        records, pos = _records(body, 4 + size, header.get("record_lengths"))
        if pos != len(body):
            raise ValueError("bytes after the last record")
        return cls.from_header(header, records)


def _records(body: bytes, pos: int, lengths: object) -> tuple[list[bytes], int]:
    """The records of ``lengths`` starting at ``pos``, and the position after them."""
    if not isinstance(lengths, list):
        raise ValueError("record_lengths must be a list")
    records = []
    for length in lengths:
        if not isinstance(length, int) or length < 0 or pos + length > len(body):
            raise ValueError("a record runs past the end of the body")
        records.append(body[pos : pos + length])
        pos += length
    return records, pos


@dataclass
class CommitAnswer:
    """The owner's answer to a prepared transaction."""

    committed: AppendResult | None = None
    conflict_values: dict[str, bytes | None] = field(default_factory=dict)
    next_offset: int | None = None
    counted: bool = False
    """The owner counted the committed records for the audit (asked by ``counted_at_owner``,
    and an owner of a version that does: an older one leaves the count to the sender)."""

    def to_json(self) -> dict[str, Any]:
        if self.committed is not None:
            doc: dict[str, Any] = {
                "status": "committed",
                "first_offset": self.committed.first_offset,
                "last_offset": self.committed.last_offset,
            }
            if self.counted:
                doc["counted"] = True
            return doc
        return {
            "status": "conflict",
            "values": {k: _b64(v) for k, v in self.conflict_values.items()},
            "next_offset": self.next_offset,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CommitAnswer:
        if doc.get("status") == "committed":
            committed = AppendResult(int(doc["first_offset"]), int(doc["last_offset"]))
            return cls(committed, counted=doc.get("counted", False) is True)
        values = {str(k): _unb64(v) for k, v in (doc.get("values") or {}).items()}
        return cls(None, values, doc.get("next_offset"))


@dataclass
class ForwardedTransaction:
    """One prepared transaction of a batch, with the partition it is for."""

    topic: str
    partition: int
    prepared: PreparedTransaction


def encode_batch(items: Sequence[ForwardedTransaction]) -> bytes:
    """Several prepared transactions, for partitions of one owner, in one body."""
    header = {
        "items": [
            {"topic": item.topic, "partition": item.partition, **item.prepared.header()}
            for item in items
        ]
    }
    raw = json.dumps(header).encode()
    records = [r for item in items for r in item.prepared.records]
    return b"".join([len(raw).to_bytes(4, "big"), raw, *records])


def decode_batch(body: bytes) -> list[ForwardedTransaction]:
    """Parse a batch body; ``ValueError`` if it is not one."""
    if len(body) < 4:
        raise ValueError("too short")
    size = int.from_bytes(body[:4], "big")
    header = json.loads(body[4 : 4 + size])
    if not isinstance(header, dict) or not isinstance(header.get("items"), list):
        raise ValueError("items must be a list")
    pos = 4 + size
    items = []
    for entry in header["items"]:
        if not isinstance(entry, dict):
            raise ValueError("an item must be an object")
        topic, partition = entry.get("topic"), entry.get("partition")
        if not isinstance(topic, str) or not isinstance(partition, int) or partition < 0:
            raise ValueError("an item needs a topic and a non-negative partition")
        records, pos = _records(body, pos, entry.get("record_lengths"))
        items.append(
            ForwardedTransaction(topic, partition, PreparedTransaction.from_header(entry, records))
        )
    if pos != len(body):
        raise ValueError("bytes after the last record")
    return items


def encode_outcomes(outcomes: Sequence[CommitAnswer | LogbrokerError]) -> dict[str, Any]:
    """The owner's answers to a batch, in its order: an answer, or the error of that item."""
    answers: list[dict[str, Any]] = []
    for outcome in outcomes:
        if isinstance(outcome, CommitAnswer):
            answers.append(outcome.to_json())
        else:
            answers.append({"status": "error", **owner_error_json(outcome)})
    return {"answers": answers}


def decode_outcomes(doc: Mapping[str, Any], count: int) -> list[CommitAnswer | LogbrokerError]:
    answers = doc.get("answers")
    if not isinstance(answers, list) or len(answers) != count:
        raise StoreUnavailable(f"a peer answered a batch of {count} with {answers!r:.200}")
    outcomes: list[CommitAnswer | LogbrokerError] = []
    for answer in answers:
        if answer.get("status") != "error":
            outcomes.append(CommitAnswer.from_json(answer))
            continue
        outcomes.append(owner_error_of(answer))
    return outcomes


def encode_values(values: Mapping[str, bytes | None], next_offset: int) -> dict[str, Any]:
    return {"values": {k: _b64(v) for k, v in values.items()}, "next_offset": next_offset}


def decode_values(doc: Mapping[str, Any]) -> tuple[dict[str, bytes | None], int]:
    return {str(k): _unb64(v) for k, v in doc["values"].items()}, int(doc["next_offset"])


class PeerLink(Protocol):
    """How one gateway reaches another.  Errors: ``NotOwner``, ``PeerUnreachable``,
    ``UnknownTopic``, ``StoreUnavailable``; and, for one transaction, the owner's refusal of
    it (``RecordTooLarge``, ... see ``_REFUSALS``)."""

    def read_state(
        self, url: str, topic: str, partition: int, keys: Sequence[str]
    ) -> tuple[dict[str, bytes | None], int]: ...

    def commit_many(
        self, url: str, items: Sequence[ForwardedTransaction]
    ) -> list[CommitAnswer | LogbrokerError]:
        """One request carrying every item (partitions of one owner); an answer or an error
        per item, in order.  Raises only what concerns the whole request."""
        ...

    def close(self) -> None: ...


# -- the owner's side -------------------------------------------------------------------------
class _Conflict(Exception):
    def __init__(self, values: dict[str, bytes | None], next_offset: int) -> None:
        super().__init__("conflict")
        self.values = values
        self.next_offset = next_offset


class _CheckedTransaction:
    """The owner-side function: commit ``prepared`` only if what it read is still there."""

    __slots__ = ("committed_late", "prepared")

    def __init__(
        self, prepared: PreparedTransaction, committed_late: LateCommitHook | None
    ) -> None:
        self.prepared = prepared
        self.committed_late = committed_late if prepared.counted_at_owner else None

    def __call__(self, state: PartitionState) -> Sequence[bytes]:
        prepared = self.prepared
        changed = {
            key: state.get(key)
            for key, seen in prepared.expect.items()
            if digest(state.get(key)) != seen
        }
        moved = (
            prepared.expect_next_offset is not None
            and state.next_offset() != prepared.expect_next_offset
        )
        if changed or moved:
            raise _Conflict(changed, state.next_offset())
        for key, value in prepared.puts.items():
            state.put(key, value)
        return prepared.records


def checked_transaction(
    prepared: PreparedTransaction, committed_late: LateCommitHook | None = None
) -> TransactionFn:
    """The owner-side function of a forwarded transaction.  ``committed_late`` (the owner
    gateway's own counting hook) is kept if the sender's function is audited: the owner counts
    what it commits for the sender, and so also a commit whose answer was lost and that its
    next takeover finds committed (the caller counts those it commits, see ``PeerApi``)."""
    return _CheckedTransaction(prepared, committed_late)


def answer_of(future: concurrent.futures.Future[AppendResult]) -> CommitAnswer:
    """Wait for the owner's commit of a checked transaction and say how it went."""
    try:
        return CommitAnswer(future.result())
    except _Conflict as conflict:
        return CommitAnswer(None, conflict.values, conflict.next_offset)


# -- the caller's side --------------------------------------------------------------------------
class _RecordingState:
    """The owner's state as known here; remembers what the function read and wrote.

    A key not known yet is looked up in ``hint`` (the cache of values seen before): the first
    run of a function uses them, so a source written through this gateway before needs no
    state read and no second run."""

    def __init__(
        self,
        known: dict[str, bytes | None],
        next_offset: int | None,
        hint: Callable[[str], tuple[bool, bytes | None]] | None = None,
    ) -> None:
        self._known = known
        self._hint = hint
        self._next_offset = next_offset
        self.read: list[str] = []
        self.missing: set[str] = set()
        self.asked_next = False
        self.local: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        if key in self.local:
            return self.local[key]
        if key not in self.read:
            self.read.append(key)
        if key not in self._known:
            found, value = self._hint(key) if self._hint is not None else (False, None)
            if not found:
                self.missing.add(key)
                return None
            self._known[key] = value
        return self._known[key]

    def put(self, key: str, value: bytes) -> None:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError("state values are bytes")
        self.local[key] = bytes(value)

    def next_offset(self) -> int:
        self.asked_next = True
        return self._next_offset if self._next_offset is not None else 0


class _ValueCache:
    """Recently seen state values of partitions owned elsewhere (a hint, checked at commit)."""

    def __init__(self, entries: int = _CACHE_ENTRIES) -> None:
        self._entries = entries
        self._values: OrderedDict[tuple[str, int, str], bytes | None] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, topic: str, partition: int, keys: Sequence[str]) -> dict[str, bytes | None]:
        found = {}
        with self._lock:
            for key in keys:
                entry = (topic, partition, key)
                if entry in self._values:
                    found[key] = self._values[entry]
        return found

    def hint(self, topic: str, partition: int, key: str) -> tuple[bool, bytes | None]:
        """(True, value) if ``key``'s value is cached, else (False, None)."""
        entry = (topic, partition, key)
        with self._lock:
            if entry in self._values:
                return True, self._values[entry]
        return False, None

    def put(self, topic: str, partition: int, values: Mapping[str, bytes | None]) -> None:
        with self._lock:
            for key, value in values.items():
                entry = (topic, partition, key)
                self._values[entry] = value
                self._values.move_to_end(entry)
            while len(self._values) > self._entries:
                self._values.popitem(last=False)

    def forget_topic(self, topic: str) -> None:
        with self._lock:
            for entry in [e for e in self._values if e[0] == topic]:
                del self._values[entry]


class OwnerLookup(Protocol):
    def owner(
        self, topic: str, partition: int, *, not_url: str | None = None, wait_s: float = 0.0
    ) -> str | None: ...


class _Outgoing:
    """A prepared transaction waiting for its owner's answer."""

    __slots__ = ("answer", "item", "size")

    def __init__(self, item: ForwardedTransaction) -> None:
        self.item = item
        self.answer: concurrent.futures.Future[CommitAnswer] = concurrent.futures.Future()
        self.size = sum(len(r) for r in item.prepared.records) + sum(
            len(v) for v in item.prepared.puts.values()
        )


class _OwnerOutbox:
    """The prepared transactions going to one owner, sent in batches.

    At most ``in_flight`` requests go to the owner at a time; what is queued meanwhile goes
    in the next request, as one batch (up to ``batch_bytes``).  Without load a transaction is
    sent at once; under load the batches grow instead of the number of requests.  Items are
    put in groups (the transactions of one client request) and a group is never split unless
    it is larger than ``batch_bytes``, so one client request costs one request per owner.
    """

    def __init__(
        self,
        url: str,
        link: PeerLink,
        pool: concurrent.futures.ThreadPoolExecutor,
        *,
        in_flight: int,
        batch_bytes: int,
    ) -> None:
        self.url = url
        self._link = link
        self._pool = pool
        self._in_flight_max = in_flight
        self._batch_bytes = batch_bytes
        self._queue: deque[_Outgoing] = deque()
        self._in_flight = 0
        self._lock = threading.Lock()

    def put(self, items: Sequence[ForwardedTransaction]) -> list[_Outgoing]:
        outgoing = [_Outgoing(item) for item in items]
        with self._lock:
            self._queue.extend(outgoing)
        self._pump()
        return outgoing

    def _pump(self) -> None:
        while True:
            with self._lock:
                if self._in_flight >= self._in_flight_max:
                    return
                batch: list[_Outgoing] = []
                size = 0
                while self._queue and (
                    not batch or size + self._queue[0].size <= self._batch_bytes
                ):
                    out = self._queue.popleft()
                    # an item whose caller stopped waiting (cancelled) is not sent any more
                    if out.answer.set_running_or_notify_cancel():
                        size += out.size
                        batch.append(out)
                if not batch:
                    return
                self._in_flight += 1
            try:
                self._pool.submit(self._send, batch)
            except RuntimeError:  # shut down: the store is closing
                with self._lock:
                    self._in_flight -= 1
                for out in batch:
                    out.answer.set_exception(StoreUnavailable("log store is closed"))
                return

    def _send(self, batch: list[_Outgoing]) -> None:
        try:
            outcomes = self._link.commit_many(self.url, [out.item for out in batch])
        except BaseException as exc:
            for out in batch:
                out.answer.set_exception(exc)
        else:
            for out, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, CommitAnswer):
                    out.answer.set_result(outcome)
                else:
                    out.answer.set_exception(outcome)
        finally:
            with self._lock:
                self._in_flight -= 1
            self._pump()


@dataclass
class _Attempt:
    """One transaction forwarded to a partition's owner: what is known of the owner's state."""

    topic: str
    partition: int
    fn: TransactionFn
    future: concurrent.futures.Future[AppendResult]
    known: dict[str, bytes | None] = field(default_factory=dict)
    fresh: set[str] = field(default_factory=set)
    next_offset: int | None = None
    rounds: int = 0
    read: list[str] = field(default_factory=list)
    local: dict[str, bytes] = field(default_factory=dict)
    deadline: float | None = None
    """When (monotonic) its caller is answered 503 at the latest (None: each wait its own)."""


class _RefusingOwners:
    """Owners' URLs that refuse connections now, and since when: an owner refusing every
    connection for ``_REFUSED_FOR_S`` is taken for dead, and a forward to it gives up at once.

    Why: a gateway SIGKILLed keeps its partitions in the gateways' group until its session
    times out (10 s by default), and its announcement stands until the next owner's.  A
    forward to it used to try the dead address again until the operation timeout (15 s), and
    since a client request is answered only when every section is settled, each request
    carrying a section of such a partition (a push-client's every request: it batches all
    its files) waited for the group to move the partition: every file of every client
    stalled, not only those of the dead owner's partitions.  A refused connection is not a
    slow owner (that one takes the connection and answers late, or not at all, and is
    waited for as before): nothing listens at the address, so the section is answered
    ``PartitionUnavailable`` after about a second, the request's other sections are
    written, and a push-client holds back the named files only.  An owner announced
    meanwhile is tried first; any answer from the address ends the streak.  A host that is
    gone (no route to it, or a connection attempt unanswered for the peer link's connect
    timeout, 2 s: a machine powered off or cut from the network drops the packets) counts
    as refusing: no connection was made either (``PeerRefused``).

    Exactly once: a refused try never reached any process, so it wrote nothing.  Earlier
    tries of the same section may have reached the owner before it died (the first batch,
    whose connection broke; the answer lost): the owner may have committed them, and a
    live owner behind a cut network may still commit one that it is working on.  That is
    the in-doubt case every 503 of a forward has had (``operation_timeout_s``), and it is
    safe for the same reasons: the source's last seqno is state of the partition,
    committed in the same Kafka transaction as the chunks (so the next owner, rebuilding
    the table from the snapshot and the committed tail, has it exactly when it has the
    chunks), and the owner commits a forwarded transaction only if every value it read,
    the last seqno among them, is unchanged.  So whichever of the in-doubt try and the
    client's resend commits first, the other finds the seqno moved: the in-doubt one is
    dropped (*conflict*, answered to nobody), the resend runs again and answers the
    chunks ``duplicate``.  A push-client resends a waiting file's chunks unchanged (not cut
    again), so its next chunk's ``prev_seqno`` is at most the last seqno either way and
    nothing is refused as out of order.
    """

    def __init__(self) -> None:
        self._streaks: dict[str, tuple[float, float, int]] = {}
        """url -> (first refusal, last refusal, refusals) of its current streak."""
        self._lock = threading.Lock()

    def refused(self, url: str) -> None:
        now = time.monotonic()
        with self._lock:
            first, last, count = self._streaks.get(url, (now, now, 0))
            if now - last > _REFUSAL_GAP_S:
                first, count = now, 0
            self._streaks[url] = (first, now, count + 1)

    def answered(self, url: str) -> None:
        """``url`` answered: whatever it refused before, it lives now."""
        if url in self._streaks:
            with self._lock:
                self._streaks.pop(url, None)

    def dead(self, url: str) -> float | None:
        """How long ``url`` has refused every connection if that makes it dead, else None."""
        now = time.monotonic()
        with self._lock:
            streak = self._streaks.get(url)
        if streak is None:
            return None
        first, last, count = streak
        if now - last > _REFUSAL_GAP_S or count < _REFUSED_TIMES or last - first < _REFUSED_FOR_S:
            return None
        return now - first


class RemoteTransactions:
    """Runs transactions and state reads of partitions owned by other gateways."""

    def __init__(
        self,
        directory: OwnerLookup,
        link: PeerLink,
        *,
        timeout_s: float,
        workers: int = 32,
        in_flight_per_owner: int = 4,
        batch_bytes: int = BATCH_BYTES,
        partition_check: Callable[[str, int], None] | None = None,
    ) -> None:
        self._directory = directory
        self._link = link
        self._partition_check = partition_check
        """Raises ``UnknownTopic`` (or ``UnknownPartition``) if Kafka no longer has the
        partition: asked when nobody owns it, since a deleted topic's owner never comes."""
        self._timeout_s = timeout_s
        self._cache = _ValueCache()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="logbroker-remote"
        )
        self._senders = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="logbroker-forward"
        )
        self._in_flight = in_flight_per_owner
        self._batch_bytes = batch_bytes
        self._outboxes: dict[str, _OwnerOutbox] = {}
        self._outboxes_lock = threading.Lock()
        self._refusing = _RefusingOwners()

    def _outbox(self, url: str) -> _OwnerOutbox:
        with self._outboxes_lock:
            outbox = self._outboxes.get(url)
            if outbox is None:
                outbox = _OwnerOutbox(
                    url,
                    self._link,
                    self._senders,
                    in_flight=self._in_flight,
                    batch_bytes=self._batch_bytes,
                )
                self._outboxes[url] = outbox
            return outbox

    def submit(
        self,
        topic: str,
        partition: int,
        fn: TransactionFn,
        future: concurrent.futures.Future[AppendResult],
    ) -> None:
        self.submit_many([(topic, partition, fn, future)])

    def submit_many(
        self,
        items: Sequence[tuple[str, int, TransactionFn, concurrent.futures.Future[AppendResult]]],
    ) -> None:
        """Forward several transactions (those of one client request) together: their first
        tries go to each owner in one request."""
        deadline = time.monotonic() + self._timeout_s + _ANSWER_MARGIN_S
        attempts = [_Attempt(t, p, fn, future, deadline=deadline) for t, p, fn, future in items]

        def run() -> None:
            started = [a for a in attempts if start_future(a.future)]
            self._run_together(started)

        try:
            self._pool.submit(run)
        except RuntimeError:  # the pool is shut down: the store is closing
            for attempt in attempts:
                if start_future(attempt.future):
                    attempt.future.set_exception(StoreUnavailable("log store is closed"))

    def _run_together(self, attempts: list[_Attempt]) -> None:
        """First tries of ``attempts``, one request per owner; the rest one by one."""
        by_owner: dict[str, list[tuple[_Attempt, PreparedTransaction]]] = {}
        for attempt in attempts:
            try:
                prepared = self._prepare(attempt)
                if isinstance(prepared, AppendResult):
                    attempt.future.set_result(prepared)
                    continue
                url = self._directory.owner(
                    attempt.topic, attempt.partition, wait_s=min(self._timeout_s, _OWNER_WAIT_S)
                )
            except BaseException as exc:
                attempt.future.set_exception(exc)
                continue
            if url is None:  # no owner announced right now: the one-by-one path waits for one
                self._continue(attempt)
                continue
            by_owner.setdefault(url, []).append((attempt, prepared))
        waiting: list[tuple[_Attempt, _Outgoing, str]] = []
        for url, group in by_owner.items():
            outgoing = self._outbox(url).put(
                [ForwardedTransaction(a.topic, a.partition, p) for a, p in group]
            )
            waiting.extend((a, out, url) for (a, _p), out in zip(group, outgoing, strict=True))
        for attempt, out, url in waiting:
            try:
                answer = out.answer.result(_left(attempt.deadline, self._timeout_s + 10.0))
            except (NotOwner, PeerUnreachable, concurrent.futures.TimeoutError) as exc:
                if isinstance(exc, PeerRefused):
                    self._refusing.refused(url)
                out.answer.cancel()  # if still queued
                self._continue(attempt)  # the one-by-one path follows the owner
                continue
            except BaseException as exc:
                attempt.future.set_exception(exc)
                continue
            if self._absorb(attempt, answer):
                assert answer.committed is not None
                attempt.future.set_result(answer.committed)
            else:
                self._continue(attempt)

    def _continue(self, attempt: _Attempt) -> None:
        """Go on with ``attempt`` alone (a conflict, or an owner to look for)."""

        def run() -> None:
            try:
                attempt.future.set_result(self._run_attempt(attempt))
            except BaseException as exc:
                attempt.future.set_exception(exc)

        try:
            self._pool.submit(run)
        except RuntimeError:
            attempt.future.set_exception(StoreUnavailable("log store is closed"))

    def _with_owner(
        self, topic: str, partition: int, call: Any, deadline: float | None = None
    ) -> Any:
        """``call(url)`` at the partition's owner, following ownership as it moves, until
        ``deadline`` (default: the operation timeout from now); ``PartitionUnavailable`` at
        once if the owner refuses connections (dead, see :class:`_RefusingOwners`) and no
        other owner is announced."""
        if deadline is None:
            deadline = time.monotonic() + self._timeout_s
        suspect: str | None = None
        last_error: Exception | None = None
        checked = False
        refused = False
        while True:
            remaining = deadline - time.monotonic()
            wait_s = _OWNER_WAIT_S
            if refused:  # a dead owner's address: look again soon, a live one answers it
                wait_s = 0.0 if suspect and self._refusing.dead(suspect) else _REFUSED_RETRY_S
            url = self._directory.owner(
                topic, partition, not_url=suspect, wait_s=max(0.0, min(remaining, wait_s))
            )
            if url is None and suspect is not None:
                refusing = self._refusing.dead(suspect) if refused else None
                if refusing is not None:
                    raise PartitionUnavailable(
                        f"the owner of {topic}/{partition} ({suspect}) has refused every "
                        f"connection for {refusing:.1f} s: its gateway is down, and the "
                        "gateways' group hands the partition on after its session timeout",
                        topic,
                        partition,
                    )
                url = suspect  # nobody else claimed it: it may be back
            if url is None:
                if not checked and self._partition_check is not None:
                    checked = True
                    try:
                        self._partition_check(topic, partition)
                    except LogbrokerError as exc:
                        # deleted: the writer makes the topic again; Kafka away (any other
                        # error): wait for an owner as before
                        if isinstance(exc, UnknownTopic | UnknownPartition):
                            raise
                if remaining <= 0:
                    raise PartitionUnavailable(
                        f"no gateway owns {topic}/{partition} right now ({last_error or 'none'})",
                        topic,
                        partition,
                    )
                continue
            try:
                result = call(url)
            except (PeerRefused, NotOwner, PeerUnreachable) as exc:
                refused = isinstance(exc, PeerRefused)
                if refused:
                    self._refusing.refused(url)
                elif isinstance(exc, NotOwner):
                    self._refusing.answered(url)
                last_error = exc
                suspect = url
                if time.monotonic() >= deadline:
                    raise PartitionUnavailable(
                        f"the owner of {topic}/{partition} cannot be reached: {exc}",
                        topic,
                        partition,
                    ) from None
                if not refused:  # a refusal waits its own pause, above
                    time.sleep(0.05)
                continue
            except LogbrokerError:
                self._refusing.answered(url)
                raise
            self._refusing.answered(url)
            return result

    def _commit_at(
        self,
        url: str,
        topic: str,
        partition: int,
        prepared: PreparedTransaction,
        deadline: float | None = None,
    ) -> CommitAnswer:
        """One prepared transaction through the owner's outbox (batched with others)."""
        (out,) = self._outbox(url).put([ForwardedTransaction(topic, partition, prepared)])
        waited = _left(deadline, self._timeout_s + 10.0)
        try:
            return out.answer.result(waited)
        except concurrent.futures.TimeoutError:
            out.answer.cancel()  # still queued: not sent (once sent, the owner's check decides)
            raise PeerUnreachable(
                f"{url} did not answer a forwarded transaction within {waited:.1f} s (the "
                "owner may be waiting for Kafka)"
            ) from None

    def read_state(
        self, topic: str, partition: int, keys: Sequence[str]
    ) -> dict[str, bytes | None]:
        values, _next = self._with_owner(
            topic, partition, lambda url: self._link.read_state(url, topic, partition, keys)
        )
        self._cache.put(topic, partition, values)
        return dict(values)

    def run(self, topic: str, partition: int, fn: TransactionFn) -> AppendResult:
        """Run ``fn`` against the owner's state and have the owner commit it if still valid."""
        return self._run_attempt(_Attempt(topic, partition, fn, concurrent.futures.Future()))

    def _run_attempt(self, attempt: _Attempt) -> AppendResult:
        while True:
            prepared = self._prepare(attempt)
            if isinstance(prepared, AppendResult):
                return prepared
            answer: CommitAnswer = self._with_owner(
                attempt.topic,
                attempt.partition,
                lambda url, prepared=prepared: self._commit_at(
                    url, attempt.topic, attempt.partition, prepared, attempt.deadline
                ),
                attempt.deadline,
            )
            if self._absorb(attempt, answer):
                assert answer.committed is not None
                return answer.committed

    def _prepare(self, attempt: _Attempt) -> PreparedTransaction | AppendResult:
        """Run the function until what it read is known: the transaction to commit, or the
        result if there is nothing to commit.  Raises the function's error (computed from
        values read from the owner, not from the cache)."""
        topic, partition, known, fresh = (
            attempt.topic,
            attempt.partition,
            attempt.known,
            attempt.fresh,
        )

        def fetch(keys: Sequence[str]) -> None:
            values, attempt.next_offset = self.read_state_and_next(
                topic, partition, keys, attempt.deadline
            )
            known.update(values)
            fresh.update(values)

        while True:
            attempt.rounds += 1
            if attempt.rounds > _MAX_ROUNDS:
                raise StoreUnavailable(f"{topic}/{partition}: too many concurrent changes; retry")
            next_offset = attempt.next_offset
            state = _RecordingState(
                known, next_offset, lambda key: self._cache.hint(topic, partition, key)
            )
            error: Exception | None = None
            records: list[bytes] = []
            try:
                records = [bytes(v) for v in attempt.fn(state)]
            except Exception as exc:
                error = exc
            if state.missing:
                hinted = self._cache.get(topic, partition, sorted(state.missing))
                known.update(hinted)
                unknown = sorted(state.missing - hinted.keys())
                if unknown or (state.asked_next and next_offset is None):
                    fetch(unknown)
                continue
            if state.asked_next and next_offset is None:
                fetch([])
                continue
            if error is not None:
                stale = [k for k in state.read if k not in fresh]
                if stale:  # an error computed from cached values: look at the real ones
                    fetch(stale)
                    continue
                raise error
            read_fresh = all(k in fresh for k in state.read)
            if not state.local and not records and read_fresh and not state.asked_next:
                return AppendResult(next_offset or 0, (next_offset or 0) - 1)
            attempt.read = list(state.read)
            attempt.local = dict(state.local)
            audited = late_commit_hook(attempt.fn) is not None
            return PreparedTransaction(
                expect={k: digest(known.get(k)) for k in state.read},
                expect_next_offset=next_offset if state.asked_next else None,
                puts=dict(state.local),
                records=records,
                counted_at_owner=audited,
                record_lines=known_record_lines(attempt.fn, records) if audited else None,
            )

    def _absorb(self, attempt: _Attempt, answer: CommitAnswer) -> bool:
        """Take the owner's answer in: True if it committed; else the conflicting values are
        now known and the function runs again."""
        topic, partition = attempt.topic, attempt.partition
        if answer.committed is not None:
            self._cache.put(topic, partition, {k: attempt.known.get(k) for k in attempt.read})
            self._cache.put(topic, partition, attempt.local)
            elsewhere = getattr(attempt.fn, "committed_elsewhere", None)
            if elsewhere is not None and answer.counted:
                elsewhere()  # audited: the owner counted it
            return True
        attempt.known.update(answer.conflict_values)
        attempt.fresh.update(answer.conflict_values)
        self._cache.put(topic, partition, answer.conflict_values)
        if answer.next_offset is not None:
            attempt.next_offset = answer.next_offset
        return False

    def read_state_and_next(
        self, topic: str, partition: int, keys: Sequence[str], deadline: float | None = None
    ) -> tuple[dict[str, bytes | None], int]:
        values, next_offset = self._with_owner(
            topic,
            partition,
            lambda url: self._link.read_state(url, topic, partition, keys),
            deadline,
        )
        self._cache.put(topic, partition, values)
        return dict(values), int(next_offset)

    def forget_topic(self, topic: str) -> None:
        self._cache.forget_topic(topic)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._senders.shutdown(wait=False, cancel_futures=True)
        self._link.close()


_REFUSALS: tuple[tuple[type[BadRequest], str], ...] = (
    (RecordTooLarge, "record_too_large"),
    (LimitReached, "limit_reached"),
    (UnknownPartition, "unknown_partition"),
    (BadRequest, "bad_request"),
)
"""The owner's refusals of a forwarded transaction (it fails the same way on every retry: the
client's data, not the installation's health, is at fault), in the order they are looked for
(a subclass before its base).  Each crosses the wire by name and is raised at the sender as
it was at the owner, so the client is answered as if its gateway owned the partition (413
``record_too_large``, 429 ``limit_reached``, ...), not 503 for ever.  A peer of an earlier
version names none of them (``unavailable``), and takes a name it does not know for
``unavailable``: a mixed pair answers 503, as both did before."""


def owner_error_kind(exc: BaseException) -> str:
    """How a peer names an error it answers with (``ingest_api`` maps it to a status)."""
    if isinstance(exc, NotOwner):
        return "not_owner"
    if isinstance(exc, UnknownTopic):
        return "unknown_topic"
    for refusal, kind in _REFUSALS:
        if isinstance(exc, refusal):
            return kind
    return "unavailable"


def owner_error_json(exc: BaseException) -> dict[str, Any]:
    """The owner's error for one forwarded transaction, as its answer carries it."""
    doc: dict[str, Any] = {"error": owner_error_kind(exc), "reason": str(exc)}
    if isinstance(exc, LimitReached):
        doc.update(limit=exc.limit, max=exc.maximum)
    return doc


def owner_error_of(doc: Mapping[str, Any]) -> LogbrokerError:
    """The error an owner's answer names (see :func:`owner_error_json`); ``StoreUnavailable``
    for a name this version does not know (a later version's)."""
    reason = str(doc.get("reason", ""))
    kind = doc.get("error")
    if kind == "not_owner":
        return NotOwner(reason)
    if kind == "unknown_topic":
        return UnknownTopic(reason)
    if kind == "limit_reached":  # stated with the limit, or not at all
        limit, maximum = doc.get("limit"), doc.get("max")
        if isinstance(limit, str) and type(maximum) is int:
            return LimitReached(reason, limit, maximum)
        return StoreUnavailable(reason)
    for refusal, name in _REFUSALS:
        if kind == name:
            return refusal(reason)
    return StoreUnavailable(reason)


def _left(deadline: float | None, otherwise: float) -> float:
    """What is left until ``deadline`` (a moment at least), or ``otherwise`` without one."""
    if deadline is None:
        return otherwise
    return max(0.05, deadline - time.monotonic())
