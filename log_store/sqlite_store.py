"""The embedded log store: a catalog of topics plus one ``PartitionLog`` per partition.

Layout under the data dir::

    catalog.db                                 topics, topic-level state and the installation
                                               id (SQLite, WAL)
    topics/<name>/<topic_id>/<partition>/      one partition (see sqlite_partition.py)

Putting the topic id in the path means a topic deleted and created again starts from empty
directories, whatever another process still has open.

A store opened with ``read_only=True`` reads through ``mode=ro`` SQLite connections and creates,
changes and touches nothing: no directory, no schema, no notify file (those are the gateway's).
Every method that would write raises :class:`ReadOnlyStore`.  Spark executors read this way.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from log_store import crash_points
from log_store.append_followers import AppendFollowers
from log_store.change_watch import ChangeWatcher, Following
from log_store.data_dir_kind import EMBEDDED, FORMAT_VERSION, refuse_newer_format, refuse_other_dc
from log_store.durable_dirs import fsync_directory, make_directories
from log_store.errors import (
    BadRequest,
    CatalogLost,
    CorruptData,
    LogbrokerError,
    PartitionDamaged,
    ReadOnlyStore,
    StoreFull,
    StoreUnavailable,
    TopicDeleted,
    TopicExists,
    UnknownPartition,
    UnknownTopic,
)
from log_store.failures import as_store_unavailable, causes, is_no_space
from log_store.interface import (
    AppendResult,
    PartitionInfo,
    PartitionState,
    ReadResult,
    StoreCapabilities,
    TopicConfig,
    TopicInfo,
    TransactionFn,
    retention_after,
)
from log_store.partition_damage import DamagedPartitions, files_stamp
from log_store.partition_handles import DEFAULT_MAX_OPEN_PARTITIONS, PartitionHandles
from log_store.sqlite_partition import (
    PartitionLog,
    connect,
    connect_read_only,
    has_segment_files,
    now_ms,
)
from log_store.topic_names import validate_topic_name
from log_store.write_guard import DEFAULT_STALL_AFTER_S, WriteGuard

_CATALOG_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY,
    topic_id TEXT NOT NULL UNIQUE,
    partitions INTEGER NOT NULL,
    retention_ms INTEGER,
    retention_bytes INTEGER,
    segment_bytes INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS topic_state (
    topic_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (topic_id, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS installation (id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS deletions (topic_id TEXT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS data_dir (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_MAKE_INSTALLATION_ID = """
BEGIN IMMEDIATE;
INSERT INTO installation (id) SELECT lower(hex(randomblob(16)))
    WHERE NOT EXISTS (SELECT 1 FROM installation);
COMMIT;
"""
"""Run once per data dir, in a write transaction: gateway workers open the catalog at once."""

_FORMAT_KEY, _KIND_KEY, _DC_KEY = "format", "kind", "dc"
"""What the catalog's ``data_dir`` table records (see :mod:`log_store.data_dir_kind`)."""

T = TypeVar("T")
_log = logging.getLogger(__name__)

MAX_PARTITIONS = 1024
_SQL_VARIABLES = 900  # keys per IN (...) list, below SQLite's smallest variable limit
MIN_SEGMENT_BYTES = 4096
_COUNT_BYTES = 8
_READY_MIN_FREE_BYTES = 1024 * 1024
"""Below this much free space the store is not ready (``readiness``): a write would fail."""
_CATALOG_CHECKPOINT_S = 5.0
"""At most this often is the catalog checkpointed after new pins (see ``_checkpoint_catalog``)."""
_DELETING_SUFFIX = ".deleting"
"""A deleted topic's directory is renamed to end so before it is removed: a crash halfway
through the removal leaves nothing that looks like a topic's data."""
_UNMADE_POLL_S = 0.05
"""How often a reader waiting on a partition no write has made yet looks for it."""
RESERVE_FILE = "space-reserve"
_RESERVE_BYTES = 1024 * 1024
"""Kept in ``RESERVE_FILE`` and given back when a topic's deletion, a retention change or a
retention pass finds the disk full: freeing space must not need space first."""


def _check_config(config: TopicConfig) -> None:
    if not 1 <= config.partitions <= MAX_PARTITIONS:
        raise BadRequest(f"partitions must be 1..{MAX_PARTITIONS}, got {config.partitions}")
    if config.segment_bytes < MIN_SEGMENT_BYTES:
        raise BadRequest(f"segment_bytes must be at least {MIN_SEGMENT_BYTES}")
    for name in ("retention_ms", "retention_bytes"):
        value = getattr(config, name)
        if value is not None and value < 0:
            raise BadRequest(f"{name} must not be negative")


def _deleted_under_lease(topic: str) -> Callable[[], PartitionLog]:
    """The opener of a partition whose lease is held: it is open unless this process deleted
    its topic meanwhile (``delete_topic`` takes even partitions in use out of the open set)."""

    def deleted() -> PartitionLog:
        raise UnknownTopic(f"topic {topic!r} was deleted")

    return deleted


def _catalog_topic_ids(catalog: sqlite3.Connection) -> set[str]:
    """The topic ids a catalog names (none before its schema is made)."""
    if not catalog.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'topics'"
    ).fetchone():
        return set()
    return {str(row[0]) for row in catalog.execute("SELECT topic_id FROM topics")}


def _holds_data(topic_dir: Path) -> bool:
    """Whether a topic's directory holds data: a partition with segment files (every
    commit writes one) that no deletion marked."""
    try:
        partitions = os.listdir(topic_dir)
    except (FileNotFoundError, NotADirectoryError):
        return False
    for partition in partitions:
        path = topic_dir / partition
        if not has_segment_files(path):
            continue
        try:
            conn = sqlite3.connect(
                f"{(path / 'partition.db').absolute().as_uri()}?mode=rw", uri=True
            )
            try:
                row = conn.execute("SELECT value FROM meta WHERE key = 'deleted'").fetchone()
            finally:
                conn.close()
        except sqlite3.Error:
            return True  # no index (or an unreadable one) beside the segments: data
        if not row or not row[0]:
            return True
    return False


def _full_disk(what: str, needed_bytes: int, free_bytes: int, total_bytes: int) -> StoreFull:
    return StoreFull(
        f"the data directory's file system is full: {what}, {free_bytes} are free; nothing "
        "was kept, and it is taken once space is freed (retention, fewer topics, a larger disk)",
        needed_bytes,
        free_bytes,
        total_bytes,
    )


def _from_a_file_call(exc: BaseException) -> bool:
    """Whether ``exc`` is (or was raised from) what the OS or SQLite said."""
    return any(isinstance(cause, (OSError, sqlite3.Error)) for cause in causes(exc))


def _deleted_in_flight(topic: str) -> TopicDeleted:
    return TopicDeleted(f"topic {topic!r} was deleted while this operation was in flight")


def _append_all(values: Sequence[bytes]) -> TransactionFn:
    def fn(_state: PartitionState) -> Sequence[bytes]:
        return values

    return fn


class SqliteLogStore:
    """The partitioned log on local disk.  See ``log_store.interface.LogStore``."""

    CATALOG = "catalog.db"

    @classmethod
    def exists_at(cls, data_dir: str | Path) -> bool:
        """Whether ``data_dir`` holds a store (opening one elsewhere would create it)."""
        return (Path(data_dir) / cls.CATALOG).is_file()

    capabilities = StoreCapabilities(dense_offsets=True, store_retention=True, segment_files=True)

    def __init__(
        self,
        data_dir: str | Path,
        *,
        read_only: bool = False,
        max_open_partitions: int = DEFAULT_MAX_OPEN_PARTITIONS,
        stall_after_s: float = DEFAULT_STALL_AFTER_S,
        dc: str | None = None,
    ) -> None:
        """Open (or make) the store.  ``dc``: the DC the opening gateway serves; recorded by
        the first such open, and a store recorded for another DC is refused
        (:class:`ForeignDataDir`), as is one of a newer format than this release's."""
        self.data_dir = Path(data_dir)
        self.read_only = read_only
        self._identity: dict[str, str] = {}
        try:
            self._catalog = self._open_catalog()
        except StoreUnavailable:
            # A full disk: opening the catalog (its WAL index) needs a little space, and the
            # operator's way out (``logbroker topics delete``) needs the store open.
            if read_only or not self._give_back_reserve():
                raise
            self._catalog = self._open_catalog()
        try:
            self._guard = None if read_only else WriteGuard(self.data_dir, stall_after_s)
        except OSError as exc:
            self._catalog.close()  # nobody gets this store to close
            raise as_store_unavailable(exc) or exc from exc
        if not read_only:
            self._keep_reserve()
        self._catalog_lock = threading.RLock()
        self._topics: dict[str, TopicInfo] = {}
        self._handles = PartitionHandles(max_open_partitions, self._on_close)
        self._watcher = ChangeWatcher()
        self._watched: dict[tuple[str, int], Following] = {}
        self._append_followers = AppendFollowers(
            self._watcher, self.data_dir / "topics", self._topic_id_now
        )
        self._damaged = DamagedPartitions()
        """Partitions found damaged (see ``damaged_partitions``), refused from memory."""
        self._finishing_lock = threading.Lock()
        self._catalog_checkpointed = time.monotonic()
        self._short_of_space: int | None = None
        """The size of the largest write that did not fit (0: a write of unknown size, such as
        SQLite's own pages), until that much is free again."""
        self._finishing: set[str] = set()
        """Ids of topics whose cut-short deletion this process is finishing, under
        ``_finishing_lock``."""
        if not read_only:
            try:
                self._finish_deletions()
                self._record_identity(dc)
            except BaseException:
                self.close()
                raise

    def _read_identity(self, catalog: sqlite3.Connection) -> None:
        """Read what the catalog records of the data dir; refuse a newer format."""
        if catalog.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'data_dir'"
        ).fetchone():
            self._identity = {
                str(k): str(v) for k, v in catalog.execute("SELECT key, value FROM data_dir")
            }
        found = self._identity.get(_FORMAT_KEY)
        refuse_newer_format(self.data_dir, int(found) if found and found.isdigit() else None)

    def _record_identity(self, dc: str | None) -> None:
        """Record the format, kind and (given one) DC where nothing is recorded yet (a new
        store, or one of an older release: adopted); refuse a store of another DC."""
        steps: list[tuple[str, tuple[object, ...]]] = [
            (
                "INSERT OR IGNORE INTO data_dir VALUES (?, ?)",
                (_FORMAT_KEY, str(FORMAT_VERSION)),
            ),
            ("INSERT OR IGNORE INTO data_dir VALUES (?, ?)", (_KIND_KEY, EMBEDDED)),
        ]
        if dc is not None:
            steps.append(("INSERT OR IGNORE INTO data_dir VALUES (?, ?)", (_DC_KEY, dc)))
        if self._identity.get(_FORMAT_KEY) is None:
            _log.info("%s: recording the store's format (%d)", self.data_dir, FORMAT_VERSION)
        if self._identity.get(_FORMAT_KEY) is None or (
            dc is not None and self._identity.get(_DC_KEY) is None
        ):
            self._catalog_write(steps)
            with self._catalog_lock:
                self._identity = {
                    str(k): str(v)
                    for k, v in self._catalog.execute("SELECT key, value FROM data_dir")
                }
        recorded = self._identity.get(_DC_KEY)
        if dc is not None and recorded is not None:
            refuse_other_dc(self.data_dir, EMBEDDED, recorded, dc)

    @property
    def recorded_dc(self) -> str | None:
        """The DC the first gateway on this store served (None: none recorded yet)."""
        return self._identity.get(_DC_KEY)

    def _open_catalog(self) -> sqlite3.Connection:
        try:
            if self.read_only:
                if not self.exists_at(self.data_dir):
                    raise ReadOnlyStore(f"{self.data_dir} holds no logbroker store to read")
                ro = connect_read_only(self.data_dir / self.CATALOG)
                try:
                    self._read_identity(ro)
                except BaseException:
                    ro.close()
                    raise
                return ro
            make_directories(self.data_dir)
            new_catalog = not (self.data_dir / self.CATALOG).exists()
            if new_catalog:
                self._refuse_unknown_topics(lambda: set())  # before a catalog is made
            catalog = connect(self.data_dir / self.CATALOG)
            try:
                self._read_identity(catalog)
                if not new_catalog:
                    self._refuse_unknown_topics(lambda: _catalog_topic_ids(catalog))
                catalog.executescript(_CATALOG_SCHEMA)
                if catalog.execute("SELECT 1 FROM installation").fetchone() is None:
                    catalog.executescript(_MAKE_INSTALLATION_ID)
                if new_catalog:
                    fsync_directory(self.data_dir)  # the catalog's own entry
            except BaseException:
                catalog.close()
                raise
            return catalog
        except (OSError, sqlite3.Error) as exc:
            raise as_store_unavailable(exc) or exc from exc

    def _refuse_unknown_topics(self, known_ids: Callable[[], set[str]]) -> None:
        """Raise :class:`CatalogLost` if ``topics/`` holds data of topics the catalog does
        not know (``known_ids``: the topic ids it names, read after the directories are
        listed, so a topic another process makes meanwhile is known by then)."""
        root = self.data_dir / "topics"
        try:
            names = sorted(os.listdir(root))
        except (FileNotFoundError, NotADirectoryError):
            return
        found: list[tuple[str, str]] = []
        for name in names:
            try:
                ids = os.listdir(root / name)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for topic_id in ids:
                if topic_id.endswith(_DELETING_SUFFIX):
                    # a deletion's leftover (a crash in the middle of its removal)
                    shutil.rmtree(root / name / topic_id, ignore_errors=True)
                    continue
                found.append((name, topic_id))
        if not found:
            return
        known = known_ids()
        unknown = [
            f"{name}/{topic_id}"
            for name, topic_id in found
            if topic_id not in known and _holds_data(root / name / topic_id)
        ]
        if not unknown:
            return
        shown = ", ".join(unknown[:3]) + (
            f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        )
        raise CatalogLost(
            f"data_dir {self.data_dir}: topics/ holds the data of {len(unknown)} topic(s) that "
            f"{self.CATALOG} does not know ({shown}): the catalog was lost or rolled back "
            "(a missing catalog.db or catalog.db-wal), and a gateway on it would take every "
            "acknowledged chunk again as new; restore catalog.db together with its "
            "catalog.db-wal from a copy (or, for a directory left by a deleted topic, "
            "remove that directory)"
        )

    def _checkpoint_catalog(self) -> None:
        """Copy the catalog's WAL into ``catalog.db`` (PASSIVE: waiting for nobody), so that
        the topics and pins do not live in the WAL alone: a copy or backup of ``*.db``, or a
        lost WAL, then still has them.  After topic changes, new pins (at most every
        ``_CATALOG_CHECKPOINT_S``) and at close; never per write."""
        self._catalog_checkpointed = time.monotonic()
        try:
            with self._catalog_lock:
                self._catalog.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:
            _log.warning("%s: checkpoint failed: %s", self.data_dir / self.CATALOG, exc)

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise ReadOnlyStore(f"{what}: the store at {self.data_dir} is open read-only")
        # A disk that has hung one write hangs the next: refuse at once (503 with Retry-After,
        # so a client fails over or waits) instead of queueing it behind the stuck one.
        problem = self._guard.stalled() if self._guard is not None else None
        if problem is not None:
            raise StoreUnavailable(f"log store unavailable: {problem}")

    # -- catalog --------------------------------------------------------------------------
    @contextlib.contextmanager
    def _catalog_transaction(self) -> Iterator[None]:
        """One immediate catalog transaction under the catalog lock: committed when the block
        ends (also by ``return``), rolled back when it raises (SQLite's I/O errors become
        :class:`StoreUnavailable`)."""
        with self._catalog_lock:
            try:
                if self._guard is not None:
                    self._guard.check()
                self._catalog.execute("BEGIN IMMEDIATE")
                yield
                self._catalog.execute("COMMIT")
            except BaseException as exc:
                if self._catalog.in_transaction:
                    self._catalog.execute("ROLLBACK")
                if is_no_space(exc):
                    self._note_no_space(0)
                raise as_store_unavailable(exc) or exc from exc

    def _catalog_write(self, sql_steps: list[tuple[str, tuple[object, ...]]]) -> None:
        with self._catalog_transaction():
            for sql, params in sql_steps:
                self._catalog.execute(sql, params)

    def _load_topic(self, name: str) -> TopicInfo:
        with self._catalog_lock:
            row = self._catalog.execute(
                "SELECT topic_id, partitions, retention_ms, retention_bytes, segment_bytes, "
                "created_ms FROM topics WHERE name = ?",
                (name,),
            ).fetchone()
        if row is None:
            self._topics.pop(name, None)
            raise UnknownTopic(f"unknown topic {name!r}")
        info = TopicInfo(
            name=name,
            topic_id=row[0],
            config=TopicConfig(
                partitions=row[1],
                retention_ms=row[2],
                retention_bytes=row[3],
                segment_bytes=row[4],
            ),
            created_ms=row[5],
        )
        self._topics[name] = info
        return info

    def _topic(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            validate_topic_name(name)
            info = self._load_topic(name)
        return info

    @contextmanager
    def _lease(
        self, topic: str, partition: int, *, create: bool = False
    ) -> Iterator[tuple[TopicInfo, PartitionLog]]:
        """The partition, open and in use while the ``with`` block runs (see
        :mod:`log_store.partition_handles`).

        A partition's files are made by its first write (``create``), not with its topic:
        one no process has written yet is lent as an empty read-only view and made by
        nothing else, so that listing, describing, reading and auditing never need space
        (a full disk must not stop them)."""
        info = self._topic(topic)
        if not isinstance(partition, int) or partition < 0:
            raise UnknownPartition(f"partition must be a non-negative integer, got {partition!r}")
        opening = self._handles.get((info.topic_id, partition)) is None
        try:
            if opening:
                # Opening a partition: never trust the cache for that, so that a topic deleted
                # (or deleted and created again) by another process is seen.
                info = self._load_topic(topic)
                if partition >= info.config.partitions:
                    raise UnknownPartition(
                        f"topic {topic!r} has partitions 0..{info.config.partitions - 1}, "
                        f"not {partition}"
                    )
                # Refused from memory while its files are as they were refused in: opening
                # it again would find the same damage, at some cost (partition_damage).
                refused = self._damaged.known(
                    topic, info.topic_id, partition, self._path(info, partition)
                )
                if refused is not None:
                    raise refused
                if (self.read_only or not create) and not self._made(info, partition):
                    # No process has written it yet: it reads as empty now, and is looked for
                    # again next time.
                    with self._view(topic, info, partition) as lent:
                        yield lent
                    return
            try:
                handle = self._handles.acquire(
                    (info.topic_id, partition),
                    lambda: self._reopen_partition(topic, info, partition),
                )
            except StoreUnavailable as exc:
                if create or isinstance(exc, PartitionDamaged) or not self._disk_full(exc):
                    raise
                # Opening it for writes recovers what a crash or a refused write left past
                # its index, which needs space: a reader reads what the index holds, as a
                # read-only store does.
                with self._view(topic, info, partition) as lent:
                    yield lent
                return
            if opening and self._damaged:
                self._damaged.restored(topic, partition)  # opened whole
            try:
                yield info, handle.log
            finally:
                self._handles.release(handle)
        except (OSError, sqlite3.Error, StoreUnavailable) as exc:
            # The files of a topic deleted meanwhile (by any process) go away under whoever
            # uses them: SQLite then says "disk I/O error" or "unable to open database file",
            # the OS ENOENT.  Said as what happened, the caller looks at the topic again.
            deleted = self._deleted_meanwhile(topic, info.topic_id)
            if deleted is None:
                if isinstance(exc, PartitionDamaged) and exc.topic and not opening:
                    # found while in use (an opening's refusal is noted by the opening)
                    self._damaged.note(exc, info.topic_id, self._path(info, partition), None)
                raise
            raise deleted from exc

    @contextmanager
    def _view(
        self, topic: str, info: TopicInfo, partition: int
    ) -> Iterator[tuple[TopicInfo, PartitionLog]]:
        """The partition read-only, for the ``with`` block only: it makes and changes no
        file (one that does not exist reads as empty)."""
        log = self._open_partition(info, partition, read_only=True)
        try:
            if not self._topic_alive(info.topic_id):
                # its files went with it, after our look at the catalog
                raise _deleted_in_flight(topic)
            yield info, log
        finally:
            log.close()

    def _deleted_meanwhile(self, topic: str, topic_id: str) -> TopicDeleted | None:
        """A :class:`TopicDeleted` if the topic ``topic_id`` has left the catalog (so a failure
        of its files was the deletion's doing, not the disk's), forgetting what this process
        holds of it; None if it is still there or the catalog cannot tell."""
        try:
            if self._topic_alive(topic_id):
                return None
        except sqlite3.Error:
            return None  # the catalog fails too: the disk's doing, said as such
        self._damaged.forget_topic(topic)  # gone from the catalog: so are its refusals
        self._forget_topic(topic)
        return _deleted_in_flight(topic)

    def _path(self, info: TopicInfo, partition: int) -> Path:
        return self.data_dir / "topics" / info.name / info.topic_id / str(partition)

    def _made(self, info: TopicInfo, partition: int) -> bool:
        """Whether a write made the partition: its database exists (it is made whole or not
        at all), or segment files whose database was lost (rebuilt by an open for writing,
        refused by a read-only one: never read as empty)."""
        path = self._path(info, partition)
        return (path / "partition.db").exists() or has_segment_files(path)

    def _reopen_partition(self, topic: str, known: TopicInfo, partition: int) -> PartitionLog:
        """Open a partition of the topic ``known`` names, if that topic is still the one."""
        info = self._load_topic(topic)
        if info.topic_id != known.topic_id:
            raise UnknownTopic(f"topic {topic!r} was deleted")
        path = self._path(info, partition)
        stamp = files_stamp(path)  # before it is opened: a change meanwhile is looked at
        try:
            log = self._open_partition(info, partition)
        except PartitionDamaged as exc:
            if exc.topic:
                self._damaged.note(exc, info.topic_id, path, stamp)
            raise
        try:
            alive = self._topic_alive(info.topic_id)
        except BaseException:
            log.close()  # nobody else gets it to close
            raise
        if not alive:
            # Deleted while it was being opened, maybe after its files were removed: what the
            # opening made again (directory, database) belongs to no topic.
            log.close()
            if not self.read_only:
                shutil.rmtree(self._path(info, partition).parent, ignore_errors=True)
            raise _deleted_in_flight(topic)
        return log

    def _open_partition(
        self, info: TopicInfo, partition: int, *, read_only: bool = False
    ) -> PartitionLog:
        topic_id = info.topic_id
        path = self._path(info, partition)
        made = read_only or self.read_only or self._made(info, partition)
        try:
            if self._guard is not None:
                # before the partition's directories are made again in a replaced data dir
                self._guard.check()
            log = PartitionLog(
                path,
                info.config.segment_bytes,
                lambda: self._topic_alive(topic_id),
                read_only=read_only or self.read_only,
                topic_id=topic_id,
                on_no_space=self._note_no_space,
                guard=self._guard,
                place=(info.name, partition),
                # a read-only store's own partitions; not a writable store's views of them
                check_tail=self.read_only and not read_only,
            )
        except (OSError, sqlite3.Error, StoreUnavailable) as exc:
            full = None if made else self._full_making(f"{info.name}/{partition}", exc)
            if full is not None:
                raise full from exc
            if isinstance(exc, StoreUnavailable):
                raise
            raise as_store_unavailable(exc) or exc from exc
        log.on_changed = functools.partial(self._append_followers.appended, info.name, partition)
        return log

    def _full_making(self, what: str, exc: BaseException) -> StoreFull | None:
        """The :class:`StoreFull` that making ``what``'s files on a full disk failed with, or
        None if the failure was not for space.  SQLite says "disk I/O error" when the file
        system cannot give its shared-memory file a page: the free space decides."""
        if not self._disk_full(exc):
            return None
        free, total = self._free_space()
        self._note_no_space(0)
        return _full_disk(f"making {what}'s files did not fit", 0, free or 0, total or 0)

    def _disk_full(self, exc: BaseException) -> bool:
        """Whether ``exc`` failed for space: said so, or a file operation failed while less
        is free than writes need (not damage found in the files, which no space mends)."""
        if is_no_space(exc):
            return True
        free, _total = self._free_space()
        return free is not None and free < _READY_MIN_FREE_BYTES and _from_a_file_call(exc)

    def _free_space(self) -> tuple[int | None, int | None]:
        """The bytes free and in all on the data directory's file system (None: unknown)."""
        try:
            fs = os.statvfs(self.data_dir)
        except OSError:
            return None, None
        return fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize

    def _on_close(self, key: tuple[str, int], log: PartitionLog) -> None:
        """A partition is closed to stay within the limit: stop watching its notify file."""
        self._unwatch(key)

    def _unwatch(self, key: tuple[str, int]) -> None:
        following = self._watched.pop(key, None)
        if following is not None:
            following.cancel()

    @property
    def open_partitions(self) -> int:
        """How many partitions this process holds open now."""
        return len(self._handles)

    def _topic_alive(self, topic_id: str) -> bool:
        with self._catalog_lock:
            row = self._catalog.execute(
                "SELECT 1 FROM topics WHERE topic_id = ?", (topic_id,)
            ).fetchone()
        return row is not None

    def _on_partition(self, topic: str, partition: int, op: Callable[[PartitionLog], T]) -> T:
        """Run ``op`` on the partition, looking again once if the topic we knew is gone."""
        try:
            with self._lease(topic, partition) as (info, log):
                try:
                    return op(log)
                except UnknownTopic as marked:
                    self._finish_deletion_met(topic, info.topic_id, partition, marked)
                    raise
        except UnknownTopic as exc:
            if self._forget_topic(topic) is None and not isinstance(exc, TopicDeleted):
                raise
            # Another process deleted the topic, and may have created it again.
            try:
                with self._lease(topic, partition) as (_, log):
                    return op(log)
            except UnknownTopic:
                if isinstance(exc, TopicDeleted):
                    raise exc from None  # "deleted while ... in flight" says more
                raise

    def _forget_topic(self, topic: str) -> TopicInfo | None:
        """Drop what this process knows of ``topic``; the next use reads the catalog."""
        info = self._topics.pop(topic, None)
        if info is None:
            return None
        for key, log in self._handles.pop_topic(info.topic_id):
            self._unwatch(key)
            # Closed on the side: this may run in the partition's own committer thread.
            threading.Thread(target=log.close, name="logbroker-close-stale", daemon=True).start()
        return info

    def create_topic(
        self, name: str, config: TopicConfig | None = None, *, exist_ok: bool = False
    ) -> TopicInfo:
        self._check_writable("create_topic")
        validate_topic_name(name)
        config = config or TopicConfig()
        _check_config(config)
        topic_id = uuid.uuid4().hex
        with self._catalog_transaction():
            exists = self._catalog.execute(
                "SELECT 1 FROM topics WHERE name = ?", (name,)
            ).fetchone()
            if not exists:
                free, total = self._free_space()
                if free is not None and total is not None and free < _READY_MIN_FREE_BYTES:
                    # Its partitions are made by their first writes, which would not fit:
                    # a topic no write can fill is not made (a client retrying new log
                    # types on a full disk would leave one behind per try).
                    raise _full_disk(
                        f"a new topic needs {_READY_MIN_FREE_BYTES} bytes free",
                        _READY_MIN_FREE_BYTES,
                        free,
                        total,
                    )
                self._catalog.execute(
                    "INSERT INTO topics VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        name,
                        topic_id,
                        config.partitions,
                        config.retention_ms,
                        config.retention_bytes,
                        config.segment_bytes,
                        now_ms(),
                    ),
                )
        if exists and not exist_ok:
            raise TopicExists(f"topic {name!r} exists")
        if not exists:
            self._checkpoint_catalog()
        return self._load_topic(name)

    def delete_topic(self, name: str) -> None:
        self._check_writable("delete_topic")
        self._freeing_space(lambda: self._delete_topic(name))

    def _delete_topic(self, name: str, topic_id: str | None = None) -> None:
        """Delete the topic ``name`` (only if its id is ``topic_id``, when given)."""
        info = self._load_topic(validate_topic_name(name))
        if topic_id is not None and info.topic_id != topic_id:
            raise UnknownTopic(f"topic {name!r} was deleted")
        # Under way here: a reader or writer of this process meeting the marks below before
        # the catalog row goes must not take it for a deletion cut short and start another
        # (``_finish_deletion_met``), which ran beside this one and, once a write had made
        # the topic again, fenced the new topic's partitions.
        with self._finishing_lock:
            mine = info.topic_id not in self._finishing
            self._finishing.add(info.topic_id)
        try:
            self._delete_topic_marked(name, info)
        finally:
            if mine:
                with self._finishing_lock:
                    self._finishing.discard(info.topic_id)

    def _delete_topic_marked(self, name: str, info: TopicInfo) -> None:
        # Recorded before the first mark: a crash between the marks and the catalog row's
        # removal leaves a deletion that the next open finishes (``_finish_deletions``).
        self._catalog_write(
            [
                (
                    "INSERT OR IGNORE INTO deletions SELECT topic_id, name FROM topics "
                    "WHERE topic_id = ?",
                    (info.topic_id,),
                )
            ]
        )
        # Fence every partition first, under its write lock, so that no process can ack an
        # append into files about to be removed: a writer that found the topic in the
        # catalog once trusts this mark from then on (PartitionLog._log_tail).
        marked, partitions = 0, info.config.partitions
        while marked < partitions:
            for p in range(marked, partitions):
                # made if no write made it yet: a writer of another process that makes it
                # meanwhile finds the mark (or the topic gone) before it acks
                with self._lease(name, p, create=True) as (leased, log):
                    if leased.topic_id != info.topic_id:
                        # deleted meanwhile (by another process) and made again by a write:
                        # the new topic is not this deletion's to fence
                        raise UnknownTopic(f"topic {name!r} was deleted")
                    log.mark_deleted()
                crash_points.reach("topic-deletion-marked")
            marked = partitions
            # more than marked: partitions were added meanwhile, marked too before it goes
            partitions = self._remove_from_catalog(info.topic_id, marked)
        self._checkpoint_catalog()
        self._topics.pop(name, None)
        self._damaged.forget_topic(name)
        for key, log in self._handles.pop_topic(info.topic_id):
            self._unwatch(key)
            log.close(deleted=True)
        where = self.data_dir / "topics" / name / info.topic_id
        deleting = where.with_name(where.name + _DELETING_SUFFIX)
        try:
            os.rename(where, deleting)
        except OSError:
            deleting = where  # never made (nothing written), or renamed by another process
        shutil.rmtree(deleting, ignore_errors=True)

    def _finish_deletions(self) -> None:
        """Finish each deletion a crash (or a killed process) cut short: its topic is still in
        the catalog, some of its partitions refuse every read and write.  Those the catalog
        recorded as begun (``deletions``), and, in a store an older release wrote (which kept
        no such record), any topic with a partition marked deleted."""
        with self._catalog_lock:
            begun = self._catalog.execute(
                "SELECT d.name, d.topic_id FROM deletions d JOIN topics t "
                "ON t.topic_id = d.topic_id AND t.name = d.name"
            ).fetchall()
        cut_short = {(str(name), str(topic_id)) for name, topic_id in begun}
        if self._identity.get(_FORMAT_KEY) is None:
            cut_short |= self._topics_with_marks()
        for name, topic_id in sorted(cut_short):
            self._finish_deletion(name, topic_id)

    def _topics_with_marks(self) -> set[tuple[str, str]]:
        """The topics in the catalog with a partition marked deleted (each partition's index
        is looked at: done once, when a store of an older release is adopted)."""
        with self._catalog_lock:
            rows = self._catalog.execute("SELECT name, topic_id, partitions FROM topics").fetchall()
        return {
            (str(name), str(topic_id))
            for name, topic_id, partitions in rows
            if any(self._marked_deleted(name, topic_id, p) for p in range(int(partitions)))
        }

    def _marked_deleted(self, name: str, topic_id: str, partition: int) -> bool:
        """Whether a deletion marked the partition (its index says so)."""
        db = self.data_dir / "topics" / name / topic_id / str(partition) / "partition.db"
        if not db.exists():
            return False
        try:
            conn = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True)
            try:
                row = conn.execute("SELECT value FROM meta WHERE key = 'deleted'").fetchone()
            finally:
                conn.close()
        except sqlite3.Error:
            return False  # an unreadable index is the partition's damage, said by its use
        return bool(row and row[0])

    def _finish_deletion(self, name: str, topic_id: str) -> None:
        """Delete the topic ``topic_id`` as ``delete_topic`` would, if it is still there."""
        _log.warning(
            "%s: the deletion of topic %r (id %s) was cut short by a process that stopped (or "
            "is under way in another one); finishing it",
            self.data_dir,
            name,
            topic_id,
        )
        try:
            self._freeing_space(lambda: self._delete_topic(name, topic_id))
        except UnknownTopic:
            pass  # finished by another process meanwhile
        except LogbrokerError as exc:
            _log.warning("%s: the deletion of topic %r failed: %s", self.data_dir, name, exc)
        finally:
            with self._finishing_lock:
                self._finishing.discard(topic_id)

    def _finish_deletion_met(
        self, topic: str, topic_id: str, partition: int, exc: BaseException | None
    ) -> None:
        """A write to a partition of the topic ``topic_id`` failed with ``exc``: if the
        partition is marked deleted while its topic is still in the catalog, the topic's
        deletion was cut short (or is under way in another process); finish it, on the side:
        the caller may be the partition's own committer thread, which a mark would wait for."""
        if self.read_only or not isinstance(exc, UnknownTopic) or isinstance(exc, TopicDeleted):
            return  # a read-only store (a loader's) leaves it to the gateway
        if not self._marked_deleted(topic, topic_id, partition):
            return  # the transaction's own refusal (a stale route, say), not a mark
        try:
            with self._catalog_lock:
                row = self._catalog.execute(
                    "SELECT 1 FROM topics WHERE name = ? AND topic_id = ?", (topic, topic_id)
                ).fetchone()
        except sqlite3.Error:
            return
        if row is None:
            return  # gone (and maybe made again under a new id): nothing left to finish
        with self._finishing_lock:
            if topic_id in self._finishing:
                return  # one finisher per topic, however many writes meet the marks
            self._finishing.add(topic_id)
        threading.Thread(
            target=self._finish_deletion,
            args=(topic, topic_id),
            name="logbroker-finish-deletion",
            daemon=True,
        ).start()

    def _remove_from_catalog(self, topic_id: str, marked: int) -> int:
        """Remove the topic from the catalog if it has no more than ``marked`` partitions;
        its partition count now (``marked`` once removed)."""
        with self._catalog_transaction():
            row = self._catalog.execute(
                "SELECT partitions FROM topics WHERE topic_id = ?", (topic_id,)
            ).fetchone()
            if row is not None and row[0] > marked:
                return int(row[0])
            self._catalog.execute("DELETE FROM topics WHERE topic_id = ?", (topic_id,))
            self._catalog.execute("DELETE FROM topic_state WHERE topic_id = ?", (topic_id,))
            self._catalog.execute("DELETE FROM deletions WHERE topic_id = ?", (topic_id,))
        return marked

    def set_partitions(self, name: str, count: int) -> TopicInfo:
        self._check_writable("set_partitions")
        info = self._load_topic(validate_topic_name(name))
        if count < info.config.partitions:
            raise BadRequest(
                f"topic {name!r} has {info.config.partitions} partitions; partitions never shrink"
            )
        if count > MAX_PARTITIONS:
            raise BadRequest(f"partitions must be at most {MAX_PARTITIONS}")
        self._catalog_write(
            [
                (
                    "UPDATE topics SET partitions = max(partitions, ?) WHERE topic_id = ?",
                    (count, info.topic_id),
                )
            ]
        )
        self._checkpoint_catalog()
        return self._load_topic(name)

    def alter_topic(
        self,
        name: str,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        segment_bytes: int | None = None,
    ) -> TopicInfo:
        self._check_writable("alter_topic")
        return self._freeing_space(
            lambda: self._alter_topic(name, retention_ms, retention_bytes, segment_bytes)
        )

    def _alter_topic(
        self,
        name: str,
        retention_ms: int | None,
        retention_bytes: int | None,
        segment_bytes: int | None,
    ) -> TopicInfo:
        info = self._load_topic(validate_topic_name(name))
        config = TopicConfig(
            partitions=info.config.partitions,
            retention_ms=retention_after(retention_ms, info.config.retention_ms),
            retention_bytes=retention_after(retention_bytes, info.config.retention_bytes),
            segment_bytes=segment_bytes or info.config.segment_bytes,
        )
        _check_config(config)
        self._catalog_write(
            [
                (
                    "UPDATE topics SET retention_ms = ?, retention_bytes = ?, segment_bytes = ? "
                    "WHERE topic_id = ?",
                    (
                        config.retention_ms,
                        config.retention_bytes,
                        config.segment_bytes,
                        info.topic_id,
                    ),
                )
            ]
        )
        for (topic_id, _p), log in self._handles.items():
            if topic_id == info.topic_id:
                log.segment_bytes = config.segment_bytes
        self._checkpoint_catalog()
        return self._load_topic(name)

    def list_topics(self) -> list[TopicInfo]:
        with self._catalog_lock:
            names = [r[0] for r in self._catalog.execute("SELECT name FROM topics ORDER BY name")]
        topics = []
        for name in names:
            try:
                topics.append(self._load_topic(name))
            except UnknownTopic:
                continue  # deleted since the listing
        return topics

    def current_topic_id(self, name: str) -> str:
        return self._load_topic(validate_topic_name(name)).topic_id

    def describe_topic(self, name: str) -> TopicInfo:
        """The topic and each of its partitions; a damaged partition is described as such
        (``PartitionInfo.damaged``), not raised: the others are served."""
        info = self._load_topic(validate_topic_name(name))
        parts = []
        for p in range(info.config.partitions):
            try:
                with self._lease(name, p) as (_, log):
                    parts.append(log.info(p))
            except PartitionDamaged as exc:
                parts.append(self._damaged_info(info, p, exc))
        return TopicInfo(info.name, info.topic_id, info.config, info.created_ms, parts)

    def _damaged_info(
        self, info: TopicInfo, partition: int, exc: PartitionDamaged
    ) -> PartitionInfo:
        """A damaged partition as its index describes it (read-only, nothing recovered), or
        with no offsets (0) and sizes (None) where the index cannot say."""
        indexed = self._damaged_indexed(info, partition)
        if indexed is None:
            return PartitionInfo(partition, 0, 0, None, None, damaged=str(exc))
        return dataclasses.replace(indexed, damaged=str(exc))

    def _damaged_indexed(self, info: TopicInfo, partition: int) -> PartitionInfo | None:
        """What a damaged partition's index says of it (None: it cannot say), looked at once
        per refusal."""

        def look() -> PartitionInfo | None:
            try:
                with self._view(info.name, info, partition) as (_, log):
                    return log.info(partition)
            except (LogbrokerError, OSError, sqlite3.Error):
                return None

        return self._damaged.indexed(info.name, info.topic_id, partition, look)

    def damaged_partitions(self) -> dict[tuple[str, int], str]:
        """The partitions this process found damaged (topic, partition: why), until one
        opens whole again (restored from a copy)."""
        return self._damaged.reasons()

    # -- topic-level state ----------------------------------------------------------------
    def put_topic_state_if_absent(self, topic: str, key: str, value: bytes) -> bytes:
        return self.put_topic_state_many_if_absent(topic, {key: value})[key]

    def put_topic_state_many_if_absent(
        self, topic: str, items: Mapping[str, bytes]
    ) -> dict[str, bytes]:
        self._check_writable("put_topic_state")
        info = self._topic(topic)
        won: dict[str, bytes] = {}
        with self._catalog_transaction():
            alive = self._catalog.execute(
                "SELECT 1 FROM topics WHERE topic_id = ?", (info.topic_id,)
            ).fetchone()
            inserted = 0
            if alive:
                inserted = self._insert_topic_state(info.topic_id, items)
                if inserted == len(items):
                    won = dict(items)  # every key was new
                else:
                    won = self._topic_state_many(info.topic_id, list(items))
        if not alive:
            self._topics.pop(topic, None)
            raise UnknownTopic(f"topic {topic!r} was deleted")
        if inserted and time.monotonic() - self._catalog_checkpointed >= _CATALOG_CHECKPOINT_S:
            self._checkpoint_catalog()  # new pins
        return won

    def get_topic_state_many(self, topic: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        info = self._topic(topic)
        with self._catalog_lock:
            found = self._topic_state_many(info.topic_id, list(keys))
        return {key: found.get(key) for key in keys}

    def _insert_topic_state(self, topic_id: str, items: Mapping[str, bytes]) -> int:
        """INSERT OR IGNORE, many rows per statement; how many rows were new."""
        rows = sorted(items.items())  # in key order: the b-tree takes them in half the time
        inserted = 0
        step = _SQL_VARIABLES // 3
        for i in range(0, len(rows), step):
            part = rows[i : i + step]
            cursor = self._catalog.execute(
                "INSERT OR IGNORE INTO topic_state VALUES " + ", ".join(["(?, ?, ?)"] * len(part)),
                [x for key, value in part for x in (topic_id, key, value)],
            )
            inserted += cursor.rowcount
        return inserted

    def _topic_state_many(self, topic_id: str, keys: list[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for i in range(0, len(keys), _SQL_VARIABLES):
            part = keys[i : i + _SQL_VARIABLES]
            found.update(
                self._catalog.execute(
                    "SELECT key, value FROM topic_state WHERE topic_id = ? AND key IN "
                    f"({', '.join('?' * len(part))})",
                    (topic_id, *part),
                ).fetchall()
            )
        return found

    def scan_topic_state(
        self, topic: str, prefix: str, after: str = "", limit: int = 1000
    ) -> list[tuple[str, bytes]]:
        if not prefix:
            raise ValueError("a state scan needs a prefix")
        info = self._topic(topic)
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        with self._catalog_lock:
            rows = self._catalog.execute(
                "SELECT key, value FROM topic_state WHERE topic_id = ? AND key >= ? AND key > ? "
                "AND key < ? ORDER BY key LIMIT ?",
                (info.topic_id, prefix, after, end, limit),
            ).fetchall()
        return [(str(key), bytes(value)) for key, value in rows]

    def delete_topic_state_if(
        self, topic: str, items: Mapping[str, bytes], *, deletions_key: str | None = None
    ) -> int:
        """Delete each key whose value is the one given; how many were deleted.

        With ``deletions_key``, the count stored there (8 bytes, big-endian) is raised by that
        number in the same transaction.
        """
        self._check_writable("delete_topic_state")
        info = self._topic(topic)
        deleted = 0
        with self._catalog_transaction():
            for key, value in items.items():
                deleted += self._catalog.execute(
                    "DELETE FROM topic_state WHERE topic_id = ? AND key = ? AND value = ?",
                    (info.topic_id, key, value),
                ).rowcount
            if deleted and deletions_key is not None:
                self._add_to_count(info.topic_id, deletions_key, deleted)
        return deleted

    def _add_to_count(self, topic_id: str, key: str, added: int) -> None:
        row = self._catalog.execute(
            "SELECT value FROM topic_state WHERE topic_id = ? AND key = ?", (topic_id, key)
        ).fetchone()
        count = 0 if row is None else int.from_bytes(row[0], "big")
        self._catalog.execute(
            "INSERT OR REPLACE INTO topic_state VALUES (?, ?, ?)",
            (topic_id, key, (count + added).to_bytes(_COUNT_BYTES, "big")),
        )

    def get_topic_state(self, topic: str, key: str) -> bytes | None:
        info = self._topic(topic)
        with self._catalog_lock:
            row = self._catalog.execute(
                "SELECT value FROM topic_state WHERE topic_id = ? AND key = ?",
                (info.topic_id, key),
            ).fetchone()
        return None if row is None else bytes(row[0])

    # -- writes ---------------------------------------------------------------------------
    def submit(
        self, topic: str, partition: int, fn: TransactionFn
    ) -> concurrent.futures.Future[AppendResult]:
        self._check_writable("append")
        with self._lease(topic, partition, create=True) as (info, _):
            # Held until the transaction is resolved: a partition with work queued stays open.
            handle = self._handles.acquire((info.topic_id, partition), _deleted_under_lease(topic))
        try:
            future = handle.log.submit(fn)
        except BaseException:
            self._handles.release(handle)
            raise
        future.add_done_callback(lambda _f: self._handles.release(handle))
        future.add_done_callback(
            lambda f: self._forget_if_deleted(topic, info.topic_id, partition, f)
        )
        return future

    def _forget_if_deleted(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        future: concurrent.futures.Future[AppendResult],
    ) -> None:
        if not future.cancelled() and isinstance(future.exception(), UnknownTopic):
            self._forget_topic(topic)
            self._finish_deletion_met(topic, topic_id, partition, future.exception())

    def transact(self, topic: str, partition: int, fn: TransactionFn) -> AppendResult:
        try:
            return self._commit_here(topic, partition, fn)
        except UnknownTopic as exc:
            # The topic may have been deleted and re-created by another process; a fresh
            # look at the catalog either finds the new one or confirms it is gone.
            self._forget_topic(topic)
            try:
                return self._commit_here(topic, partition, fn)
            except UnknownTopic:
                if isinstance(exc, TopicDeleted):
                    raise exc from None  # "deleted while ... in flight" says more
                raise

    def _commit_here(self, topic: str, partition: int, fn: TransactionFn) -> AppendResult:
        """Commit ``fn`` in this thread when the partition is not committing already (see
        ``PartitionLog.commit_here``); a waiting writer saves two thread hand-offs."""
        self._check_writable("append")
        with self._lease(topic, partition, create=True) as (info, log):
            try:
                return log.commit_here(fn)
            except UnknownTopic as exc:
                self._finish_deletion_met(topic, info.topic_id, partition, exc)
                raise

    def append(self, topic: str, partition: int, values: Sequence[bytes]) -> AppendResult:
        return self.transact(topic, partition, _append_all(list(values)))

    # -- reads ----------------------------------------------------------------------------
    def read(
        self, topic: str, partition: int, offset: int, max_bytes: int = 1024 * 1024
    ) -> ReadResult:
        try:
            # the partition's files belong to one topic identity: the one the records are of
            return self._on_partition(
                topic,
                partition,
                lambda log: dataclasses.replace(
                    log.read(offset, max_bytes), topic_id=log.topic_id_value.decode()
                ),
            )
        except CorruptData as exc:
            raise exc.located(topic, partition) from exc
        except PartitionDamaged as exc:
            # Said to readers as damaged data, which every reader already stops at and
            # reports (the other partitions read on): waiting does not mend it either.
            start, end = self._damaged_bounds(topic, partition, offset)
            raise CorruptData(str(exc), offset, start, end, topic, partition) from exc

    def _damaged_bounds(self, topic: str, partition: int, offset: int) -> tuple[int, int]:
        """A damaged partition's offsets as its index says them, or ``offset`` for both."""
        try:
            indexed = self._damaged_indexed(self._topic(topic), partition)
        except LogbrokerError:
            indexed = None
        if indexed is None:
            return offset, offset
        return indexed.start_offset, indexed.end_offset

    def get_state(self, topic: str, partition: int, key: str) -> bytes | None:
        return self._on_partition(topic, partition, lambda log: log.get_state(key))

    def scan_state(
        self, topic: str, partition: int, prefix: str, after: str = "", limit: int = 1000
    ) -> list[tuple[str, bytes]]:
        return self._on_partition(
            topic, partition, lambda log: log.scan_state(prefix, after, limit)
        )

    def check_batches(self, topic: str, partition: int) -> list[str]:
        return self._on_partition(topic, partition, lambda log: log.check_batches())

    def end_offset(self, topic: str, partition: int) -> int:
        return self._on_partition(topic, partition, lambda log: log.bounds()[1])

    def reads_of(self, partitions: Sequence[tuple[str, int]]) -> contextlib.nullcontext[None]:
        """Nothing to look up together: a partition's bounds are read from its own files."""
        return contextlib.nullcontext()

    def wait_for_data(self, topic: str, partition: int, offset: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s

        def wait(log: PartitionLog) -> bool | None:
            if log.read_only and not self.read_only:
                # A view (no write made the partition yet, or the disk is full): nothing to
                # watch; looked at again until its end moves or a write makes it.
                return True if log.has_database and log.bounds()[1] > offset else None
            if not log.has_database:
                return None  # a read-only store: no write made it yet
            key = (self._topic(topic).topic_id, partition)
            following = self._watched.get(key)
            if following is None:
                following = self._watcher.follow(log.notify_path, log.notify_changed)
                self._watched[key] = following
            return log.wait_for_data(
                offset, max(0.0, deadline - time.monotonic()), following.watched
            )

        while True:
            waited = self._on_partition(topic, partition, wait)
            if waited is not None:
                return waited
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(_UNMADE_POLL_S, remaining))

    def follow_appends(
        self, topic: str, partition: int, on_append: Callable[[], None]
    ) -> Callable[[], None]:
        info = self._topic(topic)
        return self._append_followers.follow(topic, partition, info.topic_id, on_append)

    def _topic_id_now(self, name: str) -> str | None:
        """The id of the topic ``name`` as the catalog has it now (None: no such topic)."""
        try:
            return self._load_topic(name).topic_id
        except UnknownTopic:
            return None

    # -- retention ------------------------------------------------------------------------
    def apply_retention(self, now_ms_: int | None = None) -> dict[tuple[str, int], int]:
        self._check_writable("apply_retention")
        return self._freeing_space(lambda: self._apply_retention(now_ms_))

    def _apply_retention(self, now_ms_: int | None) -> dict[tuple[str, int], int]:
        now = now_ms_ if now_ms_ is not None else int(time.time() * 1000)
        moved: dict[tuple[str, int], int] = {}
        for info in self.list_topics():
            cfg = info.config
            if cfg.retention_ms is None and cfg.retention_bytes is None:
                continue
            for p in range(cfg.partitions):
                try:
                    with self._lease(info.name, p) as (_, log):
                        if not log.has_database:
                            continue  # nothing written: nothing to drop
                        before = log.bounds()[0]
                        after = log.drop_segments(
                            below_offset=None,
                            before_ms=None if cfg.retention_ms is None else now - cfg.retention_ms,
                            max_bytes=cfg.retention_bytes,
                        )
                except PartitionDamaged:
                    continue  # kept as it is for the operator (logged); the others go on
                if after != before:
                    moved[(info.name, p)] = after
        return moved

    def delete_segments_before(self, topic: str, partition: int, offset: int) -> int:
        self._check_writable("delete_segments_before")
        if offset < 0:
            raise BadRequest("offset must not be negative")

        def drop() -> int:
            with self._lease(topic, partition) as (_, log):
                if not log.has_database:
                    return log.bounds()[0]  # nothing written: nothing to drop
                return log.drop_segments(below_offset=offset, before_ms=None, max_bytes=None)

        return self._freeing_space(drop)

    # -- the space reserve ----------------------------------------------------------------
    def _freeing_space(self, op: Callable[[], T]) -> T:
        """Run ``op``, which frees space or changes what is kept; if the store refuses it (a
        full disk: SQLite needs a few pages to record any change), give the reserve back to
        the file system and run it once more.  The reserve is taken again once there is room."""
        try:
            result = op()
        except StoreUnavailable:
            if not self._give_back_reserve():
                raise
            result = op()
        self._keep_reserve()
        return result

    def _give_back_reserve(self) -> bool:
        try:
            os.unlink(self.data_dir / RESERVE_FILE)
        except OSError:
            return False  # another process gave it back, or the directory is gone
        return True

    def _keep_reserve(self) -> None:
        """Hold ``_RESERVE_BYTES`` in ``RESERVE_FILE`` if it is not held and there is room."""
        path = self.data_dir / RESERVE_FILE
        try:
            fs = os.statvfs(self.data_dir)
            if path.exists() or fs.f_bavail * fs.f_frsize < 2 * _RESERVE_BYTES:
                return
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return  # held by another process meanwhile, or no room: taken another time
        try:
            os.posix_fallocate(fd, 0, _RESERVE_BYTES)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
        finally:
            os.close(fd)

    def unavailable_spans(self) -> list[tuple[float, float]]:
        return []  # a local disk that fails refuses at once (503), it does not stall

    def _note_no_space(self, needed_bytes: int) -> None:
        # The largest: a smaller write refused meanwhile must not clear the mark early.
        self._short_of_space = max(self._short_of_space or 0, needed_bytes)

    def installation_id(self) -> str:
        # made with the catalog (the first open for writing) and kept in it
        try:
            with self._catalog_lock:
                row = self._catalog.execute("SELECT id FROM installation").fetchone()
        except sqlite3.Error as exc:
            if "no such table" not in str(exc):
                raise as_store_unavailable(exc) or exc from exc
            row = None  # a catalog made before there were ids, opened read-only
        if row is None:
            raise ReadOnlyStore(f"the store at {self.data_dir} has no installation id yet")
        return f"sqlite:{row[0]}"

    def readiness(self) -> str | None:
        if self.read_only:
            return "the store is open read-only"
        assert self._guard is not None
        # First what needs no disk: a hung disk must not hang the answer.
        problem = self._guard.stalled() or self._guard.directory_problem()
        if problem is not None:
            return problem
        where = self.data_dir / "topics"
        if not where.is_dir():
            where = self.data_dir
        try:
            fs = os.statvfs(where)
        except OSError as exc:
            return f"the data directory cannot be looked at: {exc.strerror}"
        if fs.f_flag & os.ST_RDONLY:
            return "the data directory's file system is read-only"
        free = fs.f_bavail * fs.f_frsize
        needed = self._short_of_space
        if needed is not None:
            if free < max(needed or _READY_MIN_FREE_BYTES + _RESERVE_BYTES, _READY_MIN_FREE_BYTES):
                write = f"a write of {needed} bytes" if needed else "a write"
                return (
                    f"the data directory's file system is full: {write} did not fit, "
                    f"{free} are free"
                )
            self._short_of_space = None
        if free < _READY_MIN_FREE_BYTES:
            # No write of this process was refused (another worker's may have been).
            return (
                f"the data directory's file system is full: {free} bytes are free, "
                f"writes need {_READY_MIN_FREE_BYTES}"
            )
        if not os.access(where, os.W_OK):
            return "the data directory is not writable"
        self._keep_reserve()
        return None

    def close(self) -> None:
        for log in self._handles.pop_all():
            log.close()
        if self._guard is not None:
            self._guard.close()
        self._append_followers.close()
        self._watcher.close()
        if not self.read_only:
            self._checkpoint_catalog()
        with self._catalog_lock:
            self._catalog.close()

    def __enter__(self) -> SqliteLogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
