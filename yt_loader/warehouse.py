"""The warehouse directory: Parquet tables plus the commit log that says what is in them.

Layout::

    WAREHOUSE/topic=dc1.nginx-access/date=2026-11-21/hour=14/
        part-77e267fa3577-00002-00000000000000001200-00000000000000001800.parquet
    WAREHOUSE/_loader/commits/0000000007.json      the commit log, one record per batch
    WAREHOUSE/_loader/staging/0000000008/<attempt>/...   files of a batch not committed yet
    WAREHOUSE/_loader/lock                         held by the running loader

A file's name is its offset range (topic identity, partition, first offset, end offset), so a
batch rerun after a crash writes the same names.  A batch commits in three steps:

1. tasks write its files under ``_loader/staging/<batch>/<attempt>/`` and fsync them (every
   task attempt in its own directory, so a retried or speculative attempt never writes into
   another's files);
2. the driver writes ``_loader/commits/<batch>.json`` (temp file, fsync, rename, fsync of the
   directory): the ranges, their files and every partition's loaded offset.  This rename is
   the commit point;
3. the driver renames the files of the attempts Spark accepted from staging into the table
   directories.

A crash before step 2 leaves only staging files, which the next run deletes and reloads.  A
crash during step 3 leaves a committed batch partly moved; the next run finishes the moves
before anything else.  Files appear in the table directories only after their commit, so a
reader that globs the tables (Spark, DuckDB, Hive) never sees an uncommitted file; names that
start with ``_`` are skipped by Spark and Hive and lie outside ``topic=*/date=*/hour=*/``.
:func:`Warehouse.committed_files` lists exactly the committed files for readers that want the
commit log's view.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from yt_loader.errors import WarehouseBusy, WarehouseCorrupt
from yt_loader.offset_ranges import OffsetRange

LOADER_DIR = "_loader"
COMMIT_FORMAT = 1


def table_dir(topic: str, date: str, hour: str) -> str:
    """The directory, relative to the warehouse, of one topic's rows of one hour."""
    return f"topic={topic}/date={date}/hour={hour}"


def file_name(rng: OffsetRange, topic_id: str) -> str:
    """The deterministic name of a range's file inside an hour directory.

    The topic's identity is part of it: a topic deleted and created again starts at offset 0
    again, and its files must not replace the old topic's.
    """
    return f"part-{topic_id[:12]}-{rng.partition:05d}-{rng.start:020d}-{rng.end:020d}.parquet"


@dataclass(frozen=True)
class LoadedRange:
    """One offset range of a committed batch and the files that hold its lines."""

    topic: str
    partition: int
    start: int
    end: int
    files: list[str]
    lines: int
    data_bytes: int
    staged_in: str = ""
    """the attempt directory under the batch's staging directory that holds ``files``"""


@dataclass(frozen=True)
class LoadGap:
    """Offsets the warehouse will never have: dropped by retention before they were loaded,
    or a message left out because it does not decompress (``--skip-corrupt``)."""

    topic: str
    partition: int
    start: int
    end: int
    reason: str

    def message(self) -> str:
        if self.end <= self.start:
            return f"{self.topic} partition {self.partition}: {self.reason}"
        if self.end == self.start + 1:
            return (
                f"{self.topic} partition {self.partition}: offset {self.start} was never "
                f"loaded: {self.reason}"
            )
        return (
            f"{self.topic} partition {self.partition}: offsets {self.start}..{self.end - 1} "
            f"({self.end - self.start} messages) were never loaded: {self.reason}"
        )


@dataclass(frozen=True)
class TopicOffsets:
    """How far one topic is loaded; ``topic_id`` tells a recreated topic from the old one."""

    topic_id: str
    partitions: dict[int, int] = field(default_factory=dict)
    deleted: bool = False
    """The topic was gone from the log at a load, which reported it (once): a topic of that
    name created later is a new topic, loaded from its start without another report."""


@dataclass(frozen=True)
class CommitRecord:
    """One committed batch.  ``offsets`` is cumulative: the latest record is the whole state."""

    batch: int
    committed_ms: int
    offsets: dict[str, TopicOffsets]
    ranges: list[LoadedRange]
    gaps: list[LoadGap]

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format": COMMIT_FORMAT,
            "batch": self.batch,
            "committed_ms": self.committed_ms,
            "offsets": {
                topic: {
                    "topic_id": o.topic_id,
                    "partitions": {str(p): end for p, end in sorted(o.partitions.items())},
                }
                | ({"deleted": True} if o.deleted else {})
                for topic, o in sorted(self.offsets.items())
            },
            "ranges": [asdict(r) for r in self.ranges],
            "gaps": [asdict(g) for g in self.gaps],
        }
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: Path) -> CommitRecord:
        try:
            doc = json.loads(raw)
            if doc.get("format") != COMMIT_FORMAT:
                raise ValueError(f"unknown format {doc.get('format')!r}")
            return cls(
                batch=int(doc["batch"]),
                committed_ms=int(doc["committed_ms"]),
                offsets={
                    topic: TopicOffsets(
                        str(o["topic_id"]),
                        {int(p): int(e) for p, e in o["partitions"].items()},
                        bool(o.get("deleted", False)),
                    )
                    for topic, o in doc["offsets"].items()
                },
                ranges=[LoadedRange(**r) for r in doc["ranges"]],
                gaps=[LoadGap(**g) for g in doc["gaps"]],
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise WarehouseCorrupt(f"commit record {where} does not parse: {exc}") from exc


@dataclass(frozen=True)
class Recovery:
    """What opening the warehouse had to repair after an earlier loader died."""

    published_files: int
    discarded_batches: list[int]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


class Warehouse:
    """A warehouse directory; the loader changes it only while holding :meth:`locked`."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._meta = self.root / LOADER_DIR
        self._commits = self._meta / "commits"
        self._staging = self._meta / "staging"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the warehouse's lock; raises :class:`WarehouseBusy` if another loader has it.

        An flock dies with its process, so a SIGKILLed loader never leaves a stale lock.
        """
        self._commits.mkdir(parents=True, exist_ok=True)
        self._staging.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._meta / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise WarehouseBusy(
                    f"another loader is running on {self.root} (it holds {self._meta / 'lock'})"
                ) from None
            yield
        finally:
            os.close(fd)

    # -- the commit log --------------------------------------------------------------------
    def _commit_paths(self) -> list[tuple[int, Path]]:
        if not self._commits.is_dir():
            return []
        found = []
        for path in self._commits.iterdir():
            if path.suffix == ".json" and path.stem.isdigit():
                found.append((int(path.stem), path))
        return sorted(found)

    def commits(self) -> list[CommitRecord]:
        return [CommitRecord.from_json(p.read_bytes(), p) for _, p in self._commit_paths()]

    def latest_commit(self) -> CommitRecord | None:
        paths = self._commit_paths()
        if not paths:
            return None
        return CommitRecord.from_json(paths[-1][1].read_bytes(), paths[-1][1])

    def committed_files(self, topic: str | None = None) -> list[Path]:
        """Every committed data file (absolute paths), optionally of one topic."""
        return [
            self.root / f
            for record in self.commits()
            for r in record.ranges
            if topic is None or r.topic == topic
            for f in r.files
        ]

    def staging_dir(self, batch: int) -> Path:
        return self._staging / f"{batch:010d}"

    def commit(self, record: CommitRecord) -> None:
        """Make ``record`` durable; the rename is the batch's commit point."""
        final = self._commits / f"{record.batch:010d}.json"
        if final.exists():
            raise WarehouseCorrupt(f"batch {record.batch} is already committed ({final})")
        tmp = self._commits / f".{record.batch:010d}.json.tmp"
        with open(tmp, "wb") as out:
            out.write(record.to_json())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, final)
        fsync_dir(self._commits)

    def publish(self, record: CommitRecord, on_moved: Callable[[], None] | None = None) -> int:
        """Move a committed batch's files from staging into the tables; returns how many moved.

        Idempotent: a file already in place is left alone, so a crash halfway is repaired by
        calling it again.
        """
        staging = self.staging_dir(record.batch)
        moved = 0
        touched: set[Path] = set()
        for rng in record.ranges:
            for rel in rng.files:
                target = self.root / rel
                source = staging / rng.staged_in / rel
                if source.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(source, target)
                    touched.add(target.parent)
                    moved += 1
                    if on_moved is not None:
                        on_moved()
                elif not target.exists():
                    raise WarehouseCorrupt(
                        f"batch {record.batch} is committed but {rel} is neither in staging "
                        "nor in its table"
                    )
        for directory in touched:
            fsync_dir(directory)
        return moved

    def drop_staging(self, batch: int) -> None:
        """Remove a published batch's staging directory (only empty directories are left)."""
        shutil.rmtree(self.staging_dir(batch), ignore_errors=True)

    def recover(self) -> Recovery:
        """Finish the last committed batch's moves and drop every uncommitted batch's files."""
        latest = self.latest_commit()
        published = self.publish(latest) if latest is not None else 0
        for tmp in self._commits.glob(".*.tmp"):
            tmp.unlink()
        discarded = []
        if self._staging.is_dir():
            for path in sorted(self._staging.iterdir()):
                if path.name.isdigit() and (latest is None or int(path.name) > latest.batch):
                    discarded.append(int(path.name))
                shutil.rmtree(path)
        return Recovery(published, discarded)

    def next_batch(self) -> int:
        latest = self.latest_commit()
        return 1 if latest is None else latest.batch + 1


def now_ms() -> int:
    return int(time.time() * 1000)
