"""One partition of the embedded log: segment files plus a SQLite index and state area.

Layout of a partition directory::

    partition.db              SQLite (WAL): segments, batch index, state area, meta
    00000000000000000000.log  segment files of record batches (see record_batch.py)
    00000000000000052311.log

The segment files are the partition's truth.  A group commit writes one batch holding its
records *and the state-area updates it commits* (record_batch.py), and its one durable sync is
the segment's ``fdatasync``; only then is it acknowledged.  The SQLite index and state area are
then updated with ``synchronous=NORMAL``: visible at once to every process, synced lazily (at
WAL checkpoints).  After a power cut the database may lag the segments; recovery replays every
whole batch past the last indexed one into the index and the state area and cuts the torn rest
(tail_recovery.py), before this process serves anything from the partition, and again under
the write lock whenever a writer finds a segment longer than its index says (a writer killed
between its sync and its index commit).  So a chunk and the seqno that admits it are one
batch: both survive or neither does, and the seqno table is exact after recovery.

Appends go through one committer thread per partition and process: transactions that arrive
while a commit is in flight are committed together with one fdatasync (group commit).  Several
processes may append to one partition; a kernel lock on ``write.lock`` serializes them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import fcntl
import logging
import os
import resource
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Protocol

from log_store import crash_points
from log_store.batch_check import check_segment
from log_store.durable_dirs import fsync_directory, make_directories
from log_store.errors import (
    CorruptData,
    OffsetOutOfRange,
    PartitionDamaged,
    StoreFull,
    StoreUnavailable,
    TopicDeleted,
    UnknownTopic,
)
from log_store.failures import as_store_unavailable, is_no_space
from log_store.interface import (
    TOPIC_ID_KEY,
    AppendResult,
    PartitionInfo,
    ReadResult,
    Record,
    TransactionFn,
)
from log_store.record_batch import (
    HEADER_SIZE,
    MAGIC,
    BatchHeader,
    CheckedBatches,
    CorruptBatch,
    CrcMarks,
    check_pieces,
    crc_marks,
    decode_batches,
    encode_batch,
    has_large_values,
    parse_header,
    take_values,
    value_lengths,
    values_at,
)
from log_store.segment_files import SegmentFiles
from log_store.tail_recovery import DamagedSegment, scan_tail
from log_store.write_guard import WriteGuard

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS segments (
    base_offset INTEGER PRIMARY KEY,
    size_bytes INTEGER NOT NULL,
    max_ts INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    base_offset INTEGER PRIMARY KEY,
    last_offset INTEGER NOT NULL,
    segment INTEGER NOT NULL,
    pos INTEGER NOT NULL,
    length INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO meta VALUES ('log_start_offset', 0), ('end_offset', 0), ('deleted', 0);
"""

# What a commit starts from, in one statement: the end offset, the deletion mark, and the
# newest (active) segment's base offset and indexed size.
_LOG_TAIL = """
SELECT (SELECT value FROM meta WHERE key = 'end_offset'),
       (SELECT value FROM meta WHERE key = 'deleted'),
       (SELECT base_offset FROM segments ORDER BY base_offset DESC LIMIT 1),
       (SELECT size_bytes FROM segments ORDER BY base_offset DESC LIMIT 1)
"""

_BUSY_TIMEOUT_MS = 60_000
_COMMITTER_IDLE_S = 5.0
_READ_INDEX_ROWS = 512
# What a read of part of a batch reads first: its header and value lengths, in all but huge
# batches of tiny records.
_HEAD_READ = 64 * 1024
_CHECKPOINT_PAGES = 1000  # SQLite's own default threshold
_STATE_ROWS_PER_PAGE = 40
_UPSERT_ROWS = 400  # 800 variables per statement, below SQLite's smallest limit


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"


def now_ms() -> int:
    return int(time.time() * 1000)


def connect(path: Path, *, durable: bool = True, create: bool = True) -> sqlite3.Connection:
    """A connection in autocommit mode, WAL journal.

    ``durable``: every commit syncs the WAL (``synchronous=FULL``), for data whose only copy
    is the database (the catalog, retention, deletion).  Otherwise (``NORMAL``) commits are
    synced at checkpoints only, and a power cut may roll back the newest ones but never
    corrupts the file: for the partition index, which recovery rebuilds from the segments.

    ``create=False``: the file must exist ("unable to open database file" if not), so that a
    partition whose topic was deleted meanwhile is not made again as an empty file.
    """
    conn = sqlite3.connect(
        str(path) if create else f"{path.absolute().as_uri()}?mode=rw",
        timeout=_BUSY_TIMEOUT_MS / 1000,
        isolation_level=None,
        check_same_thread=False,
        uri=not create,
    )
    conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
    _enter_wal_mode(conn)
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
    if not durable:
        # Checkpoints (the only syncs of a NORMAL database) are run by the committer after
        # it has acked a group (PartitionLog._checkpoint_if_due), never inside a commit.
        conn.execute("PRAGMA wal_autocheckpoint=0")
    return conn


def _enter_wal_mode(conn: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode=WAL``, waiting out another process that is creating the file.

    Two processes opening a brand-new database at once can meet SQLite's deadlock
    avoidance, which answers "database is locked" at once instead of waiting.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
    delay_s = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, 0.2)


def _open_read_only(path: Path, immutable: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(
        f"{path.resolve().as_uri()}?mode=ro{'&immutable=1' if immutable else ''}",
        uri=True,
        timeout=_BUSY_TIMEOUT_MS / 1000,
        isolation_level=None,
        check_same_thread=False,
    )
    conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
    return conn


def _holds_no_wal_content(path: Path) -> bool:
    """Whether the main file of a WAL database is all of it: no ``-wal`` file, or an empty
    one (left by a reader, or by a clean close that could not remove it)."""
    try:
        return path.with_name(path.name + "-wal").stat().st_size == 0
    except FileNotFoundError:
        return True


_empty: sqlite3.Connection | None = None
_empty_lock = threading.Lock()


def _empty_partition() -> sqlite3.Connection:
    """An in-memory database with the schema and nothing else: a copy of one made once per
    process (copying its pages costs a tenth of running the schema's script, which each
    look of a long-poll of 1,000 partitions no write has made ran 1,000 times)."""
    global _empty
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    with _empty_lock:  # one copy at a time from the one source connection
        if _empty is None:
            _empty = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            _empty.executescript(_SCHEMA)
        _empty.backup(conn)
    return conn


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that can never write (``mode=ro``), for readers that must not.

    A database no process has created yet reads as an empty partition (an in-memory one with
    the schema), so that a read-only reader never creates a file.

    Reading a WAL database needs its ``-shm`` index.  With no process holding the database
    open there is none, and ``mode=ro`` has to create it: in a directory this process cannot
    write (a read-only file system, a snapshot mounted for inspection) or on a full disk that
    fails ("unable to open database file", "disk I/O error").  With no WAL content the main
    file is the whole database, and it is then read as immutable (no locks, no index): what
    a writer that opens it later commits is not seen through this connection.
    """
    if not path.exists():
        return _empty_partition()
    conn = _open_read_only(path, immutable=False)
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # opens the index
    except sqlite3.OperationalError as exc:
        conn.close()
        if "locked" in str(exc) or not _holds_no_wal_content(path):
            raise
        conn = _open_read_only(path, immutable=True)
    return conn


class _TxnState:
    """The state area as one transaction sees it: its own puts over the group's over the db.

    ``read`` holds what this commit has read from the database (None for an absent key),
    shared by the group's transactions: under the write lock the database cannot change
    before the commit, and the group's own puts are looked at first.
    """

    __slots__ = ("_conn", "_group", "_next_offset", "_read", "local")

    def __init__(
        self,
        conn: sqlite3.Connection,
        group: dict[str, bytes],
        read: dict[str, bytes | None],
        next_offset: int,
    ) -> None:
        self._conn = conn
        self._group = group
        self._read = read
        self._next_offset = next_offset
        self.local: dict[str, bytes] = {}

    def next_offset(self) -> int:
        return self._next_offset

    def get(self, key: str) -> bytes | None:
        if key in self.local:
            return self.local[key]
        if key in self._group:
            return self._group[key]
        if key in self._read:
            return self._read[key]
        row = self._conn.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        value = None if row is None else bytes(row[0])
        self._read[key] = value
        return value

    def prefetch(self, keys: Sequence[str]) -> None:
        """Read every key of ``keys`` not read yet, many per statement."""
        read = self._read
        missing = [key for key in dict.fromkeys(keys) if key not in read]
        for i in range(0, len(missing), 2 * _UPSERT_ROWS):
            part = missing[i : i + 2 * _UPSERT_ROWS]
            found = dict(
                self._conn.execute(
                    f"SELECT key, value FROM state WHERE key IN ({', '.join('?' * len(part))})",
                    part,
                ).fetchall()
            )
            for key in part:
                value = found.get(key)
                read[key] = None if value is None else bytes(value)

    def put(self, key: str, value: bytes) -> None:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError("state values are bytes")
        self.local[key] = bytes(value)


class _Outcome(Protocol):
    """Where a transaction's result goes: a ``Future``, or an ``_InlineOutcome``."""

    def set_running_or_notify_cancel(self) -> bool: ...

    def set_result(self, result: AppendResult) -> None: ...

    def set_exception(self, exception: BaseException) -> None: ...


class _InlineOutcome:
    """The outcome of a transaction its caller commits itself: a future without the locks
    and the condition that no other thread will ever wait on."""

    __slots__ = ("error", "result")

    def __init__(self) -> None:
        self.result: AppendResult | None = None
        self.error: BaseException | None = None

    def set_running_or_notify_cancel(self) -> bool:
        return True

    def set_result(self, result: AppendResult) -> None:
        self.result = result

    def set_exception(self, exception: BaseException) -> None:
        self.error = exception


@dataclass(slots=True)
class _PendingTxn:
    fn: TransactionFn
    future: _Outcome


@dataclass(frozen=True)
class _Batch:
    """One group commit's batch, encoded: ``count`` records from offset ``base``."""

    base: int
    ts: int
    pieces: list[bytes]
    length: int
    count: int
    state: dict[str, bytes]


class _OverFileSizeLimit(Exception):
    """A segment write went past the process's file-size limit (EFBIG)."""


def _over_file_size_limit(fd: int, at: int) -> bool:
    """Whether a byte written at ``at`` (where a short write stopped) is refused as EFBIG
    (the caller truncates the segment back to where the batch began)."""
    try:
        os.pwrite(fd, b"\0", at)
    except OSError as exc:
        return exc.errno == errno.EFBIG
    return False


def _file_size_limit(batch_len: int) -> StoreUnavailable:
    """A batch that does not fit under the file-size limit even in a segment of its own."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    shown = "unlimited" if limit == resource.RLIM_INFINITY else f"{limit} bytes"
    return StoreUnavailable(
        f"log store unavailable: a batch of {batch_len} bytes is over this process's "
        f"file-size limit ({shown}; ulimit -f, LimitFSIZE in the unit); nothing of it was kept"
    )


class PartitionLog:
    """The log of one partition in one process."""

    def __init__(
        self,
        directory: Path,
        segment_bytes: int,
        topic_alive: Callable[[], bool],
        *,
        read_only: bool = False,
        topic_id: str | None = None,
        on_no_space: Callable[[int], None] | None = None,
        guard: WriteGuard | None = None,
        place: tuple[str, int] | None = None,
        check_tail: bool = False,
    ) -> None:
        """Open (creating if needed) the partition in ``directory``.

        ``on_no_space`` is told the size of each batch that did not fit on the file system
        (and could fit on an emptier one).  ``guard`` is checked once per group commit and
        times each commit, retention pass and deletion mark (see :mod:`log_store.write_guard`).

        ``topic_id``: what :data:`TOPIC_ID_KEY` reads as in its transactions (by default
        the directory's parent's name, the topic id in the store's layout).

        ``topic_alive`` tells whether the topic still exists in the catalog.  The first
        commit through each new writer connection asks it under the partition's lock, so
        that a process which opened this partition after another process deleted the topic
        (and removed its files) can never ack an append into a database file of its own.
        Once a connection's file is known to be the topic's, the deletion mark that
        ``delete_topic`` sets in that file before it removes the topic from the catalog is
        enough, and cheaper: it is read with the log's tail anyway.

        ``read_only``: create, change and touch nothing (no directory, schema or notify
        file); reads only, through ``mode=ro`` connections.  For readers such as Spark
        executors that must leave the live store to its gateway.  With ``check_tail``, a
        read-only partition whose newest segment is shorter than its index says is refused
        (:class:`PartitionDamaged`), as a writer's recovery refuses it (a read-only store's
        partitions: the audit's, the tools').

        ``place`` (topic, partition) is what a :class:`PartitionDamaged` names.

        A partition whose ``partition.db`` is gone while segment files hold its data is
        never read as empty: opened for writing, its index is rebuilt from the segments
        (``_create_database``); read-only, or when the segments cannot give it whole, it
        is refused (:class:`PartitionDamaged`).
        """
        self.directory = directory
        self._place = place
        self.segment_bytes = segment_bytes
        self.topic_id_value = (topic_id or directory.parent.name).encode()
        self._topic_alive = topic_alive
        self._on_no_space = on_no_space
        self._guard = guard
        self.read_only = read_only
        if not read_only:
            make_directories(directory)
        self._db_path = directory / "partition.db"
        self._lock_path = directory / "write.lock"
        self.notify_path = directory / "notify"
        if not read_only:
            self.notify_path.touch()
            # made here only, with the partition: see _open_lock
            self._lock_path.touch()
        self._pool: list[sqlite3.Connection] = []
        self._pool_lock = threading.Lock()
        self._segments = SegmentFiles(directory)
        self._checked = CheckedBatches()
        self._committed_here_at = 0.0  # monotonic time of the last commit_here
        # Used by the committer thread only:
        self._write_fd: tuple[int, int] | None = None  # (segment base, fd)
        self._writer: sqlite3.Connection | None = None
        self._writer_in_live_topic = False  # the catalog vouched for the writer's file
        self._lock_fd: int | None = None
        self._notify_fd: int | None = None
        self._deleted = False
        self._pending: list[_PendingTxn] = []
        self._cond = threading.Condition()
        # Held by whoever commits (the committer thread or a commit_here caller), taken
        # before ``_cond`` when both are needed; it guards the writer's files and connection.
        self._commit_mutex = threading.Lock()
        self._committer: threading.Thread | None = None
        self._closed = False
        self._change = threading.Condition()
        self._change_seq = 0
        self.on_changed: Callable[[], None] | None = None
        """Also called after each change this process makes (its store's append followers)."""
        self._wal_pages = 0  # written since the last checkpoint, roughly (committer only)
        self._made = read_only  # the database file exists: never create it again
        try:
            self._open(check_tail)
        except BaseException:
            # Refused (damage found, a failing disk): nobody gets this object to close, and
            # its pooled connection would hold partition.db and its WAL open for ever.
            self.close()
            raise

    def _open(self, check_tail: bool) -> None:
        """Check the partition's files and, for writing, bring its index up to them."""
        # Segments first, then the index: a writer makes partition.db before any segment,
        # so looked at in the other order a reader opening a partition as its first write
        # made it (no index yet, then index and segment) took it for an index lost.
        if self.read_only and has_segment_files(self.directory) and not self._db_path.exists():
            raise self._damaged(
                "its index (partition.db) is gone while its segment files hold data; a "
                "gateway (a store opened for writing) rebuilds it from them on open"
            )
        if self.read_only and check_tail and self._db_path.exists():
            self._check_tail_read_only()
        if not self.read_only:
            if not self._db_path.exists():
                self._create_database()
            self._made = True
            with self._conn() as conn:
                conn.executescript(_SCHEMA)  # no-op but for a database of an older version
            # Recovery writes (it replays batches into the index), so readers leave it to
            # the writers; a read-only handle sees what the index holds.
            self._recover_at_open()

    @property
    def has_database(self) -> bool:
        """Whether the partition's database exists (a view of a partition no write has made
        yet reads as empty, and has nothing to change)."""
        return self._db_path.exists()

    def _create_database(self) -> None:
        """Make ``partition.db`` whole or not at all.

        It is built under a name of its own and renamed into place once its schema is
        synced: a database that did not fit (a full disk) leaves no file behind, so a
        partition whose ``partition.db`` exists is always whole, and one without it reads
        as empty without being made (``SqliteLogStore``).  The rename is made under the
        partition's writer lock, and only if no other process made the database meanwhile:
        that one is kept.
        """
        temp = self.directory / f"partition.db.{os.getpid()}-{threading.get_ident()}.new"
        try:
            if has_segment_files(self.directory):
                # Segments with no index: the index was lost.  Rebuilt under the writer lock
                # (its cut of a torn last batch must not race a writer), whole before it is
                # linked into place: a rebuild that fails leaves no index that would read
                # the partition as empty, or drop the segments it did not take.
                with self._write_lock():
                    if not self._db_path.exists():
                        self._build_database(temp, rebuild=True)
                        os.rename(temp, self._db_path)
                        fsync_directory(self.directory)  # the database file's own entry
                return
            self._build_database(temp, rebuild=False)
            # Renamed, not linked: a power cut's rebuild (tests/durability) models renames,
            # and the writer lock keeps another process from making one meanwhile.
            with self._write_lock():
                if not self._db_path.exists():
                    os.rename(temp, self._db_path)
                    fsync_directory(self.directory)  # the database file's own entry
        finally:
            for suffix in ("", "-journal", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{temp}{suffix}")

    def _build_database(self, temp: Path, *, rebuild: bool) -> None:
        """Make the database at ``temp`` with its schema and, with ``rebuild``, the index and
        state area of every batch of the segment files; synced."""
        # A rollback journal while it is built: every page is in the file once the
        # script returns, none left in a WAL that a close might fail to checkpoint.
        conn = sqlite3.connect(str(temp), isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.executescript(_SCHEMA)
            if rebuild:
                conn.execute("BEGIN IMMEDIATE")
                self._rebuild_index(conn)
                conn.execute("COMMIT")
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
        if os.path.exists(f"{temp}-wal"):
            raise StoreUnavailable(
                "log store unavailable: a new partition's database was not finished"
            )
        fd = os.open(temp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _rebuild_index(self, conn: sqlite3.Connection) -> None:
        """Index every batch of the segment files, applying their state updates in order.

        Only a log that starts at offset 0 is rebuilt: the state area (the seqno table) is
        the sum of every batch's updates, and those of segments that retention dropped are
        nowhere else.  Every file must start where the one before ends and hold whole
        batches only (the last may end in a torn batch, cut as recovery cuts it): anything
        else is damage, refused, not cut.
        """
        bases = sorted(_segment_files(self.directory))
        if bases[0] != 0:
            raise self._damaged(
                f"its index (partition.db) is gone and its segments start at offset "
                f"{bases[0]}: the seqno state of the segments before it cannot be rebuilt; "
                "restore the partition's directory from a copy"
            )
        end = 0
        for i, base in enumerate(bases):
            if base != end:
                raise self._damaged(
                    f"its index (partition.db) is gone and segment {segment_file_name(base)} "
                    f"does not start where the log before it ends ({end}); restore the "
                    "partition's directory from a copy"
                )
            ts = now_ms()
            conn.execute(
                "INSERT INTO segments (base_offset, size_bytes, max_ts, created_ms) "
                "VALUES (?, 0, ?, ?)",
                (base, ts, ts),
            )
            end = self._replay_segment(conn, base, 0, end, cut=i == len(bases) - 1)
        log.warning(
            "%s: rebuilt its lost index from %d segment file(s), up to offset %d",
            self.directory,
            len(bases),
            end,
        )

    def _damaged(self, message: str) -> PartitionDamaged:
        if self._place is None:
            return PartitionDamaged(message)
        topic, partition = self._place
        return PartitionDamaged(
            f"partition {topic}/{partition} is damaged: {message}", topic, partition
        )

    # -- connections ----------------------------------------------------------------------
    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        with self._pool_lock:
            conn = self._pool.pop() if self._pool else None
        if conn is None:
            try:
                conn = (
                    connect_read_only(self._db_path)
                    if self.read_only
                    else connect(self._db_path, create=not self._made)
                )
            except sqlite3.Error as exc:
                raise as_store_unavailable(exc) or exc from exc
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        with self._pool_lock:
            if len(self._pool) < 16 and not self._closed:
                self._pool.append(conn)
                return
        conn.close()

    # -- appends --------------------------------------------------------------------------
    def submit(self, fn: TransactionFn) -> concurrent.futures.Future[AppendResult]:
        future: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                if self._deleted:
                    raise UnknownTopic("the topic was deleted")
                raise StoreUnavailable("log store is closed")
            self._pending.append(_PendingTxn(fn, future))
            if self._committer is None:
                self._start_committer()
            else:
                self._cond.notify()
        return future

    def commit_here(self, fn: TransactionFn) -> AppendResult:
        """Commit ``fn`` in the calling thread and return its result after the sync.

        For a writer that waits for each commit anyway: when no commit is under way, the
        caller commits ``fn`` itself, together with whatever was queued before it, and saves
        the two thread hand-offs of a queued commit (to the committer and back), which on a
        busy machine cost more than the commit.  Otherwise ``fn`` is queued and waited for.
        """
        if not self._commit_mutex.acquire(blocking=False):
            return self.submit(fn).result()
        outcome = _InlineOutcome()
        try:
            with self._cond:
                if self._closed:
                    if self._deleted:
                        raise UnknownTopic("the topic was deleted")
                    raise StoreUnavailable("log store is closed")
                # What was queued first is committed first, in the same group.
                group, self._pending = self._pending, []
            group.append(_PendingTxn(fn, outcome))
            self._commit(group)
            self._checkpoint_if_due()
            self._committed_here_at = time.monotonic()
        finally:
            self._commit_mutex.release()
        if self._committer is None:
            with self._cond:
                if self._committer is None and not self._closed:
                    # It lets go of the files once the partition has been idle for a while.
                    self._start_committer()
        if outcome.error is not None:
            raise outcome.error
        assert outcome.result is not None
        return outcome.result

    def _start_committer(self) -> None:
        self._committer = threading.Thread(
            target=self._commit_loop,
            name=f"logbroker-commit-{self.directory.name}",
            daemon=True,
        )
        self._committer.start()

    def _commit_loop(self) -> None:
        try:
            while True:
                with self._cond:
                    if not self._pending and not self._closed:
                        self._cond.wait(_COMMITTER_IDLE_S)
                    if not self._pending:
                        if (
                            not self._closed
                            and time.monotonic() - self._committed_here_at < _COMMITTER_IDLE_S
                        ):
                            continue  # waiting writers commit in their own threads: not idle
                        # Idle: let go of the files, so that an idle process holds no
                        # descriptor of a segment that retention may drop; unless a
                        # caller is committing with them right now (commit_here).
                        if self._commit_mutex.acquire(blocking=False):
                            try:
                                self._release_writer()
                            finally:
                                self._commit_mutex.release()
                        return
                # The group is taken under the commit mutex, so that a commit_here never
                # overtakes transactions queued before it.
                with self._commit_mutex:
                    with self._cond:
                        group, self._pending = self._pending, []
                    if group:
                        self._commit(group)
                        self._checkpoint_if_due()
        finally:
            with self._cond:
                self._committer = None
                # A bug in a commit must not strand what was queued behind it.
                if self._pending and not self._closed:
                    self._committer = threading.Thread(
                        target=self._commit_loop,
                        name=threading.current_thread().name,
                        daemon=True,
                    )
                    self._committer.start()

    def _writer_conn(self) -> sqlite3.Connection:
        if self._writer is None:
            self._writer = connect(self._db_path, durable=False, create=False)
            self._writer_in_live_topic = False
        return self._writer

    @contextmanager
    def _write_lock(self) -> Iterator[None]:
        """The partition's writer lock across processes and threads, for anyone but the
        committer (retention, deletion, recovery at open).

        SQLite's own lock would do for correctness, but a writer waiting on it sleeps in
        steps of up to 100 ms; a kernel lock wakes the next writer as soon as it is free.
        flock excludes per open file, so only the committer (``_commit``) reuses its
        descriptor; anyone else opens its own.
        """
        fd = self._open_lock()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _open_lock(self) -> int:
        """A descriptor of the lock file, which opening the partition made.

        Never made again here: a topic's deletion removes its files, then its directories,
        and a lock file made between the two would keep a directory of a deleted topic for
        ever.  The file gone means the files were removed under this handle.
        """
        try:
            return os.open(self._lock_path, os.O_RDWR)
        except FileNotFoundError as exc:
            raise self._deleted_meanwhile(exc) or exc from exc

    def _commit(self, group: list[_PendingTxn]) -> None:
        # A caller that gave up (a cancelled future) is not committed for.
        group = [txn for txn in group if txn.future.set_running_or_notify_cancel()]
        if not group:
            return
        try:
            with self._guarded("a group commit"):
                lock_fd = self._lock_fd
                if lock_fd is None:
                    lock_fd = self._lock_fd = self._open_lock()
                fcntl.flock(lock_fd, fcntl.LOCK_EX)  # see _write_lock
                try:
                    outcomes, wrote = self._commit_locked(group)
                finally:
                    fcntl.flock(lock_fd, fcntl.LOCK_UN)
                if wrote and self._guard is not None:
                    # removed while it was written: into unlinked files
                    self._guard.check_not_removed()
        except BaseException as exc:
            failure = self._deleted_meanwhile(exc) or as_store_unavailable(exc) or exc
            no_space = not isinstance(exc, StoreFull) and is_no_space(exc)
            if no_space and self._on_no_space is not None:
                self._on_no_space(0)  # SQLite's own pages did not fit: size unknown
            if isinstance(failure, (StoreUnavailable, TopicDeleted)):
                self._reset_writer()
            for txn in group:
                txn.future.set_exception(failure)
            return
        for txn, result, error in outcomes:
            if error is not None:
                txn.future.set_exception(error)
            else:
                assert result is not None
                txn.future.set_result(result)
        if wrote:
            self.notify_changed()
            self._notify_other_processes()

    @contextmanager
    def _guarded(self, what: str) -> Iterator[None]:
        """Check the guard (the data directory is still the store's), then time the block."""
        if self._guard is None:
            yield
            return
        self._guard.check()
        with self._guard.operation(what):
            yield

    def _deleted_meanwhile(self, exc: BaseException) -> TopicDeleted | None:
        """A :class:`TopicDeleted` if ``exc`` is a failure of this partition's files and the
        topic has left the catalog: its deletion removed them under the commit (SQLite's
        "disk I/O error", ENOENT), the disk is not to blame."""
        if not isinstance(exc, (OSError, sqlite3.Error, StoreUnavailable)):
            return None
        try:
            if self._topic_alive():
                return None
        except (OSError, sqlite3.Error):
            return None  # the catalog fails too: the disk's doing
        return TopicDeleted("the topic was deleted while this write was in flight")

    def _checkpoint_if_due(self) -> None:
        """Copy the WAL into the database once it has grown; after the acks, not before.

        A PASSIVE checkpoint waits for no reader or writer and may stop short; the next one
        goes on.  Its syncs are the database's own, and nothing waits for them.
        """
        if self._wal_pages < _CHECKPOINT_PAGES or self._writer is None:
            return
        self._wal_pages = 0
        try:
            self._writer.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:
            log.warning("%s: checkpoint failed: %s", self._db_path, exc)

    def _notify_other_processes(self) -> None:
        """Touch the notify file: readers in other processes watch it with inotify.

        The WAL's own writes come before the commit is visible; this write comes after.
        """
        try:
            if self._notify_fd is None:
                self._notify_fd = os.open(self.notify_path, os.O_WRONLY | os.O_CREAT, 0o644)
            os.pwrite(self._notify_fd, b"\x01", 0)
        except OSError as exc:
            log.debug("cannot touch %s: %s", self.notify_path, exc)

    def _commit_locked(
        self, group: list[_PendingTxn]
    ) -> tuple[list[tuple[_PendingTxn, AppendResult | None, BaseException | None]], bool]:
        outcomes: list[tuple[_PendingTxn, AppendResult | None, BaseException | None]] = []
        conn = self._writer_conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            end, segment, pos = self._log_tail(conn)
            if segment is not None and os.fstat(self._segment_write_fd(segment)).st_size != pos:
                # A writer died between its segment sync and its index commit.
                self._recover_locked(conn, scan_directory=True)
                end, segment, pos = self._log_tail(conn)
            shared: dict[str, bytes] = {}
            read: dict[str, bytes | None] = {TOPIC_ID_KEY: self.topic_id_value}
            values: list[bytes] = []
            for txn in group:
                state = _TxnState(conn, shared, read, end + len(values))
                try:
                    produced = txn.fn(state)
                except Exception as exc:  # the transaction's own failure; others go on
                    outcomes.append((txn, None, exc))
                    continue
                shared.update(state.local)
                first = end + len(values)
                values.extend(produced)
                outcomes.append((txn, AppendResult(first, end + len(values) - 1), None))
            written: tuple[int, int] | None = None  # (fd, position) of the batch
            if values or shared:
                written = self._write_batch(conn, segment, pos, end, values, shared)
                # about the pages the commit adds to the WAL: index, segment, meta, state
                self._wal_pages += 3 + len(shared) // _STATE_ROWS_PER_PAGE
            try:
                conn.execute("COMMIT")
            except BaseException:
                if written is not None:
                    # Not acknowledged: do not leave it for recovery to find.
                    with contextlib.suppress(OSError):
                        os.ftruncate(*written)
                raise
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    self._reset_writer()
            raise
        return outcomes, bool(values)

    def _log_tail(self, conn: sqlite3.Connection) -> tuple[int, int | None, int]:
        """The end offset and the active segment's base and indexed size (None, 0 before the
        first one), once sure that the topic was not deleted (by any process)."""
        end, deleted, segment, size = conn.execute(_LOG_TAIL).fetchone()
        if deleted:
            raise UnknownTopic("the topic was deleted")
        if not self._writer_in_live_topic:
            # The topic's files are removed only after its catalog row, so a file opened
            # before the catalog still names the topic is the topic's own file, which a
            # deletion marks (under this lock) before it touches the catalog.
            if not self._topic_alive():
                raise UnknownTopic("the topic was deleted")
            self._writer_in_live_topic = True
        return int(end), None if segment is None else int(segment), int(size or 0)

    def _write_batch(
        self,
        conn: sqlite3.Connection,
        segment: int | None,
        pos: int,
        base: int,
        values: Sequence[bytes],
        state: dict[str, bytes],
    ) -> tuple[int, int]:
        """Write and fdatasync the group's batch, then index it (committed by the caller).

        Returns the segment's descriptor and the batch's position in it.
        """
        ts = now_ms()
        pieces = encode_batch(base, ts, values, state)
        batch_len = sum(map(len, pieces))
        new_segment = segment is None or (pos > 0 and pos + batch_len > self.segment_bytes)
        batch = _Batch(base, ts, pieces, batch_len, len(values), state)
        try:
            return self._write_batch_at(conn, segment, pos, batch, new_segment)
        except _OverFileSizeLimit:
            if new_segment:
                raise _file_size_limit(batch_len) from None
        # The segment reached the process's file-size limit (ulimit -f, LimitFSIZE): the batch
        # goes into a new segment, as it would at segment_bytes.
        log.warning(
            "%s: segment %d stops at %d bytes, the file-size limit of this process; "
            "rolling to a new segment (lower segment_bytes, or raise the limit)",
            self.directory,
            segment,
            pos,
        )
        try:
            return self._write_batch_at(conn, segment, pos, batch, True)
        except _OverFileSizeLimit:
            raise _file_size_limit(batch_len) from None

    def _write_batch_at(
        self,
        conn: sqlite3.Connection,
        segment: int | None,
        pos: int,
        batch: _Batch,
        new_segment: bool,
    ) -> tuple[int, int]:
        """:meth:`_write_batch` into the active segment, or a new one (``new_segment``);
        :class:`_OverFileSizeLimit` if the segment would outgrow the file-size limit."""
        base, ts, pieces, batch_len = batch.base, batch.ts, batch.pieces, batch.length
        if new_segment:
            # Files no index row names were never acknowledged (see _recover_locked).
            self._remove_unindexed_segments(conn)
            segment, pos = base, 0
            conn.execute(
                "INSERT INTO segments (base_offset, size_bytes, max_ts, created_ms) "
                "VALUES (?, 0, ?, ?)",
                (segment, ts, ts),
            )
        assert segment is not None
        fd = self._segment_write_fd(segment)
        try:
            if crash_points.armed("torn-segment-write"):
                head = b"".join(pieces)[: batch_len // 2]
                os.pwrite(fd, head, pos)
                crash_points.reach("torn-segment-write")
            try:
                written = os.pwritev(fd, pieces, pos)
            except OSError as exc:
                if exc.errno == errno.EFBIG:
                    raise _OverFileSizeLimit from None
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                written = -1
            if written != batch_len:
                # The file system took what fit (or nothing): full, a quota reached, or the
                # file-size limit, which a short write does not tell: the rest's write does.
                if written >= 0 and _over_file_size_limit(fd, pos + written):
                    os.ftruncate(fd, pos)
                    raise _OverFileSizeLimit
                raise self._no_space(fd, pos, batch_len)
            # The one durable sync of the group commit: after it the batch is the truth.
            os.fdatasync(fd)
            if new_segment:
                fsync_directory(self.directory)
                crash_points.reach("after-segment-roll")
            crash_points.reach("after-segment-write")
            _index_batch(conn, segment, pos, base, batch.count, batch_len)
            conn.execute(
                "UPDATE segments SET size_bytes = ?, max_ts = ? WHERE base_offset = ?",
                (pos + batch_len, ts, segment),
            )
            conn.execute(
                "UPDATE meta SET value = ? WHERE key = 'end_offset'", (base + batch.count,)
            )
            if batch.state:
                _put_state(conn, batch.state)
        except BaseException:
            # Not acknowledged: do not leave it for recovery to find.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, pos)
            raise
        return fd, pos

    def _no_space(self, fd: int, pos: int, batch_len: int) -> StoreFull:
        """What a batch that did not fit says: how much it needs, how much is free."""
        with contextlib.suppress(OSError):
            os.ftruncate(fd, pos)  # free what part of it was written before looking
        try:
            fs = os.fstatvfs(fd)
            free, total = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
        except OSError:
            free, total = 0, batch_len
        if batch_len > total:
            # Not a shortage: other writes fit, so the store stays ready.
            outlook = (
                f"it can never fit: the file system holds {total} bytes in all; send less "
                "per request"
            )
        else:
            outlook = "it is taken once space is freed (retention, fewer topics, a larger disk)"
            if self._on_no_space is not None:
                self._on_no_space(batch_len)
        return StoreFull(
            "no space left on the data directory's file system: the write needs "
            f"{batch_len} bytes, {free} are free; nothing of it was kept, and {outlook}",
            batch_len,
            free,
            total,
        )

    # -- recovery -------------------------------------------------------------------------
    def _recover_at_open(self) -> None:
        """Bring the index and state area up to the segments, if a crash left them behind."""
        if self._index_matches_segments():
            return
        conn = connect(self._db_path, durable=False, create=False)
        try:
            with self._write_lock():
                conn.execute("BEGIN IMMEDIATE")
                self._recover_locked(conn, scan_directory=True)
                conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise as_store_unavailable(exc) or exc from exc
        finally:
            conn.close()
        self.notify_changed()

    def _check_tail_read_only(self) -> None:
        """A read-only view refuses, as a writer's recovery would, a partition whose newest
        indexed segment is shorter than its index says (or gone): acknowledged data is
        missing.  Data past the index is left alone: a writer may be appending it."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT base_offset, size_bytes FROM segments ORDER BY base_offset DESC LIMIT 1"
            ).fetchone()
        if row is None:
            return
        last, indexed_size = row
        path = self.directory / segment_file_name(last)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            if indexed_size == 0:
                return
            raise self._damaged(
                f"segment {path.name} is missing; its index holds {indexed_size} bytes of it"
            ) from None
        if size < indexed_size:
            raise self._damaged(
                f"segment {path.name} holds {size} bytes, fewer than the {indexed_size} its "
                "index says were written and synced: acknowledged data is missing"
            )

    def _index_matches_segments(self) -> bool:
        """True if every segment file is indexed and the newest is as long as its index says."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT base_offset, size_bytes FROM segments ORDER BY base_offset"
            ).fetchall()
        if set(_segment_files(self.directory)) != {base for base, _ in rows}:
            return False
        if not rows:
            return True
        last, size = rows[-1]
        try:
            return (self.directory / segment_file_name(last)).stat().st_size == size
        except FileNotFoundError:
            return size == 0

    def _recover_locked(self, conn: sqlite3.Connection, *, scan_directory: bool) -> None:
        """Replay the batches past the index into it; drop what no batch can be made of.

        Runs under the write lock, inside the caller's transaction.  The newest indexed
        segment is read on from its indexed end; then segment files that the index does not
        know yet are taken in offset order while each starts where the log ends (a roll
        whose index commit was lost), and any other unindexed file is removed: no index row
        names it and no batch of it follows on, so nothing in it was acknowledged.
        """
        end = int(conn.execute("SELECT value FROM meta WHERE key = 'end_offset'").fetchone()[0])
        rows = conn.execute("SELECT base_offset, size_bytes FROM segments ORDER BY base_offset")
        indexed = dict(rows.fetchall())
        last = max(indexed) if indexed else None
        if last is not None:
            end = self._replay_segment(conn, last, indexed[last], end)
        if not scan_directory:
            return
        for base in sorted(set(_segment_files(self.directory)) - set(indexed)):
            if base == end and (last is None or base > last):
                ts = now_ms()
                conn.execute(
                    "INSERT INTO segments (base_offset, size_bytes, max_ts, created_ms) "
                    "VALUES (?, 0, ?, ?)",
                    (base, ts, ts),
                )
                replayed_to = self._replay_segment(conn, base, 0, end)
                if replayed_to > end or _segment_size(conn, base) > 0:
                    end, last = replayed_to, base
                    continue
                conn.execute("DELETE FROM segments WHERE base_offset = ?", (base,))
            self._remove_segment_file(base)

    def _replay_segment(
        self,
        conn: sqlite3.Connection,
        segment: int,
        indexed_size: int,
        end: int,
        *,
        cut: bool = True,
    ) -> int:
        """Index the whole batches of ``segment`` past ``indexed_size``; the new end offset.

        What follows them is cut off, or, without ``cut``, refused as damage."""
        path = self.directory / segment_file_name(segment)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            if indexed_size == 0:
                return end
            raise self._damaged(
                f"segment {path.name} is missing; its index holds {indexed_size} bytes of it"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if size < indexed_size:
                raise self._damaged(
                    f"segment {path.name} holds {size} bytes, fewer than the {indexed_size} its "
                    "index says were written and synced: acknowledged data is missing"
                )
            pos = indexed_size
            batches = 0
            try:
                for batch in scan_tail(fd, pos, end):
                    header = batch.header
                    _index_batch(
                        conn, segment, batch.pos, header.base_offset, header.count, header.size
                    )
                    _put_state(conn, batch.state)
                    pos = batch.pos + batch.header.size
                    end = batch.header.next_offset
                    conn.execute(
                        "UPDATE segments SET size_bytes = ?, max_ts = ? WHERE base_offset = ?",
                        (pos, batch.header.timestamp_ms, segment),
                    )
                    batches += 1
            except DamagedSegment as exc:
                raise self._damaged(f"segment {path.name}: {exc}") from exc
            if size > pos and not cut:
                raise self._damaged(
                    f"segment {path.name}: the batch at byte {pos} is not whole or fails its "
                    "checksum, and the segment goes on after it"
                )
            if batches:
                conn.execute("UPDATE meta SET value = ? WHERE key = 'end_offset'", (end,))
                log.warning(
                    "%s: recovered %d batches past the index, up to offset %d",
                    path,
                    batches,
                    end,
                )
            if size > pos:
                log.warning("%s: cut %d bytes of an unfinished batch", path, size - pos)
                os.ftruncate(fd, pos)
        finally:
            os.close(fd)
        return end

    def _remove_unindexed_segments(self, conn: sqlite3.Connection) -> None:
        indexed = {row[0] for row in conn.execute("SELECT base_offset FROM segments")}
        for base in set(_segment_files(self.directory)) - indexed:
            self._remove_segment_file(base)

    def _remove_segment_file(self, base: int) -> None:
        """Remove an unindexed segment file, and this writer's descriptor of it."""
        if self._write_fd is not None and self._write_fd[0] == base:
            os.close(self._write_fd[1])
            self._write_fd = None
        self._forget_segment(base)

    def _release_writer(self) -> None:
        self._reset_writer()
        for name in ("_lock_fd", "_notify_fd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def _reset_writer(self) -> None:
        if self._writer is not None:
            # A broken connection is replaced either way.
            with contextlib.suppress(sqlite3.Error):
                self._writer.close()
            self._writer = None
        if self._write_fd is not None:
            os.close(self._write_fd[1])
            self._write_fd = None

    def _segment_write_fd(self, segment: int) -> int:
        if self._write_fd is not None:
            if self._write_fd[0] == segment:
                return self._write_fd[1]
            os.close(self._write_fd[1])
            self._write_fd = None
        fd = os.open(self.directory / segment_file_name(segment), os.O_RDWR | os.O_CREAT, 0o644)
        self._write_fd = (segment, fd)
        return fd

    # -- reads ----------------------------------------------------------------------------
    def bounds(self) -> tuple[int, int]:
        """(log start offset, end offset) as last committed."""
        with self._conn() as conn:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if meta["deleted"]:
            raise UnknownTopic("the topic was deleted")
        return int(meta["log_start_offset"]), int(meta["end_offset"])

    def read(self, offset: int, max_bytes: int) -> ReadResult:
        if offset < 0:
            start, end = self.bounds()
            raise OffsetOutOfRange(f"offset {offset} is negative", start, end)
        max_bytes = max(1, max_bytes)
        for _attempt in range(3):
            with self._conn() as conn:
                conn.execute("BEGIN")
                meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
                start, end = int(meta["log_start_offset"]), int(meta["end_offset"])
                if meta["deleted"]:
                    conn.execute("COMMIT")
                    raise UnknownTopic("the topic was deleted")
                if offset < start:
                    conn.execute("COMMIT")
                    raise OffsetOutOfRange(
                        f"offset {offset} is below the log start offset {start}", start, end
                    )
                if offset >= end:
                    conn.execute("COMMIT")
                    return ReadResult([], start, end)
                self._segments.forget_below(start)
                rows = conn.execute(
                    "SELECT base_offset, segment, pos, length FROM batches WHERE base_offset >= "
                    "(SELECT max(base_offset) FROM batches WHERE base_offset <= ?) "
                    "ORDER BY base_offset LIMIT ?",
                    (offset, _READ_INDEX_ROWS),
                ).fetchall()
                conn.execute("COMMIT")
            try:
                records = self._read_records(rows, offset, max_bytes)
            except FileNotFoundError:
                continue  # retention dropped the segment under us; look again
            except CorruptBatch:
                records = self._read_up_to_damage(rows, offset, max_bytes, start, end)
            return ReadResult(records, start, end)
        start, end = self.bounds()
        raise OffsetOutOfRange(f"offset {offset} is below the log start offset {start}", start, end)

    def _read_records(
        self, rows: list[tuple[int, int, int, int]], offset: int, max_bytes: int
    ) -> list[Record]:
        """The records from ``offset`` on in the batches ``rows`` point at, about ``max_bytes``
        of values, each batch checked against its CRC (or, for part of a batch read whole
        lately, the bytes read checked against its marks)."""
        records: list[Record] = []
        while rows:
            part = self._read_part(rows[0], offset, max_bytes, at_least_one=not records)
            if part is None:
                break
            got, taken, done = part
            records += got
            max_bytes -= taken
            rows = rows[1:]
            if not done or max_bytes <= 0:
                return records
        if not rows:
            return records
        data = self._read_runs(rows, max_bytes)

        def partly_read(n: int, buf: bytes, at: int, header: BatchHeader) -> None:
            # the next read starts inside this batch: it reads only its part, checked
            # against these marks
            _, segment, pos, length = rows[n]
            if length == header.size:
                self._checked.remember(segment, pos, header, crc_marks(buf, at, header))

        more, _ = decode_batches(
            data,
            offset,
            max_bytes,
            expected_base=rows[0][0],
            at_least_one=not records,
            partly_read=partly_read,
        )
        return records + more

    def _read_part(
        self,
        row: tuple[int, int, int, int],
        offset: int,
        max_bytes: int,
        *,
        at_least_one: bool,
    ) -> tuple[list[Record], int, bool] | None:
        """The records a read from ``offset`` takes from the batch ``row`` points at, if the
        batch was read whole lately (its ``CrcMarks`` known) or holds large values; None for
        others (read with their neighbours in one run by ``_read_runs``).

        A batch read whole lately is read only around the records this read takes, and those
        bytes are checked against its marks: a read that starts inside a batch, or takes only
        part of one, does not read and check the whole batch again (a 16 MiB fetch of 8 MiB
        batches would read each two or three times), yet bytes changed on disk since are
        refused, never served.  A batch of large values is otherwise read and checked value by
        value, each into its own bytes: no copy out of a read of the whole batch and no copy of
        the batch for its CRC.
        Returns the records, their value bytes and whether the read may go on to the next batch.
        """
        base, segment, pos, length = row
        head = self._pread(segment, pos, min(length, _HEAD_READ))
        if head[:4] != MAGIC:
            return None  # an older batch (or no batch): the whole-batch path reads it
        header = parse_header(head)
        if header.base_offset != base:
            raise CorruptBatch(f"batch of offset {header.base_offset} found where {base} was due")
        if header.size != length:
            return None  # the whole-batch path says what is wrong
        marks = self._checked.marks(segment, pos, header)
        if marks is not None:
            return self._read_marked(row, head, header, marks, offset, max_bytes, at_least_one)
        if not has_large_values(header):
            return None
        lengths = value_lengths(head, header)
        if lengths is None:
            head = self._pread(segment, pos, values_at(header))
            lengths = value_lengths(head, header)
            assert lengths is not None
        first, stop, taken = take_values(
            header, lengths, offset, max_bytes, at_least_one=at_least_one
        )
        done = stop == header.count
        if stop == first and not done:
            return [], 0, False  # its first record does not fit: the next read starts here
        values = []
        at = pos + values_at(header)
        for n in lengths:
            values.append(self._pread(segment, at, n))
            at += n
        self._checked.remember(segment, pos, header, check_pieces(head, header, values))
        ts = header.timestamp_ms
        return [Record(base + i, values[i], ts) for i in range(first, stop)], taken, done

    def _read_marked(
        self,
        row: tuple[int, int, int, int],
        head: bytes,
        header: BatchHeader,
        marks: CrcMarks,
        offset: int,
        max_bytes: int,
        at_least_one: bool,
    ) -> tuple[list[Record], int, bool]:
        """``_read_part`` of a batch read whole lately: only the bytes around the header, the
        value lengths and the values taken are read, each span checked against ``marks``."""
        base, segment, pos, _ = row
        at = values_at(header)
        i, j = marks.span(8, at)
        lead = self._pread(segment, pos + marks.bounds[i], marks.bounds[j] - marks.bounds[i])
        marks.check(lead, i, j, base)
        if lead[: HEADER_SIZE - 8] != head[8:HEADER_SIZE]:
            raise CorruptBatch(f"batch of offset {base} changed while it was read")
        lengths_at = HEADER_SIZE + header.state_len - 8
        lengths = struct.unpack_from(f"<{header.count}I", lead, lengths_at)
        first, stop, taken = take_values(
            header, lengths, offset, max_bytes, at_least_one=at_least_one
        )
        done = stop == header.count
        if stop == first:
            return [], 0, done
        start = at + sum(lengths[:first])  # from the batch's start
        i, j = marks.span(start, start + taken)
        data = self._pread(segment, pos + marks.bounds[i], marks.bounds[j] - marks.bounds[i])
        marks.check(data, i, j, base)
        ends = list(accumulate(lengths[first:stop], initial=start - marks.bounds[i]))
        ts = header.timestamp_ms
        records = [
            Record(base + first + k, data[ends[k] : ends[k + 1]], ts) for k in range(stop - first)
        ]
        return records, taken, done

    def _read_up_to_damage(
        self,
        rows: list[tuple[int, int, int, int]],
        offset: int,
        max_bytes: int,
        start: int,
        end: int,
    ) -> list[Record]:
        """The records a read gets before the first batch of ``rows`` that fails its check;
        ``CorruptData`` if the read starts in that batch (every read from there on fails)."""
        for base, segment, pos, length in rows:
            try:
                data = self._pread(segment, pos, length)
                decode_batches(data, base, 0, expected_base=base, at_least_one=False)
            except CorruptBatch as exc:
                if base > offset:
                    good = [row for row in rows if row[0] < base]
                    return self._read_records(good, offset, max_bytes)
                raise CorruptData(f"corrupt segment data: {exc}", base, start, end) from exc
        # changed back under us (retention, a rewritten tail): the next read looks again
        return []

    def _read_runs(self, rows: list[tuple[int, int, int, int]], max_bytes: int) -> bytes:
        """Read the batches ``rows`` point at, stopping once ``max_bytes`` are covered."""
        chunks: list[bytes] = []
        run_segment = run_pos = run_len = -1
        total = 0
        for _base, segment, pos, length in rows:
            if segment == run_segment and pos == run_pos + run_len:
                run_len += length
            else:
                if run_segment >= 0:
                    chunks.append(self._pread(run_segment, run_pos, run_len))
                run_segment, run_pos, run_len = segment, pos, length
            total += length - HEADER_SIZE
            if total >= max_bytes:
                break
        if run_segment >= 0:
            chunks.append(self._pread(run_segment, run_pos, run_len))
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _pread(self, segment: int, pos: int, length: int) -> bytes:
        data = self._segments.pread(segment, segment_file_name(segment), pos, length)
        if len(data) != length:
            raise CorruptBatch(f"segment {segment} is shorter than its index says")
        return data

    def check_batches(self) -> list[str]:
        """Problems found checking every batch of every segment against its checksum, the
        batches that carry only state (which no read reads) included."""
        with self._conn() as conn:
            conn.execute("BEGIN")
            segments = conn.execute(
                "SELECT base_offset, size_bytes FROM segments ORDER BY base_offset"
            ).fetchall()
            rows = conn.execute(
                "SELECT segment, pos, base_offset FROM batches ORDER BY base_offset"
            )
            indexed: dict[int, list[tuple[int, int]]] = {}
            for segment, pos, base in rows.fetchall():
                indexed.setdefault(int(segment), []).append((int(pos), int(base)))
            conn.execute("COMMIT")
        problems: list[str] = []
        for segment, size in segments:
            try:
                fd = os.open(self.directory / segment_file_name(segment), os.O_RDONLY)
            except FileNotFoundError:
                if size:
                    problems.append(f"segment {segment} is missing; its index holds {size} bytes")
                continue
            try:
                problems += check_segment(fd, segment, size, indexed.get(segment, []))
            finally:
                os.close(fd)
        return problems

    def get_state(self, key: str) -> bytes | None:
        with self._conn() as conn:
            conn.execute("BEGIN")
            deleted = conn.execute("SELECT value FROM meta WHERE key = 'deleted'").fetchone()[0]
            row = conn.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
            conn.execute("COMMIT")
        if deleted:
            raise UnknownTopic("the topic was deleted")
        return None if row is None else bytes(row[0])

    def scan_state(self, prefix: str, after: str, limit: int) -> list[tuple[str, bytes]]:
        """Up to ``limit`` keys starting with ``prefix`` and above ``after``, in key order."""
        if not prefix:
            raise ValueError("a state scan needs a prefix")
        # every key starting with the prefix sorts between it and its successor
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT key, value FROM state WHERE key >= ? AND key > ? AND key < ? "
                "ORDER BY key LIMIT ?",
                (prefix, after, end, limit),
            ).fetchall()
        return [(str(key), bytes(value)) for key, value in rows]

    def info(self, partition: int) -> PartitionInfo:
        with self._conn() as conn:
            conn.execute("BEGIN")
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            size, count = conn.execute(
                "SELECT coalesce(sum(size_bytes), 0), count(*) FROM segments"
            ).fetchone()
            conn.execute("COMMIT")
        return PartitionInfo(
            partition, int(meta["log_start_offset"]), int(meta["end_offset"]), int(size), count
        )

    # -- waiting --------------------------------------------------------------------------
    def notify_changed(self) -> None:
        with self._change:
            self._change_seq += 1
            self._change.notify_all()
        if self.on_changed is not None:
            self.on_changed()

    def wait_for_data(self, offset: int, timeout_s: float, can_watch: bool) -> bool:
        deadline = time.monotonic() + timeout_s
        # Without an inotify watch (not possible on this file system), fall back to polling.
        poll_s = None if can_watch else 0.05
        while True:
            with self._change:
                seen = self._change_seq
            if self.bounds()[1] > offset:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._change:
                if self._change_seq == seen:
                    self._change.wait(remaining if poll_s is None else min(poll_s, remaining))

    # -- retention ------------------------------------------------------------------------
    def drop_segments(
        self, *, below_offset: int | None, before_ms: int | None, max_bytes: int | None
    ) -> int:
        """Drop the oldest whole segments that match; never the active one.  New start offset."""
        conn = connect(self._db_path, create=False)
        try:
            with self._guarded("a retention pass"), self._write_lock():
                conn.execute("BEGIN IMMEDIATE")
                segments = conn.execute(
                    "SELECT base_offset, size_bytes, max_ts FROM segments ORDER BY base_offset"
                ).fetchall()
                start = conn.execute(
                    "SELECT value FROM meta WHERE key = 'log_start_offset'"
                ).fetchone()[0]
                dropped, new_start = _segments_to_drop(
                    segments, int(start), below_offset, before_ms, max_bytes
                )
                if dropped:
                    conn.execute("DELETE FROM batches WHERE base_offset < ?", (new_start,))
                    conn.execute("DELETE FROM segments WHERE base_offset < ?", (new_start,))
                    conn.execute(
                        "UPDATE meta SET value = ? WHERE key = 'log_start_offset'", (new_start,)
                    )
                conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise as_store_unavailable(exc) or exc from exc
        finally:
            conn.close()
        for base in dropped:
            self._forget_segment(base)
        self.remove_orphan_segments()
        return new_start

    def _forget_segment(self, base: int) -> None:
        self._segments.forget(base)
        # Another process may have dropped it first.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / segment_file_name(base))

    def remove_orphan_segments(self) -> None:
        """Delete segment files below the log start (left by a crash during retention).

        The log start offset is always the base of a live segment, so every file below it is
        a segment whose index rows are already gone.
        """
        start, _ = self.bounds()
        for path in self.directory.glob("*.log"):
            if path.stem.isdigit() and int(path.stem) < start:
                self._forget_segment(int(path.stem))

    def mark_deleted(self) -> None:
        """Refuse every later append and read, in every process (checked under the lock)."""
        try:
            conn = connect(self._db_path, create=False)
        except sqlite3.Error as exc:
            raise as_store_unavailable(exc) or exc from exc
        try:
            with self._guarded("a topic's deletion"), self._write_lock():
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE meta SET value = 1 WHERE key = 'deleted'")
                conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise as_store_unavailable(exc) or exc from exc
        finally:
            conn.close()

    def close(self, *, deleted: bool = False) -> None:
        """Stop taking appends, commit what is queued, and let go of every file."""
        with self._cond:
            self._closed = True
            self._deleted = deleted
            committer = self._committer
            self._cond.notify_all()
        if committer is not None and committer is not threading.current_thread():
            # Each commit is bounded by the busy timeout, so this wait is bounded too.
            committer.join()
        with self._commit_mutex:
            self._release_writer()
        with self._pool_lock:
            pool, self._pool = self._pool, []
        for conn in pool:
            conn.close()
        self._segments.close()


def _segments_to_drop(
    segments: list[tuple[int, int, int]],
    start: int,
    below_offset: int | None,
    before_ms: int | None,
    max_bytes: int | None,
) -> tuple[list[int], int]:
    """Which of the oldest segments retention drops, and the log start offset after it.

    Segments go oldest first and only while every older one goes too; the newest (active)
    segment always stays, so the log start offset is always the base of a live segment.
    """
    total = sum(size for _, size, _ in segments)
    dropped: list[int] = []
    new_start = start
    for i, (base, size, max_ts) in enumerate(segments[:-1]):
        next_base = segments[i + 1][0]
        expired = (
            (below_offset is not None and next_base <= below_offset)
            or (before_ms is not None and max_ts < before_ms)
            or (max_bytes is not None and total > max_bytes)
        )
        if not expired:
            break
        dropped.append(base)
        total -= size
        new_start = next_base
    return dropped, new_start


def _segment_size(conn: sqlite3.Connection, segment: int) -> int:
    row = conn.execute("SELECT size_bytes FROM segments WHERE base_offset = ?", (segment,))
    return int(row.fetchone()[0])


def _segment_files(directory: Path) -> list[int]:
    """Base offsets of the segment files in ``directory``."""
    return [
        int(name[:-4])
        for name in os.listdir(directory)
        if name.endswith(".log") and name[:-4].isdigit()
    ]


def has_segment_files(directory: Path) -> bool:
    """Whether ``directory`` exists and holds a segment file."""
    try:
        return bool(_segment_files(directory))
    except FileNotFoundError:
        return False


def _index_batch(
    conn: sqlite3.Connection, segment: int, pos: int, base: int, count: int, length: int
) -> None:
    """Index a batch's records; a batch of state updates only has no records to find."""
    if count:
        conn.execute(
            "INSERT INTO batches (base_offset, last_offset, segment, pos, length) "
            "VALUES (?, ?, ?, ?, ?)",
            (base, base + count - 1, segment, pos, length),
        )


def _put_state(conn: sqlite3.Connection, state: dict[str, bytes]) -> None:
    """Upsert ``state``: many rows per statement, since each statement step costs a GIL trip.

    An empty value deletes its key (recovery replays a batch's deletions the same way)."""
    gone = [key for key, value in state.items() if not value]
    for i in range(0, len(gone), 2 * _UPSERT_ROWS):
        keys = gone[i : i + 2 * _UPSERT_ROWS]
        conn.execute(f"DELETE FROM state WHERE key IN ({', '.join('?' * len(keys))})", keys)
    items = [item for item in state.items() if item[1]]
    for i in range(0, len(items), _UPSERT_ROWS):
        part = items[i : i + _UPSERT_ROWS]
        conn.execute(
            "INSERT INTO state (key, value) VALUES "
            + ", ".join(["(?, ?)"] * len(part))
            + " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [x for item in part for x in item],
        )
