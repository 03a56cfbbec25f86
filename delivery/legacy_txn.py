"""The old Archive API's transactions: staged data, a data record, a commit marker.

``/store`` keeps a piece of data in a staging directory; ``/commit_request`` writes it to the
log as one ``legacy_data`` record under a transaction id; ``/commit`` writes a small
``legacy_commit`` marker after it in the same partition.  Readers deliver a transaction's data
only where its marker is, and only when the marker was written within the window (default
60 s) after the data; data without a marker, or with a late one, is never delivered.

The marker carries the data record's offset, so a reader resolves a transaction without
pending state (a reader's position is a plain offset, as for every other record): from the
records it has just read, where the data lies as a rule, or by reading that offset
(:class:`CommitResolver` reads the data of many markers together).
Both steps are idempotent: the partition's state area holds, per transaction, the data offset
and whether it committed, updated in the same transaction as the append.

A piece is written at most once, under one transaction id: ``/commit_request`` first binds the
staged piece to its ``txn_id`` (:meth:`LegacyStaging.claim`, in the piece's own file, under a
lock that every process of the gateway shares) and only then writes it.  Every later request
under another id finds the binding and writes nothing, whatever the interleaving, and a crash
at any step leaves either no binding (nothing written) or one that a repeat under the same id
completes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import signal
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from delivery.envelope_view import EnvelopeView, NotAnEnvelope, view
from log_store.errors import BadRequest, LimitReached, OffsetOutOfRange
from log_store.interface import LogStore, PartitionState
from session_dedup.envelope import EnvelopeWriter

DEFAULT_WINDOW_MS = 60_000
_TXN_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")
_STORE_ID = re.compile(r"[0-9a-f]{32}")
_STATE_PREFIX = "legacy-txn/"


class UnknownTransaction(BadRequest):
    """A ``/commit`` for a transaction id that no ``/commit_request`` wrote."""


class UnknownStagedData(BadRequest):
    """A ``/commit_request`` for a store id that is not (or no longer) staged."""


class TxnIdTaken(BadRequest):
    """A ``/commit_request`` naming a transaction id that another store id's data was written
    under: answering it as written would tell the client its data is in the log."""


class StoreIdWritten(BadRequest):
    """A ``/commit_request`` of a store id whose data was written (or is bound to be written)
    under another transaction id: it is in the log once, under that id, never again."""


class WindowExpired(BadRequest):
    """A ``/commit`` that came later than the window after its data: it is never delivered,
    so it is refused rather than answered as committed."""


def validate_txn_id(txn_id: str) -> str:
    if not _TXN_ID.fullmatch(txn_id):
        raise BadRequest("txn_id must be 1-200 characters of [A-Za-z0-9._:-]")
    return txn_id


def txn_partition(txn_id: str, partitions: int) -> int:
    """The partition a transaction's data and marker go to: both must be in one stream."""
    return zlib.crc32(txn_id.encode("utf-8")) % partitions


class OverStagingLimit(BadRequest):
    """A ``/store`` body larger than ``max_staged_bytes`` (or its token's share) itself: it
    can never be staged, so a retry (as a 429 would invite) cannot help; the client must send
    smaller pieces."""


@dataclass(frozen=True)
class StagedData:
    store_id: str
    log_type: str
    server: str
    file: str
    data: bytes
    written: bool = False
    """The data went to the log already; only its metadata is kept, for repeated requests."""
    txn_id: str | None = None
    """The transaction the piece is bound to (see :meth:`LegacyStaging.claim`); None: not yet,
    or staged (or written) by a gateway from before the binding."""
    owner: str | None = None
    """The token owner whose ``/store`` staged it, whose share of the staging it counts
    against; None: staged without tokens, or by a gateway from before owners were kept."""

    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"log_type": self.log_type, "server": self.server, "file": self.file}
        if self.written:
            meta["written"] = True
        if self.txn_id is not None:
            meta["txn_id"] = self.txn_id
        if self.owner is not None:
            meta["owner"] = self.owner
        return meta


DEFAULT_MAX_STAGED_BYTES = 1024**3
DEFAULT_MAX_AGE_S = 3600.0
"""How long a staged piece (or the marker a written one leaves) is kept.  Old clients request
a piece right after storing it (they write within 30 s, and ``/commit`` must follow within the
60 s window); an hour also outlasts a restart of the gateway holding it (on Kafka another one
answers 503 meanwhile, and the client retries) while an abandoned upload holds its token's
share for an hour, not a day."""
_RECOUNT_S = 1.0
_MAX_META_BYTES = 1024 * 1024
_LOCK_PREFIX = ".lock-"
_TMP_SUFFIX = ".tmp"
_LOCK_STRIPES = 16

CRASH_AT_ENV = "LOGBROKER_LEGACY_CRASH_AT"
CRASH_POINTS = {
    "after-claim": "the piece is bound to its txn_id; nothing is in the log",
    "after-data-write": "the data record is durable; the staged piece is not marked written",
    "before-staged-rename": "a staged piece's new file is written and synced, not yet renamed "
    "into place (a /store: no store id was answered)",
}


def reach(point: str) -> None:
    """A test hook: die here by SIGKILL if ``LOGBROKER_LEGACY_CRASH_AT`` names ``point``, as a
    crash would stop the gateway there.  The crash tests use it; it has no other use."""
    if point not in CRASH_POINTS:
        raise ValueError(f"{point!r} is not a crash point")
    if os.environ.get(CRASH_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


class LegacyStaging:
    """The temporary storage behind ``/store``: one file per piece, fsynced before the answer.

    At most ``max_bytes`` are staged at once (data uploaded but not yet requested into the
    log, or not yet expired), and at most ``max_bytes_per_owner`` of them by one token owner:
    a further ``/store`` is :class:`LimitReached`, so one token's uploads never held for a
    commit keep the others out only once the owners together fill ``max_bytes``.  The totals
    are the directory's (each piece names its owner in its metadata), recounted at most once a
    second, so other processes' uploads count too.

    A piece's file changes only by an atomic replace, under a lock file in the directory
    (``flock``: it holds between the threads and the worker processes of a gateway, and a
    killed holder releases it), so binding it to a transaction and marking it written are
    each all or nothing, and never interleave.
    """

    def __init__(
        self,
        directory: Path,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        max_bytes: int = DEFAULT_MAX_STAGED_BYTES,
        max_bytes_per_owner: int | None = None,
    ) -> None:
        self._dir = directory
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self.max_bytes_per_owner = max_bytes_per_owner
        """One owner's share (``max_staged_bytes_per_token``); None: only ``max_bytes``."""
        self._used = 0
        self._by_owner: dict[str, int] = {}
        """The last count's bytes per owner ("" for pieces staged without one)."""
        self._owners: dict[str, tuple[int, int, str]] = {}
        """File name -> (mtime ns, size, owner) as last read: a recount reads the metadata
        of new or rewritten files only."""
        self._counted_at = float("-inf")
        self._pending = 0
        """Bytes of this process's uploads admitted and still being written: a recount of
        the directory does not see them yet, and the limit must."""
        self._pending_by_owner: dict[str, int] = {}
        self._published: dict[str, int] = {}
        """The bytes per owner as last counted or admitted: replaced, never changed, so that
        it is read without the lock (which a count on a hung disk holds)."""
        self._lock = threading.Lock()
        self._dir.mkdir(parents=True, exist_ok=True)

    def staged_bytes(self) -> int:
        """Bytes in the staging directory, at most a second old, and uploads being written."""
        with self._lock:
            return self._staged_locked()

    def staged_by_owner(self, *, recount: bool = True) -> dict[str, int]:
        """Bytes staged per owner ("": pieces staged without tokens or before owners were
        kept), with uploads being written; ``recount=False`` answers from the last count
        without touching the disk (for a scrape, which a hung disk must not hold)."""
        if not recount:
            return dict(self._published)
        with self._lock:
            self._staged_locked()
            return dict(self._published)

    def _publish_locked(self) -> None:
        counted = dict(self._by_owner)
        for owner, size in self._pending_by_owner.items():
            counted[owner] = counted.get(owner, 0) + size
        self._published = {owner: size for owner, size in counted.items() if size}

    def _staged_locked(self) -> int:
        if time.monotonic() - self._counted_at >= _RECOUNT_S:
            used = 0
            by_owner: dict[str, int] = {}
            owners: dict[str, tuple[int, int, str]] = {}
            for path in self._dir.iterdir():
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                used += st.st_size
                if path.name.startswith(_LOCK_PREFIX):
                    continue
                owner = self._owner_of(path, st.st_mtime_ns, st.st_size)
                owners[path.name] = (st.st_mtime_ns, st.st_size, owner)
                by_owner[owner] = by_owner.get(owner, 0) + st.st_size
            self._used = used
            self._by_owner = by_owner
            self._owners = owners
            self._counted_at = time.monotonic()
            self._publish_locked()
        return self._used + self._pending

    def _owner_of(self, path: Path, mtime_ns: int, size: int) -> str:
        """The owner a piece's metadata names ("" for none, or a file cut short: a piece
        being written, whose bytes its own process counts as pending)."""
        known = self._owners.get(path.name)
        if known is not None and known[:2] == (mtime_ns, size):
            return known[2]
        try:
            with open(path, "rb") as piece:
                meta_len = int.from_bytes(piece.read(4), "big")
                if meta_len > _MAX_META_BYTES:
                    return ""
                meta = json.loads(piece.read(meta_len))
        except (OSError, ValueError):
            return ""
        owner = meta.get("owner") if isinstance(meta, dict) else None
        return owner if isinstance(owner, str) else ""

    def _owner_staged_locked(self, owner: str) -> int:
        return self._by_owner.get(owner, 0) + self._pending_by_owner.get(owner, 0)

    def put(
        self, *, log_type: str, server: str, file: str, data: bytes, owner: str | None = None
    ) -> str:
        """Stage ``data`` for ``owner`` (the token's owner; None without tokens); its store id.

        :class:`OverStagingLimit` for a piece over ``max_bytes`` or the owner's share by
        itself; :class:`LimitReached` when the owner's pieces, or all, would be over them."""
        size = len(data)
        share = None if owner is None else self.max_bytes_per_owner
        if size > self.max_bytes:
            raise OverStagingLimit(
                f"this upload of {size} bytes is over max_staged_bytes ({self.max_bytes}) by "
                "itself: it can never be staged; send it in smaller pieces"
            )
        if share is not None and size > share:
            raise OverStagingLimit(
                f"this upload of {size} bytes is over max_staged_bytes_per_token ({share}) by "
                "itself: it can never be staged for this token; send it in smaller pieces"
            )
        key = owner or ""
        # The check and the admission are one step: concurrent uploads cannot both pass it.
        with self._lock:
            staged = self._staged_locked()
            mine = self._owner_staged_locked(key)
            if share is not None and mine + size > share:
                raise LimitReached(
                    f"this token's uploads staged for /commit_request hold {mine} bytes "
                    f"already; with this upload of {size} bytes they would be over "
                    f"max_staged_bytes_per_token ({share}); commit them, or let them expire "
                    f"({_duration(self.max_age_s)} after they were stored)",
                    "max_staged_bytes_per_token",
                    share,
                )
            if staged + size > self.max_bytes:
                theirs = "" if owner is None else f" ({mine} of them this token's)"
                raise LimitReached(
                    f"{staged} bytes are staged for /commit_request already{theirs}; with this "
                    f"upload of {size} bytes they would be over max_staged_bytes "
                    f"({self.max_bytes}); commit them or let them expire first "
                    f"({_duration(self.max_age_s)} after they were stored)",
                    "max_staged_bytes",
                    self.max_bytes,
                )
            self._pending += size
            self._pending_by_owner[key] = self._pending_by_owner.get(key, 0) + size
            self._publish_locked()
        store_id = secrets.token_hex(16)
        meta: dict[str, Any] = {"log_type": log_type, "server": server, "file": file}
        if owner is not None:
            meta["owner"] = owner
        written = False
        try:
            self._write(store_id, meta, data)
            written = True
        finally:
            with self._lock:
                self._pending -= size
                self._pending_by_owner[key] -= size
                if not self._pending_by_owner[key]:
                    del self._pending_by_owner[key]
                if written:  # counted until the next recount finds its file
                    self._used += size
                    self._by_owner[key] = self._by_owner.get(key, 0) + size
                self._publish_locked()
        return store_id

    def _write(self, store_id: str, meta: dict[str, Any], data: bytes) -> None:
        raw_meta = json.dumps(meta).encode()
        # A name of its own: a writer never renames another's half-written file.
        tmp = self._dir / f"{store_id}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        with open(tmp, "wb") as out:
            # held until the rename: a file of this name that is not empty and not locked
            # was left by a process killed while writing it (see drop_abandoned)
            fcntl.flock(out.fileno(), fcntl.LOCK_EX)
            out.write(len(raw_meta).to_bytes(4, "big") + raw_meta + data)
            out.flush()
            os.fsync(out.fileno())
            reach("before-staged-rename")
            os.replace(tmp, self._dir / store_id)
        # The rename is durable only once the directory is: /store answers after this.
        fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _locked(self, store_id: str) -> Iterator[None]:
        """Hold the lock of ``store_id``'s pieces (one of a few stripes; a file opened per use,
        so that threads of one process exclude each other as processes do)."""
        stripe = int(store_id[-2:], 16) % _LOCK_STRIPES
        fd = os.open(self._dir / f"{_LOCK_PREFIX}{stripe:x}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def claim(self, store_id: str, txn_id: str) -> StagedData:
        """Bind the piece to ``txn_id`` unless it is bound already; return it as now stored.

        The answer's ``txn_id`` is the one transaction id the piece may ever be written under:
        ``txn_id`` itself, or the one an earlier request bound it to.  The binding is durable
        before the answer, so a crash after it leaves a piece that only a repeat under the
        bound id can write.  A piece written by a gateway from before the binding is answered
        unbound and written (:func:`write_data` refuses it under a new id).
        """
        validate_store_id(store_id)
        with self._locked(store_id):
            staged = self.get(store_id)
            if staged.txn_id is not None or staged.written:
                return staged
            bound = replace(staged, txn_id=txn_id)
            self._write(store_id, bound.meta(), bound.data)
            return bound

    def release(self, store_id: str, txn_id: str) -> None:
        """Undo :meth:`claim` for a piece that can never be written under ``txn_id`` (the
        transaction holds another piece): it may then be requested under another id."""
        validate_store_id(store_id)
        with self._locked(store_id):
            try:
                staged = self.get(store_id)
            except UnknownStagedData:
                return
            if staged.txn_id == txn_id and not staged.written:
                self._write(store_id, replace(staged, txn_id=None).meta(), staged.data)

    def mark_written(self, store_id: str) -> StagedData:
        """Drop the data but keep the metadata and the binding, so a repeated request is
        answered the same; returns the piece as now stored."""
        validate_store_id(store_id)
        with self._locked(store_id):
            staged = self.get(store_id)
            if not staged.written:
                staged = replace(staged, written=True, data=b"")
                self._write(store_id, staged.meta(), b"")
            return staged

    def discard(self, store_id: str) -> None:
        """Drop a piece whose store id never reached its client (it went away before the
        answer), unless it was bound or written meanwhile."""
        validate_store_id(store_id)
        with self._locked(store_id):
            try:
                staged = self.get(store_id)
            except UnknownStagedData:
                return
            if staged.txn_id is None and not staged.written:
                (self._dir / store_id).unlink()
        with self._lock:
            self._counted_at = float("-inf")

    def get(self, store_id: str) -> StagedData:
        return decode_staged(store_id, self.raw(store_id))

    def raw(self, store_id: str) -> bytes:
        """The staged piece as stored (see :func:`decode_staged`); what another gateway is
        sent when a ``/commit_request`` for it reaches that one."""
        validate_store_id(store_id)
        try:
            return (self._dir / store_id).read_bytes()
        except FileNotFoundError:
            raise UnknownStagedData(
                f"nothing is staged under store_id {store_id} (never stored, or expired)"
            ) from None

    def drop_abandoned(self) -> int:
        """Remove the files a process killed while writing a piece left (``/store`` cut by a
        SIGKILL: no store id was answered, nobody can request it); return how many.

        Such a file counted against its owner's share until :meth:`sweep` found it older
        than the maximum age.  A writer holds its file's ``flock`` from before its first
        byte until it has renamed it, so a file that has bytes and no lock is abandoned.
        (An empty one may be a writer's between its open and its lock: it is left to the
        sweep by age, and counts nothing meanwhile.)"""
        dropped = 0
        for path in self._dir.iterdir():
            if not path.name.endswith(_TMP_SUFFIX):
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # renamed by its writer meanwhile
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # being written
                st = os.fstat(fd)
                try:
                    same = os.stat(path).st_ino == st.st_ino
                except FileNotFoundError:
                    continue
                if same and st.st_size > 0:
                    path.unlink()
                    dropped += 1
            finally:
                os.close(fd)
        if dropped:
            with self._lock:
                self._counted_at = float("-inf")
        return dropped

    def sweep(self, now: float | None = None) -> int:
        """Drop pieces and written markers older than the maximum age (since they were stored,
        or last bound or marked written), and the files of writes cut short by a kill; return
        how many."""
        cutoff = (now if now is not None else time.time()) - self.max_age_s
        dropped = self.drop_abandoned()
        for path in self._dir.iterdir():
            if path.name.startswith(_LOCK_PREFIX):
                continue  # removing a lock file while it is held would break the lock
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    dropped += 1
            except FileNotFoundError:
                continue
        if dropped:
            with self._lock:
                self._counted_at = float("-inf")  # the next check sees the room made
        return dropped


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def validate_store_id(store_id: str) -> None:
    if not _STORE_ID.fullmatch(store_id):
        raise UnknownStagedData("store_id must be the 32 hex digits /store answered")


def decode_staged(store_id: str, raw: bytes) -> StagedData:
    """A staged piece from its stored form: a 4-byte length, the JSON metadata, the data."""
    meta_len = int.from_bytes(raw[:4], "big")
    meta = json.loads(raw[4 : 4 + meta_len])
    return StagedData(
        store_id=store_id,
        log_type=meta["log_type"],
        server=meta["server"],
        file=meta["file"],
        data=raw[4 + meta_len :],
        written=bool(meta.get("written")),
        txn_id=meta.get("txn_id"),
        owner=meta.get("owner"),
    )


@dataclass(frozen=True)
class TxnWritten:
    txn_id: str
    topic: str
    partition: int
    data_offset: int


def _load(state: PartitionState, txn_id: str) -> dict[str, Any] | None:
    raw = state.get(_STATE_PREFIX + txn_id)
    return None if raw is None else dict(json.loads(raw))


def _save(state: PartitionState, txn_id: str, doc: dict[str, Any]) -> None:
    state.put(_STATE_PREFIX + txn_id, json.dumps(doc).encode())


def write_data(
    store: LogStore, topic: str, partitions: int, txn_id: str, staged: StagedData
) -> TxnWritten:
    """``/commit_request``: write the staged data once under ``txn_id``; safe to repeat, also
    after the topic grew partitions (the repeat finds the partition the first one used).

    The data record and its offset in the transaction's state go in one partition
    transaction, so a crash leaves both or neither, and a repeat never writes a second copy.
    ``staged`` must be bound to ``txn_id`` (:meth:`LegacyStaging.claim`) where it is staged:
    that is what keeps another transaction id, in another partition, from writing it too.
    """
    if staged.txn_id is not None and staged.txn_id != txn_id:
        raise StoreIdWritten(_bound_elsewhere(staged.store_id, staged.txn_id))
    try:
        partition = find_txn_partition(store, topic, partitions, txn_id)
    except UnknownTransaction:
        partition = txn_partition(txn_id, partitions)
    now_ms = int(time.time() * 1000)
    writer = EnvelopeWriter(
        source_id=f"legacy:{txn_id}",
        server=staged.server,
        file=staged.file,
        log_type=staged.log_type,
        kind="legacy_data",
        txn_id=txn_id,
    )
    outcome: dict[str, int] = {}

    def fn(state: PartitionState) -> list[bytes]:
        doc = _load(state, txn_id)
        # Transactions written before the store id was kept have none: answered as before.
        owner = None if doc is None else doc.get("store_id")
        if owner is not None and owner != staged.store_id:
            raise TxnIdTaken(
                f"txn_id {txn_id!r} holds the data of another store_id; the data of store_id "
                f"{staged.store_id} was not written: request it under another txn_id"
            )
        if doc is not None and doc.get("data_offset") is not None:
            outcome["data_offset"] = int(doc["data_offset"])
            return []
        if staged.written:
            # written by a gateway from before the binding, under some other transaction id
            raise StoreIdWritten(
                f"the data of store_id {staged.store_id} was written under another txn_id; "
                "it is not written again (request it under that txn_id)"
            )
        # No offset recorded: a first request, or (a gateway from before the offset was kept
        # with the data) one whose second step a crash cut off.  A record written by such an
        # attempt is never named by a marker, so it is never read.
        attempt = 1 if doc is None else int(doc["attempt"]) + 1
        data_offset = state.next_offset()
        _save(
            state,
            txn_id,
            {
                "attempt": attempt,
                "data_offset": data_offset,
                "write_time": now_ms,
                "store_id": staged.store_id,
            },
        )
        outcome["data_offset"] = data_offset
        return [writer.encode(attempt, now_ms, now_ms, staged.data)]

    store.transact(topic, partition, fn)
    return TxnWritten(txn_id, topic, partition, outcome["data_offset"])


def _bound_elsewhere(store_id: str, bound_to: str) -> str:
    return (
        f"the data of store_id {store_id} was requested under txn_id {bound_to!r} first: it "
        f"is written under that id only, once (repeat the request under {bound_to!r})"
    )


def store_id_written_elsewhere(store_id: str, bound_to: str) -> StoreIdWritten:
    """The refusal of a request naming another id than the one the piece is bound to."""
    return StoreIdWritten(_bound_elsewhere(store_id, bound_to))


def txn_store_id(store: LogStore, topic: str, partitions: int, txn_id: str) -> str | None:
    """The store id whose data ``txn_id`` holds, or None (nothing written under it yet, or
    written before the store id was kept)."""
    try:
        partition = find_txn_partition(store, topic, partitions, txn_id)
    except UnknownTransaction:
        return None
    raw = store.get_state(topic, partition, _STATE_PREFIX + txn_id)
    owner = None if raw is None else json.loads(raw).get("store_id")
    return None if owner is None else str(owner)


def find_txn_partition(store: LogStore, topic: str, partitions: int, txn_id: str) -> int:
    """Where ``txn_id``'s data went, even if the topic grew partitions since."""
    first = txn_partition(txn_id, partitions)
    for partition in [first, *(p for p in range(partitions) if p != first)]:
        if store.get_state(topic, partition, _STATE_PREFIX + txn_id) is not None:
            return partition
    raise UnknownTransaction(f"no /commit_request wrote transaction {txn_id!r} to {topic}")


def write_commit(
    store: LogStore,
    topic: str,
    partition: int,
    txn_id: str,
    server: str,
    window_ms: int = DEFAULT_WINDOW_MS,
) -> tuple[int, bool]:
    """``/commit``: write the marker once; returns (data offset, whether this call wrote it).

    Raises :class:`WindowExpired`, writing nothing, when the data was written more than
    ``window_ms`` ago and no marker was written yet: readers would never deliver it.
    """
    outcome: dict[str, Any] = {}

    def fn(state: PartitionState) -> list[bytes]:
        doc = _load(state, txn_id)
        if doc is None:
            raise UnknownTransaction(f"no /commit_request wrote transaction {txn_id!r}")
        if doc.get("data_offset") is None:
            raise UnknownTransaction(
                f"transaction {txn_id!r} has no finished /commit_request; repeat it first"
            )
        outcome["data_offset"] = doc["data_offset"]
        if doc.get("committed"):
            outcome["wrote"] = False
            return []
        # Read under the lock: the marker's write time is this, and readers judge by it.
        now_ms = int(time.time() * 1000)
        late_ms = now_ms - int(doc["write_time"])
        if late_ms > window_ms:
            raise WindowExpired(
                f"transaction {txn_id!r}: its data was written {late_ms / 1000:.1f} s ago, "
                f"past the {window_ms / 1000:.0f} s commit window; it will never be delivered"
            )
        doc["committed"] = True
        _save(state, txn_id, doc)
        outcome["wrote"] = True
        marker = {"data_offset": doc["data_offset"], "data_write_time": doc["write_time"]}
        writer = EnvelopeWriter(
            source_id=f"legacy:{txn_id}",
            server=server,
            file="",
            log_type=topic.split(".", 1)[-1],
            kind="legacy_commit",
            txn_id=txn_id,
        )
        return [writer.encode(1, now_ms, now_ms, json.dumps(marker).encode())]

    store.transact(topic, partition, fn)
    return int(outcome["data_offset"]), bool(outcome["wrote"])


def marker_target(marker: EnvelopeView) -> tuple[int, int] | None:
    """(data offset, data write time) named by a commit marker, or None if it is damaged."""
    try:
        body = json.loads(marker.data)
        return int(body["data_offset"]), int(body["data_write_time"])
    except (ValueError, KeyError, TypeError):
        return None


def resolve_commit(
    store: LogStore, topic: str, partition: int, marker: EnvelopeView, window_ms: int
) -> EnvelopeView | None:
    """The data a commit marker releases, or None when it must be skipped.

    Skipped: a marker written more than ``window_ms`` after its data, a damaged marker, data
    already dropped by retention, or a record there that is not this transaction's data.
    One store read per marker: a reader of many markers resolves them with a
    :class:`CommitResolver`, which judges each the same way.
    """
    return CommitResolver(store, topic, partition, window_ms).resolve([marker])[0]


_LOOKUP_BYTES = 1024 * 1024
"""What one read of data records outside a scan asks for: the data records of transactions
written one after another lie close together, and one read brings them all."""
_HELD_BYTES = 16 * 1024 * 1024
"""At most this much of data records a scan read is held for markers further on; beyond it
the oldest are let go (a marker naming one then reads it again)."""


class CommitResolver:
    """Resolves the commit markers of one forward scan of one partition with few store reads.

    A transaction's data record lies before its marker, usually a few offsets before it, in
    what the scan read just before.  The scan hands each ``legacy_data`` record it reads to
    :meth:`saw` and says how far it has read (:meth:`scanned_to`): a marker whose data offset
    lies in that range is resolved without a read (also when its data is not there: the scan
    saw every record of the range).  The other markers' data records are read together, one
    read per run of nearby offsets, not one per marker (on Kafka each read is a seek and a
    fetch, ~0.1 s).  Each marker is judged as :func:`resolve_commit` always judged it.
    """

    def __init__(
        self, store: LogStore, topic: str, partition: int, window_ms: int, scan_from: int = 0
    ) -> None:
        self._store = store
        self._topic = topic
        self._partition = partition
        self._window_ms = window_ms
        self._scan_from = scan_from
        self._scanned_to = scan_from
        self._held: dict[int, EnvelopeView] = {}
        """Data records the scan read, by offset, in offset order, until a marker takes them."""
        self._held_bytes = 0
        self._let_go: set[int] = set()
        """Offsets in the scanned range whose data record is no longer held (taken by a
        marker, or over :data:`_HELD_BYTES`): a marker naming one reads it."""
        self.lookups = 0
        """Store reads made for data records outside the scan."""

    def saw(self, offset: int, record: EnvelopeView) -> None:
        """A record the scan read at ``offset``; only ``legacy_data`` records are kept."""
        if record.kind != "legacy_data":
            return
        self._held[offset] = record
        self._held_bytes += len(record.value)
        while self._held_bytes > _HELD_BYTES and len(self._held) > 1:
            oldest = next(iter(self._held))
            self._held_bytes -= len(self._held.pop(oldest).value)
            self._let_go.add(oldest)

    def scanned_to(self, offset: int) -> None:
        """The scan handed every record from its start up to ``offset`` to :meth:`saw`."""
        self._scanned_to = max(self._scanned_to, offset)

    def resolve(
        self, markers: Sequence[EnvelopeView], deadline: float | None = None
    ) -> list[EnvelopeView | None]:
        """The data each marker releases, in order (None: skipped, as by
        :func:`resolve_commit`).

        Past ``deadline`` (``time.monotonic()``) the reads stop and the answer is shorter than
        ``markers``: the markers it leaves out are for a later read.  It resolves the first
        marker whatever the time, so a reader always moves on.
        """
        targets = [self._target(marker) for marker in markers]
        found: dict[int, EnvelopeView | None] = {}
        wanted = sorted({t for t in targets if t is not None and not self._known(t)})
        i = 0
        while i < len(wanted):
            if (
                deadline is not None
                and time.monotonic() >= deadline
                and self._first_known(targets, found)
            ):
                break
            i = self._read_from(wanted, i, found)
        released: list[EnvelopeView | None] = []
        for marker, target in zip(markers, targets, strict=True):
            if target is None:
                released.append(None)
                continue
            if target in found:
                data = found[target]
            elif self._known(target):
                data = self._held.get(target)  # not held: the scan found no data record there
            else:
                break  # not read before the deadline
            released.append(data if data is not None and data.txn_id == marker.txn_id else None)
        for target in targets[: len(released)]:
            if target is not None:
                self._let_go_of(target)
        return released

    def _target(self, marker: EnvelopeView) -> int | None:
        """The data offset to look at for ``marker``; None when it is skipped unread."""
        target = marker_target(marker)
        if target is None:
            return None
        data_offset, data_write_time = target
        if marker.write_time - data_write_time > self._window_ms:
            return None
        return data_offset

    def _inside(self, offset: int) -> bool:
        """Whether the scan read ``offset`` and still knows what is there."""
        return self._scan_from <= offset < self._scanned_to and offset not in self._let_go

    def _known(self, offset: int) -> bool:
        return offset in self._held or self._inside(offset)

    def _first_known(self, targets: list[int | None], found: dict[int, Any]) -> bool:
        first = targets[0] if targets else None
        return first is None or self._known(first) or first in found

    def _let_go_of(self, offset: int) -> None:
        """A marker took the data record at ``offset``: no other should name it."""
        data = self._held.pop(offset, None)
        if data is not None:
            self._held_bytes -= len(data.value)
            self._let_go.add(offset)

    def _read_from(self, wanted: list[int], i: int, found: dict[int, EnvelopeView | None]) -> int:
        """One read from ``wanted[i]`` on; note what it found of ``wanted`` (None for an
        offset it read past without a data record there), return the index of the first
        offset still to read."""
        first = wanted[i]
        self.lookups += 1
        try:
            result = self._store.read(self._topic, self._partition, first, _LOOKUP_BYTES)
        except OffsetOutOfRange as exc:
            # dropped by retention: every wanted offset below the log start is gone
            below = max(exc.start_offset, first + 1)
            while i < len(wanted) and wanted[i] < below:
                found[wanted[i]] = None
                i += 1
            return i
        values = {record.offset: record.value for record in result.records}
        read_to = max(result.next_offset, first + 1)
        while i < len(wanted) and wanted[i] < read_to:
            found[wanted[i]] = _data_record(values.get(wanted[i]))
            i += 1
        return i


def _data_record(value: bytes | None) -> EnvelopeView | None:
    if value is None:
        return None
    try:
        data = view(value)
    except NotAnEnvelope:
        return None
    return data if data.kind == "legacy_data" else None
