"""The old Archive API's transactions: staged data, a data record, a commit marker.

``/store`` keeps a piece of data in a staging directory; ``/commit_request`` writes it to the
log as one ``legacy_data`` record under a transaction id; ``/commit`` writes a small
``legacy_commit`` marker after it in the same partition.  Readers deliver a transaction's data
only where its marker is, and only when the marker was written within the window (default
60 s) after the data; data without a marker, or with a late one, is never delivered.

The marker carries the data record's offset, so a reader resolves a transaction with one read
and keeps no pending state: a reader's position is a plain offset, as for every other record.
Both steps are idempotent: the partition's state area holds, per transaction, the data offset
and whether it committed, updated in the same transaction as the append.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import threading
import time
import zlib
from dataclasses import dataclass
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
    """A ``/commit_request`` of a store id whose data was written under another transaction
    id: it is in the log once, under that id, and is not written again."""


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


@dataclass(frozen=True)
class StagedData:
    store_id: str
    log_type: str
    server: str
    file: str
    data: bytes
    written: bool = False
    """The data went to the log already; only its metadata is kept, for repeated requests."""


DEFAULT_MAX_STAGED_BYTES = 1024**3
_RECOUNT_S = 1.0


class LegacyStaging:
    """The temporary storage behind ``/store``: one file per piece, fsynced before the answer.

    At most ``max_bytes`` are staged at once (data uploaded but not yet requested into the
    log, or not yet expired): a further ``/store`` is :class:`LimitReached`.  The total is the
    directory's, recounted at most once a second, so other processes' uploads count too.
    """

    def __init__(
        self,
        directory: Path,
        max_age_s: float = 24 * 3600.0,
        max_bytes: int = DEFAULT_MAX_STAGED_BYTES,
    ) -> None:
        self._dir = directory
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self._used = 0
        self._counted_at = float("-inf")
        self._lock = threading.Lock()
        self._dir.mkdir(parents=True, exist_ok=True)

    def staged_bytes(self) -> int:
        """Bytes in the staging directory, at most a second old."""
        with self._lock:
            if time.monotonic() - self._counted_at >= _RECOUNT_S:
                used = 0
                for path in self._dir.iterdir():
                    with contextlib.suppress(FileNotFoundError):
                        used += path.stat().st_size
                self._used = used
                self._counted_at = time.monotonic()
            return self._used

    def put(self, *, log_type: str, server: str, file: str, data: bytes) -> str:
        if self.staged_bytes() + len(data) > self.max_bytes:
            raise LimitReached(
                f"{self.max_bytes} bytes are staged for /commit_request already, the limit; "
                "commit or let them expire first",
                "max_staged_bytes",
                self.max_bytes,
            )
        store_id = secrets.token_hex(16)
        self._write(store_id, {"log_type": log_type, "server": server, "file": file}, data)
        with self._lock:
            self._used += len(data)
        return store_id

    def _write(self, store_id: str, meta: dict[str, Any], data: bytes) -> None:
        raw_meta = json.dumps(meta).encode()
        tmp = self._dir / f"{store_id}.tmp"
        with open(tmp, "wb") as out:
            out.write(len(raw_meta).to_bytes(4, "big") + raw_meta + data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self._dir / store_id)
        # The rename is durable only once the directory is: /store answers after this.
        fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def mark_written(self, staged: StagedData) -> None:
        """Drop the data but keep the metadata, so a repeated request is answered the same."""
        meta = {"log_type": staged.log_type, "server": staged.server, "file": staged.file}
        self._write(staged.store_id, {**meta, "written": True}, b"")

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

    def sweep(self, now: float | None = None) -> int:
        """Drop pieces and written markers older than the maximum age; return how many."""
        cutoff = (now if now is not None else time.time()) - self.max_age_s
        dropped = 0
        for path in self._dir.iterdir():
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    dropped += 1
            except FileNotFoundError:
                continue
        return dropped


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
    after the topic grew partitions (the repeat finds the partition the first one used)."""
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
    outcome: dict[str, Any] = {}

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
            outcome["data_offset"] = doc["data_offset"]
            return []
        if staged.written:
            raise StoreIdWritten(
                f"the data of store_id {staged.store_id} was written under another txn_id; "
                "it is not written again (request it under that txn_id)"
            )
        # No offset recorded: a first request, or one whose second step a crash cut off.  A
        # record written by such an attempt is never named by a marker, so it is never read.
        attempt = 1 if doc is None else int(doc["attempt"]) + 1
        _save(
            state,
            txn_id,
            {
                "attempt": attempt,
                "data_offset": None,
                "write_time": now_ms,
                "store_id": staged.store_id,
            },
        )
        outcome["attempt"] = attempt
        return [writer.encode(attempt, now_ms, now_ms, staged.data)]

    result = store.transact(topic, partition, fn)
    if "data_offset" in outcome:
        return TxnWritten(txn_id, topic, partition, int(outcome["data_offset"]))
    data_offset = result.first_offset

    def record_offset(state: PartitionState) -> list[bytes]:
        doc = _load(state, txn_id)
        if doc is not None and doc["attempt"] == outcome["attempt"]:
            doc["data_offset"] = data_offset
            _save(state, txn_id, doc)
        return []

    store.transact(topic, partition, record_offset)
    return TxnWritten(txn_id, topic, partition, data_offset)


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
    """
    target = marker_target(marker)
    if target is None:
        return None
    data_offset, data_write_time = target
    if marker.write_time - data_write_time > window_ms:
        return None
    try:
        result = store.read(topic, partition, data_offset, max_bytes=1)
    except OffsetOutOfRange:
        return None
    if not result.records or result.records[0].offset != data_offset:
        return None
    try:
        data = view(result.records[0].value)
    except NotAnEnvelope:
        return None
    if data.kind != "legacy_data" or data.txn_id != marker.txn_id:
        return None
    return data
