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
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from log_store.errors import LogbrokerError, StoreUnavailable, UnknownTopic
from log_store.interface import AppendResult, PartitionState, TransactionFn

log = logging.getLogger(__name__)

_MAX_ROUNDS = 12
_CACHE_ENTRIES = 200_000
_OWNER_WAIT_S = 2.0


def digest(value: bytes | None) -> str:
    """A short fingerprint of a state value; ``-`` for an absent key."""
    if value is None:
        return "-"
    return hashlib.blake2b(value, digest_size=16).hexdigest()


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode()


def _unb64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


class NotOwner(LogbrokerError):
    """The gateway asked does not own the partition (any more)."""


class PeerUnreachable(LogbrokerError):
    """The gateway announced as owner did not answer."""


# -- the wire ---------------------------------------------------------------------------------
@dataclass
class PreparedTransaction:
    """What a function read and wrote, for the owner to check and commit."""

    expect: dict[str, str] = field(default_factory=dict)
    """key -> digest of the value the function read."""
    expect_next_offset: int | None = None
    puts: dict[str, bytes] = field(default_factory=dict)
    records: list[bytes] = field(default_factory=list)

    def encode(self) -> bytes:
        header = {
            "expect": self.expect,
            "expect_next_offset": self.expect_next_offset,
            "puts": {k: _b64(v) for k, v in self.puts.items()},
            "record_lengths": [len(r) for r in self.records],
        }
        raw = json.dumps(header).encode()
        return b"".join([len(raw).to_bytes(4, "big"), raw, *self.records])

    @classmethod
    def decode(cls, body: bytes) -> PreparedTransaction:
        """Parse a body; ``ValueError`` if it is not one."""
        if len(body) < 4:
            raise ValueError("too short")
        size = int.from_bytes(body[:4], "big")
        header = json.loads(body[4 : 4 + size])
        pos = 4 + size
        records = []
        for length in header["record_lengths"]:
            if not isinstance(length, int) or length < 0 or pos + length > len(body):
                raise ValueError("a record runs past the end of the body")
            records.append(body[pos : pos + length])
            pos += length
        if pos != len(body):
            raise ValueError("bytes after the last record")
        expect = header["expect"]
        if not isinstance(expect, dict):
            raise ValueError("expect must be an object")
        next_offset = header.get("expect_next_offset")
        if next_offset is not None and not isinstance(next_offset, int):
            raise ValueError("expect_next_offset must be an integer")
        puts = {str(k): _unb64(v) or b"" for k, v in header["puts"].items()}
        return cls({str(k): str(v) for k, v in expect.items()}, next_offset, puts, records)


@dataclass
class CommitAnswer:
    """The owner's answer to a prepared transaction."""

    committed: AppendResult | None = None
    conflict_values: dict[str, bytes | None] = field(default_factory=dict)
    next_offset: int | None = None

    def to_json(self) -> dict[str, Any]:
        if self.committed is not None:
            return {
                "status": "committed",
                "first_offset": self.committed.first_offset,
                "last_offset": self.committed.last_offset,
            }
        return {
            "status": "conflict",
            "values": {k: _b64(v) for k, v in self.conflict_values.items()},
            "next_offset": self.next_offset,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CommitAnswer:
        if doc.get("status") == "committed":
            return cls(AppendResult(int(doc["first_offset"]), int(doc["last_offset"])))
        values = {str(k): _unb64(v) for k, v in (doc.get("values") or {}).items()}
        return cls(None, values, doc.get("next_offset"))


def encode_values(values: Mapping[str, bytes | None], next_offset: int) -> dict[str, Any]:
    return {"values": {k: _b64(v) for k, v in values.items()}, "next_offset": next_offset}


def decode_values(doc: Mapping[str, Any]) -> tuple[dict[str, bytes | None], int]:
    return {str(k): _unb64(v) for k, v in doc["values"].items()}, int(doc["next_offset"])


class PeerLink(Protocol):
    """How one gateway reaches another.  Errors: ``NotOwner``, ``PeerUnreachable``,
    ``UnknownTopic``, ``StoreUnavailable``."""

    def read_state(
        self, url: str, topic: str, partition: int, keys: Sequence[str]
    ) -> tuple[dict[str, bytes | None], int]: ...

    def commit(
        self, url: str, topic: str, partition: int, prepared: PreparedTransaction
    ) -> CommitAnswer: ...

    def close(self) -> None: ...


# -- the owner's side -------------------------------------------------------------------------
class _Conflict(Exception):
    def __init__(self, values: dict[str, bytes | None], next_offset: int) -> None:
        super().__init__("conflict")
        self.values = values
        self.next_offset = next_offset


def checked_transaction(prepared: PreparedTransaction) -> TransactionFn:
    """The owner-side function: commit ``prepared`` only if what it read is still there."""

    def fn(state: PartitionState) -> Sequence[bytes]:
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

    return fn


def answer_of(future: concurrent.futures.Future[AppendResult]) -> CommitAnswer:
    """Wait for the owner's commit of a checked transaction and say how it went."""
    try:
        return CommitAnswer(future.result())
    except _Conflict as conflict:
        return CommitAnswer(None, conflict.values, conflict.next_offset)


# -- the caller's side --------------------------------------------------------------------------
class _RecordingState:
    """The owner's state as known here; remembers what the function read and wrote."""

    def __init__(self, known: Mapping[str, bytes | None], next_offset: int | None) -> None:
        self._known = known
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
            self.missing.add(key)
            return None
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


class RemoteTransactions:
    """Runs transactions and state reads of partitions owned by other gateways."""

    def __init__(
        self, directory: OwnerLookup, link: PeerLink, *, timeout_s: float, workers: int = 32
    ) -> None:
        self._directory = directory
        self._link = link
        self._timeout_s = timeout_s
        self._cache = _ValueCache()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="logbroker-remote"
        )

    def submit(
        self,
        topic: str,
        partition: int,
        fn: TransactionFn,
        future: concurrent.futures.Future[AppendResult],
    ) -> None:
        def run() -> None:
            if not (future.running() or future.set_running_or_notify_cancel()):
                return
            try:
                future.set_result(self.run(topic, partition, fn))
            except BaseException as exc:
                future.set_exception(exc)

        try:
            self._pool.submit(run)
        except RuntimeError:  # the pool is shut down: the store is closing
            if future.set_running_or_notify_cancel():
                future.set_exception(StoreUnavailable("log store is closed"))

    def _with_owner(self, topic: str, partition: int, call: Any) -> Any:
        """``call(url)`` at the partition's owner, following ownership as it moves."""
        deadline = time.monotonic() + self._timeout_s
        suspect: str | None = None
        last_error: Exception | None = None
        while True:
            remaining = deadline - time.monotonic()
            url = self._directory.owner(
                topic, partition, not_url=suspect, wait_s=max(0.0, min(remaining, _OWNER_WAIT_S))
            )
            if url is None and suspect is not None:
                url = suspect  # nobody else claimed it: it may be back
            if url is None:
                if remaining <= 0:
                    raise StoreUnavailable(
                        f"no gateway owns {topic}/{partition} right now ({last_error or 'none'})"
                    )
                continue
            try:
                return call(url)
            except (NotOwner, PeerUnreachable) as exc:
                last_error = exc
                suspect = url
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"the owner of {topic}/{partition} cannot be reached: {exc}"
                    ) from None
                time.sleep(0.05)

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
        known: dict[str, bytes | None] = {}
        fresh: set[str] = set()
        next_offset: int | None = None

        def fetch(keys: Sequence[str]) -> None:
            nonlocal next_offset
            values, next_offset = self.read_state_and_next(topic, partition, keys)
            known.update(values)
            fresh.update(values)

        for _round in range(_MAX_ROUNDS):
            state = _RecordingState(known, next_offset)
            error: Exception | None = None
            records: list[bytes] = []
            try:
                records = [bytes(v) for v in fn(state)]
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
            prepared = PreparedTransaction(
                expect={k: digest(known.get(k)) for k in state.read},
                expect_next_offset=next_offset if state.asked_next else None,
                puts=dict(state.local),
                records=records,
            )
            answer: CommitAnswer = self._with_owner(
                topic,
                partition,
                lambda url, prepared=prepared: self._link.commit(url, topic, partition, prepared),
            )
            if answer.committed is not None:
                self._cache.put(topic, partition, {k: known.get(k) for k in state.read})
                self._cache.put(topic, partition, state.local)
                return answer.committed
            known.update(answer.conflict_values)
            fresh.update(answer.conflict_values)
            self._cache.put(topic, partition, answer.conflict_values)
            if answer.next_offset is not None:
                next_offset = answer.next_offset
        raise StoreUnavailable(f"{topic}/{partition}: too many concurrent changes; retry")

    def read_state_and_next(
        self, topic: str, partition: int, keys: Sequence[str]
    ) -> tuple[dict[str, bytes | None], int]:
        values, next_offset = self._with_owner(
            topic, partition, lambda url: self._link.read_state(url, topic, partition, keys)
        )
        self._cache.put(topic, partition, values)
        return dict(values), int(next_offset)

    def forget_topic(self, topic: str) -> None:
        self._cache.forget_topic(topic)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._link.close()


def owner_error_kind(exc: BaseException) -> str:
    """How a peer names an error it answers with (``ingest_api`` maps it to a status)."""
    if isinstance(exc, NotOwner):
        return "not_owner"
    if isinstance(exc, UnknownTopic):
        return "unknown_topic"
    return "unavailable"
