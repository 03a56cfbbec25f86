"""A tier's counts journaled beside its data, so that a SIGKILL between publications loses none.

A gateway counts in memory and publishes every few seconds (:mod:`audit.publisher`); a process
killed in between took what it counted since its last publication with it, and the audit showed
those lines as lost although the log holds them.  So every change of the counts is appended to
a journal file of the instance and tier (``<dir>/<instance>.journal`` for the gateway tier,
``<dir>/<instance>.push_<subscription>.journal`` for a push subscription's) as it is made,
before the counts it changed can be published: one ``os.write`` of short lines per request
(or push batch), unbuffered, so it is in the kernel's page cache when the process dies however
it dies (it is not synced: a crash of the machine loses the journal's tail, as it loses the
push-client's).

The journal holds sums, never totals that replace each other: a first line naming the instance
and the tier, then ``[topic, window, messages, lines]`` lines that add up to the instance's
totals.  When it has grown past :data:`COMPACT_BYTES` and four times its last compaction, it is
replaced (atomically) by one line per key holding that key's total.

The live process holds an exclusive ``flock`` on its journal; a killed one's lock is released
by the kernel.  A gateway starting on the directory (:func:`recover_journals`) takes the lock of
every journal nobody holds, adds its lines up, publishes the totals under the dead instance's
name, so its records replace the ones it published last, and removes the file.  A gateway
stopped by SIGTERM whose last publication got through removes its journals itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import orjson

from audit.windows import Key, WindowCounts

_log = logging.getLogger("logbroker.audit")

SUFFIX = ".journal"
COMPACT_BYTES = 8 << 20
"""A journal smaller than this is never compacted."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class CountJournal:
    """The journal of one live instance (its lock held until :meth:`close`)."""

    def __init__(self, directory: Path, instance: str, tier: str = "gateway") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.instance = instance
        self.tier = tier
        name = instance if tier == "gateway" else f"{instance}.{tier}"
        self.path = directory / f"{_UNSAFE.sub('_', name)[:200]}{SUFFIX}"
        self._fd = self._open_locked(self.path)
        os.write(self._fd, _header(tier, instance))
        self._size = os.fstat(self._fd).st_size
        self._compacted = 0
        self.failed = ""
        """Why a write failed: the journal was given up (see :meth:`_trouble`)."""

    @staticmethod
    def _open_locked(path: Path) -> int:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        return fd

    def add(self, changes: list[tuple[Key, int, int]]) -> None:
        """Journal the changes of one add, in one write (called with the counts' lock held,
        so lines are in the order the counts changed)."""
        line = b"".join(
            orjson.dumps([key[0], key[1], messages, lines]) + b"\n"
            for key, messages, lines in changes
        )
        if self._fd < 0:
            return
        try:
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(f"{written} of {len(line)} bytes written (is the disk full?)")
        except OSError as exc:
            self._trouble(exc)
            return
        self._size += len(line)

    def wants_compaction(self) -> bool:
        return self._fd >= 0 and self._size > max(COMPACT_BYTES, 4 * self._compacted)

    def compact(self, totals: dict[Key, tuple[int, int]]) -> None:
        """Replace the journal by ``totals`` (called with the counts' lock held: no change
        can fall between the totals taken and the file that holds them)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        body = _header(self.tier, self.instance) + b"".join(
            orjson.dumps([topic, window, m, lines]) + b"\n"
            for (topic, window), (m, lines) in totals.items()
        )
        try:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            fd = self._open_locked(tmp)
            try:
                if os.write(fd, body) != len(body):
                    raise OSError("the totals were not written whole (is the disk full?)")
                os.replace(tmp, self.path)
            except OSError:
                os.close(fd)
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise
        except OSError as exc:
            # the journal as it is still holds every change: kept, and tried again once it
            # has grown four times more
            self._compacted = self._size
            _log.warning("audit: cannot compact the journal %s: %s", self.path, exc)
            return
        os.close(self._fd)
        self._fd = fd
        self._size = self._compacted = len(body)

    def _trouble(self, exc: OSError) -> None:
        """A journal that lacks a change would give back totals below what the instance may
        have published already: it is given up (removed), and the counts go on in memory
        only, as without a journal."""
        self.failed = str(exc)
        _log.warning(
            "audit: cannot write the journal %s: %s; it is given up, and a kill of this "
            "gateway loses what it counted since its last publication",
            self.path,
            exc,
        )
        self.close(remove=True)

    def close(self, *, remove: bool) -> None:
        """Release the journal; ``remove`` once every count in it is published."""
        if self._fd < 0:
            return
        if remove:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self._fd)
        self._fd = -1


def journal_counts(counts: WindowCounts, journal: CountJournal) -> None:
    """Have ``counts`` journal every change from now on, and compact the journal when it has
    grown (at a snapshot).  Nothing must have been counted yet."""

    def compact(totals: dict[Key, tuple[int, int]]) -> None:
        if journal.wants_compaction():
            journal.compact(totals)

    counts.watch(journal.add, compact)


def read_journal(path: Path) -> tuple[str, str, dict[Key, tuple[int, int]]] | None:
    """(tier, instance, totals) of a journal; None if it names no instance.  A line cut
    short by the kill, or not a count, is skipped."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    lines = raw.split(b"\n")
    try:
        head = orjson.loads(lines[0])
        instance = head["instance"]
        tier = head.get("tier", "gateway")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    if not (isinstance(instance, str) and instance and isinstance(tier, str) and tier):
        return None
    totals: dict[Key, list[int]] = {}
    for line in lines[1:]:
        try:
            topic, window, messages, count = orjson.loads(line)
        except (orjson.JSONDecodeError, ValueError, TypeError):
            continue
        if not (
            isinstance(topic, str) and all(isinstance(v, int) for v in (window, messages, count))
        ):
            continue
        tally = totals.setdefault((topic, window), [0, 0])
        tally[0] += messages
        tally[1] += count
    return tier, instance, {key: (m, n) for key, (m, n) in totals.items()}


def recover_journals(
    directory: Path, publish: Callable[[str, str, dict[Key, tuple[int, int]]], None]
) -> int:
    """Publish the totals of every journal in ``directory`` that no live process holds
    (``publish(tier, instance, totals)``; raises if they were not written) and remove it;
    returns how many were.  A journal whose publication fails stays for the next start."""
    if not directory.is_dir():
        return 0
    recovered = 0
    for path in sorted(directory.iterdir()):
        if path.name.endswith(".tmp"):
            # a compaction cut short: the journal it was to replace is still whole
            with contextlib.suppress(OSError):
                fd = CountJournal._open_locked(path)
                path.unlink()
                os.close(fd)
            continue
        if not path.name.endswith(SUFFIX):
            continue
        try:
            fd = CountJournal._open_locked(path)
        except OSError:
            continue  # a live instance's
        try:
            try:
                if os.stat(path).st_ino != os.fstat(fd).st_ino:
                    continue  # compacted by its live instance between the open and the lock
            except FileNotFoundError:
                continue  # recovered by another process between the listing and the lock
            found = read_journal(path)
            if found is None:
                _log.warning("audit: %s is not a journal of counts; left as it is", path)
                continue
            tier, instance, totals = found
            try:
                publish(tier, instance, totals)
            except Exception as exc:
                _log.warning(
                    "audit: the %s counts of the stopped instance %s (journal %s) are not "
                    "published yet (tried again at the next start): %s",
                    tier,
                    instance,
                    path,
                    exc,
                )
                continue
            path.unlink()
            recovered += 1
            _log.info(
                "audit: published the %s counts a stopped gateway (%s) had not published",
                tier,
                instance,
            )
        finally:
            os.close(fd)
    return recovered


def _header(tier: str, instance: str) -> bytes:
    return orjson.dumps({"instance": instance, "tier": tier}) + b"\n"
