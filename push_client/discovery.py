"""Finding the files to tail and noticing that they changed: globs, inotify, polling.

inotify watches the directories (not the files): one watch reports writes, creations, renames
and deletions of every file in it, including files that do not exist yet.  Where inotify is
missing or its watch limit is reached, the loop's poll interval does the same job slower.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import logging
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from push_client.config import Entry

log = logging.getLogger("logbroker.push")


@dataclass
class Changes:
    """What one batch of inotify events says."""

    any: bool = False
    structural: bool = False
    moves: list[tuple[str, str]] = field(default_factory=list)
    """(old path, new path) of every rename seen whole (both names in watched dirs)."""


@dataclass(frozen=True)
class Candidate:
    entry: Entry
    path: str
    dev: int
    ino: int
    size: int = 0


@dataclass(frozen=True)
class Unreachable:
    """A path an entry names, or a directory its glob lists, that cannot be looked at (a
    directory without search or read permission): its files cannot even be matched."""

    entry: Entry
    path: str
    error: OSError


def expand(
    entries: Iterable[Entry], unreachable: list[Unreachable] | None = None
) -> Iterator[Candidate]:
    """Regular files matching each entry now; a file matched by two entries goes to the first.

    Paths that exist but cannot be looked at are appended to ``unreachable`` (when given)
    instead of being passed over in silence; so are the matched names that are not regular
    files (a FIFO, a socket, a directory a glob matches, a dangling symbolic link: a link
    to a file system not mounted yet would otherwise ship nothing, unseen).  Nothing is
    opened here: a FIFO never blocks the client.
    """
    seen: set[tuple[int, int]] = set()
    for entry in entries:
        if glob.has_magic(entry.path):
            misses: list[tuple[str, OSError]] = []
            paths = sorted(_glob(entry.path, misses))
            if unreachable is not None:
                unreachable.extend(
                    Unreachable(entry, os.path.abspath(directory), exc) for directory, exc in misses
                )
        else:
            paths = [entry.path]
        for path in paths:
            try:
                st = os.stat(path)
            except OSError as exc:
                if unreachable is None:
                    continue
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    target = _dangling_target(path)
                    if target is None:
                        continue  # gone since it was matched
                    exc = OSError(errno.ENOENT, f"a dangling symbolic link (to {target})")
                unreachable.append(Unreachable(entry, os.path.abspath(path), exc))
                continue
            if not stat.S_ISREG(st.st_mode):
                # an entry naming a directory is said at the start (directory_entries)
                named_dir = stat.S_ISDIR(st.st_mode) and not glob.has_magic(entry.path)
                if unreachable is not None and not named_dir:
                    unreachable.append(Unreachable(entry, os.path.abspath(path), _not_regular(st)))
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            yield Candidate(entry, os.path.abspath(path), st.st_dev, st.st_ino, st.st_size)


def _dangling_target(path: str) -> str | None:
    """Where the symbolic link ``path`` points, if it is one (its target is missing)."""
    try:
        return os.readlink(path)
    except OSError:
        return None


def _not_regular(st: os.stat_result) -> OSError:
    """Why a matched name that is not a regular file is not shipped."""
    if stat.S_ISDIR(st.st_mode):
        return OSError(errno.EISDIR, "a directory, not a regular file")
    kind = (
        "a FIFO (named pipe)"
        if stat.S_ISFIFO(st.st_mode)
        else "a socket"
        if stat.S_ISSOCK(st.st_mode)
        else "a device"
    )
    return OSError(f"{kind}, not a regular file: it is not read")


def directory_entries(entries: Iterable[Entry]) -> list[Entry]:
    """The entries whose path is a directory: a mistake, since an entry names files (a glob
    such as ``DIR/*.log`` ships the files in it)."""
    return [e for e in entries if not glob.has_magic(e.path) and os.path.isdir(e.path)]


def _glob(pattern: str, misses: list[tuple[str, OSError]], *, dirs_only: bool = False) -> list[str]:
    """What ``glob.glob(pattern)`` matches, with each directory on the way that cannot be
    listed or searched (no permission, say) appended to ``misses``: glob passes over those
    in silence, so ``/var/log/*/app.log`` skipped a directory it may not enter, unseen."""
    directory, name = os.path.split(pattern)
    if glob.has_magic(directory):
        directories = _glob(directory, misses, dirs_only=True)
    else:
        directories = [directory]
    if not name:  # a pattern ending in a separator names directories
        return [d for d in directories if os.path.isdir(d)]
    look = _listed if glob.has_magic(name) else _present
    return [
        os.path.join(found, match)
        for found in directories
        for match in look(found, name, dirs_only, misses)
    ]


def _listed(
    directory: str, pattern: str, dirs_only: bool, misses: list[tuple[str, OSError]]
) -> list[str]:
    """The names in ``directory`` that match ``pattern`` (hidden ones only if it is)."""
    try:
        with os.scandir(directory or os.curdir) as it:
            names = [e.name for e in it if not dirs_only or _is_dir(e)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        misses.append((directory or os.curdir, exc))
        return []
    if not pattern.startswith("."):
        names = [n for n in names if not n.startswith(".")]
    return fnmatch.filter(names, pattern)


def _present(
    directory: str, name: str, dirs_only: bool, misses: list[tuple[str, OSError]]
) -> list[str]:
    """``[name]`` if ``directory`` holds it (a directory, with ``dirs_only``), else []."""
    path = os.path.join(directory, name)
    try:
        st = os.stat(path) if dirs_only else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        # The directory cannot be searched: whether it holds the name cannot be known.
        misses.append((directory or os.curdir, exc))
        return []
    return [name] if not dirs_only or stat.S_ISDIR(st.st_mode) else []


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def watch_root(pattern: str) -> str:
    """The deepest directory of ``pattern`` that has no glob characters."""
    parts = os.path.abspath(pattern).split(os.sep)
    fixed: list[str] = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return os.sep.join(fixed) or os.sep


def find_inode(directory: str, dev: int, ino: int, *, strict: bool = False) -> str | None:
    """The path of the file with this identity in ``directory`` (a rotated file), if any.

    ``strict``: a directory that exists but cannot be read raises (OSError) rather than
    answering "not there", which it cannot know.
    """
    try:
        with os.scandir(directory) as it:
            for item in it:
                if item.inode() != ino or not item.is_file(follow_symlinks=False):
                    continue
                if item.stat(follow_symlinks=False).st_dev == dev:
                    return item.path
    except FileNotFoundError:
        return None
    except OSError:
        if strict:
            raise
        return None
    return None


class ChangeWatcher:
    """inotify on directories when available; ``fileno()`` is None when polling only."""

    _MASK = 0

    def __init__(self, use_inotify: bool) -> None:
        self._inotify = None
        self._watched: dict[str, int] = {}
        if not use_inotify:
            return
        try:
            from inotify_simple import INotify, flags

            self._inotify = INotify()
            self._mask = (
                flags.MODIFY
                | flags.CREATE
                | flags.MOVED_TO
                | flags.MOVED_FROM
                | flags.DELETE
                | flags.CLOSE_WRITE
                | flags.ATTRIB
            )
            self._structural = (
                flags.CREATE | flags.MOVED_TO | flags.MOVED_FROM | flags.DELETE | flags.ATTRIB
            )
        except (ImportError, OSError) as exc:
            log.warning("inotify unavailable (%s); polling instead", exc)
            self._inotify = None

    @property
    def active(self) -> bool:
        return self._inotify is not None

    def fileno(self) -> int | None:
        return self._inotify.fileno() if self._inotify is not None else None

    def watching(self, directory: str) -> bool:
        """Whether events of ``directory`` (its files' writes, renames, deletions) arrive."""
        return directory in self._watched

    def watch(self, directory: str) -> None:
        if self._inotify is None or directory in self._watched:
            return
        try:
            self._watched[directory] = self._inotify.add_watch(directory, self._mask)
        except OSError as exc:
            # A missing directory is watched once it appears (the next rescan tries again);
            # a full watch table leaves this directory to polling.
            if exc.errno not in (2, 20):
                log.warning("cannot watch %s (%s); polling it", directory, exc.strerror)

    def drain(self) -> Changes:
        """Consume pending events: whether anything changed, and the renames seen."""
        changes = Changes()
        if self._inotify is None:
            return changes
        events = self._inotify.read(timeout=0)
        if not events:
            return changes
        changes.any = True
        by_wd = {wd: path for path, wd in self._watched.items()}
        moved_from: dict[int, str] = {}
        for event in events:
            if event.mask & self._structural:
                changes.structural = True
            if event.mask & 0x8000:  # IN_IGNORED: the directory went away
                self._watched.pop(by_wd.get(event.wd, ""), None)
                changes.structural = True
                continue
            directory = by_wd.get(event.wd)
            if directory is None or not event.name:
                continue
            if event.mask & 0x40:  # IN_MOVED_FROM
                moved_from[event.cookie] = os.path.join(directory, event.name)
            elif event.mask & 0x80 and event.cookie in moved_from:  # IN_MOVED_TO
                changes.moves.append(
                    (moved_from.pop(event.cookie), os.path.join(directory, event.name))
                )
        return changes

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
