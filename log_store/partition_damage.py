"""Partitions of the embedded store found damaged, remembered so that their uses are refused
without opening them again.

Opening a damaged partition fails the same way every time until an operator changes its
files, and it is not cheap: its index is checked against its segments (a lost index is
rebuilt as far as it goes), under the lock every partition of the process opens under.  A
push-client retrying a refused write every second, or a reader retrying its read, would pay
that each time.  So a refusal is kept with a stamp of the files it was found in (the
partition directory's identity; the identity, size and change times of ``partition.db``
and of each segment file) and answered from memory while the stamp is the same.  A changed
stamp (the partition restored from a copy, its index moved aside) is looked at on the next
use, and any refusal is looked at again at the latest ``RECHECK_S`` after it was made, so a
repaired partition is served without a restart.

What its index says of a damaged partition (offsets, size: ``describe_topic``, the bounds of
a read's ``CorruptData``) is kept with the refusal too, looked at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from log_store.errors import PartitionDamaged
from log_store.interface import PartitionInfo

RECHECK_S = 30.0
"""A refusal answered from memory is looked at again (the partition opened) at least this
often, even if no stamped file changed."""

_log = logging.getLogger(__name__)

FilesStamp = tuple[object, ...]


def files_stamp(directory: Path) -> FilesStamp | None:
    """What a repair of the partition in ``directory`` changes: the directory's identity,
    and the identity, size and modification and change times of ``partition.db`` and of each
    segment file (not of the WAL and shared-memory files, which every open of the database
    makes and removes).  None if it cannot be looked at (then nothing is answered from
    memory)."""
    try:
        held = os.stat(directory)
        stamp: list[object] = [held.st_dev, held.st_ino]
        with os.scandir(directory) as entries:
            names = sorted(entry.name for entry in entries if _stamped(entry.name))
        for name in names:
            try:
                st = os.stat(directory / name)
            except FileNotFoundError:
                continue  # removed meanwhile: its absence is the stamp
            stamp.append((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    except (FileNotFoundError, NotADirectoryError):
        return ("gone",)
    except OSError:
        return None
    return tuple(stamp)


def _stamped(name: str) -> bool:
    return name == "partition.db" or (name.endswith(".log") and name[:-4].isdigit())


@dataclass
class _Refusal:
    topic_id: str
    reason: str
    stamp: FilesStamp | None
    """The partition's files when it was refused (None: found damaged while in use, not
    when opened; never answered from memory)."""
    looked_at: float
    """When it was last opened and refused, or that was last claimed (``time.monotonic``)."""
    indexed: PartitionInfo | None = None
    indexed_known: bool = False
    """``indexed`` was looked at (None then: the index cannot say)."""


class DamagedPartitions:
    """The partitions a store found damaged, by (topic, partition), each with why."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refusals: dict[tuple[str, int], _Refusal] = {}

    def known(
        self, topic: str, topic_id: str, partition: int, directory: Path
    ) -> PartitionDamaged | None:
        """The refusal of the partition to answer now without opening it, or None if it is
        to be opened (it was not refused, its files changed, or its look is due)."""
        with self._lock:
            refusal = self._refusals.get((topic, partition))
            if refusal is None or refusal.topic_id != topic_id or refusal.stamp is None:
                return None
            now = time.monotonic()
            if now - refusal.looked_at >= RECHECK_S:
                # This caller opens it; the others answer from here meanwhile.
                refusal.looked_at = now
                return None
        if files_stamp(directory) != refusal.stamp:
            return None
        return PartitionDamaged(refusal.reason, topic, partition)

    def note(
        self,
        exc: PartitionDamaged,
        topic_id: str,
        directory: Path,
        stamp: FilesStamp | None,
    ) -> None:
        """Record the refusal ``exc`` of the partition in ``directory``, whose files were
        ``stamp`` before it was opened.  Logged (with the directory, which the reason leaves
        out: it reaches clients) when it is new or its reason changed."""
        key = (exc.topic, exc.partition)
        reason = str(exc)
        with self._lock:
            before = self._refusals.get(key)
            self._refusals[key] = _Refusal(topic_id, reason, stamp, time.monotonic())
        if before is None or before.reason != reason or before.topic_id != topic_id:
            _log.error("%s (the partition's files: %s)", reason, directory)

    def restored(self, topic: str, partition: int) -> None:
        """The partition opened whole: it is no longer damaged."""
        with self._lock:
            self._refusals.pop((topic, partition), None)

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted (and maybe created again): its refusals no longer hold."""
        with self._lock:
            for key in [key for key in self._refusals if key[0] == topic]:
                del self._refusals[key]

    def reasons(self) -> dict[tuple[str, int], str]:
        with self._lock:
            return {key: refusal.reason for key, refusal in self._refusals.items()}

    def __bool__(self) -> bool:
        return bool(self._refusals)

    def indexed(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        look: Callable[[], PartitionInfo | None],
    ) -> PartitionInfo | None:
        """What the damaged partition's index says of it (None: it cannot say), ``look``
        called once per refusal."""
        with self._lock:
            refusal = self._refusals.get((topic, partition))
            if refusal is not None and refusal.topic_id == topic_id and refusal.indexed_known:
                return refusal.indexed
        indexed = look()
        with self._lock:
            if (
                refusal is not None
                and refusal.topic_id == topic_id
                and self._refusals.get((topic, partition)) is refusal
            ):
                refusal.indexed, refusal.indexed_known = indexed, True
        return indexed
