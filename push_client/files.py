"""The set of files being shipped: found, followed through renames, read, and let go.

A file is one source from the moment its first line is complete until it is let go: rotated
away and quiet (``push_client.rotation``), deleted, truncated or replaced (a new source then
starts), or no longer configured.  Sources are found by the entries' globs, by inotify's
rename events, and, after a restart, from the state file, by inode when rotated while the
client was down; beside them, the files rotated while it was stopped that it never saw (a
copytruncate's copy, files rotated in between: ``_copy_of``, ``_rotated_while_stopped``).
Identity never depends on the path (``push_client.identity``), nor on how the entry that
matches a file spells its path; positions are recorded by source id, and ids recorded by an
earlier version are kept as they were.

Only the daemon's loop thread touches this object.
"""

from __future__ import annotations

import concurrent.futures
import errno
import fnmatch
import logging
import os
import resource
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from push_client.codec import compress
from push_client.config import Entry, PushConfig
from push_client.discovery import ChangeWatcher, Unreachable, expand, find_inode
from push_client.handover import Doubt
from push_client.identity import FileIdentity, display_path, make_source_id, read_fingerprint
from push_client.rotation import (
    AbandonedBytes,
    LetGoPolicy,
    compressed_fingerprint,
    compression_of,
    decompressed_size,
    holds_prefix,
    rotated_dirs,
    rotated_from,
)
from push_client.state_file import PushState, RetiredSource, SourcePosition
from push_client.tailer import PathError, Phase, TailedFile

log = logging.getLogger("logbroker.push")

_RETIRED_KEEP_S = 7 * 24 * 3600
_RETIRED_KEEP_COUNT = 10_000


@dataclass
class Counters:
    """What the loop counts (exported as metrics); ``buffered`` bounds memory."""

    read_bytes: int = 0
    acked_bytes: int = 0
    acked_chunks: int = 0
    duplicate_chunks: int = 0
    rotations: int = 0
    truncations: int = 0
    retired: dict[str, int] = field(default_factory=dict)
    fenced: int = 0
    out_of_order: int = 0
    first_read_at: float = 0.0
    last_ack_at: float = 0.0
    buffered: int = 0
    """Bytes read but not acknowledged (pending and in flight)."""
    last_activity: float = field(default_factory=time.monotonic)


@dataclass
class Unreadable:
    """A file that should be shipped but cannot be opened now (no permission, no descriptor
    left, a directory without search permission): named in the log, the status, the lag
    report and the metrics until it can be read."""

    path: str
    log_type: str
    error: str
    since: float
    acked: int = 0
    """Where its source's acknowledged data ends (0 for a file never shipped)."""
    size: int | None = None
    """Its size when last seen; None when it cannot even be looked at."""
    errno: str = ""
    """The error's symbolic errno (``EACCES``, ``EMFILE``); "" when it has none."""

    @property
    def lag_bytes(self) -> int | None:
        return None if self.size is None else max(0, self.size - self.acked)


def errno_name(exc: OSError) -> str:
    """``exc``'s symbolic errno (``EACCES``): the same on every host and in every language,
    unlike its message; "" when it has none."""
    return errno.errorcode.get(exc.errno, "") if exc.errno else ""


def _matches(entry: Entry, path: str) -> bool:
    return fnmatch.fnmatchcase(path, os.path.abspath(entry.path))


def _size_of(path: str, dev: int, ino: int, last_seen: int) -> int:
    """The size of the file at ``path`` if it is still this one, else as last seen."""
    try:
        st = os.stat(path)
    except OSError:
        return last_seen
    return st.st_size if (st.st_dev, st.st_ino) == (dev, ino) else last_seen


def _still_there(pos: SourcePosition) -> bool:
    """Whether the file of ``pos`` is still at its path or in its directory (by inode)."""
    try:
        st = os.stat(pos.path)
    except OSError:
        st = None
    if st is not None and (st.st_dev, st.st_ino) == (pos.dev, pos.ino):
        return True
    return find_inode(os.path.dirname(pos.path), pos.dev, pos.ino) is not None


def _why_unconfigured(log_type: str, matching: Entry | None) -> str:
    """Why a file that is still there is no longer shipped as the source it was."""
    if matching is None:
        return "no entry matches it any more"
    return (
        f"entry {matching.path} gives it log type {matching.log_type} (it was {log_type}); "
        f"it is shipped there as a new source from its start"
    )


def _no_census(tailed: TailedFile, installation: str) -> None:
    return None


class FileSet:
    """Every tailed file, by source id and by inode."""

    def __init__(
        self,
        config: PushConfig,
        state: PushState,
        counters: Counters,
        watcher: ChangeWatcher,
        compressors: concurrent.futures.ThreadPoolExecutor,
        *,
        on_retired: Callable[[], None],
    ) -> None:
        self.config = config
        self.state = state
        self.counters = counters
        self.watcher = watcher
        self.compressors = compressors
        self.on_retired = on_retired
        self.files: dict[str, TailedFile] = {}
        self.by_inode: dict[tuple[int, int], TailedFile] = {}
        self.waiting_paths: set[str] = set()
        self.on_hold: dict[tuple[int, int], SourcePosition] = {}
        """Sources of the state file whose file exists but cannot be opened now (no
        permission, no descriptor left): kept, and resumed where they were once it can be.
        Taking them for gone would ship them again from their start as new sources."""
        self._resume_with: tuple[list[str], Callable[[TailedFile, str], None]] = ([], _no_census)
        self._stopped_rotations: list[tuple[SourcePosition, Entry]] = []
        self._stopped_since = 0.0
        self._heads: dict[tuple[int, int, int, int], tuple[str, str | None]] = {}
        """``_head_of`` of the files of the directories looked through in this pass."""
        """When the state was last saved before this run (``PushState.saved_at`` as loaded):
        later saves of this run must not hide files rotated while the client was stopped
        from a source resumed late (held while it could not be read)."""
        """Sources of the state found rotated (renamed, truncated) or gone at a restart: their
        directories are looked through for files rotated while the client was stopped."""
        self.not_shipped: dict[str, Unreadable] = {}
        """Files written while the client was stopped that hold lines it cannot ship safely (a
        compressed rotated file, a copy it cannot tell from another): each is an error in the
        log once, and shown as an unreadable file (``--status``, the lag report, the metrics)
        for the rest of the run; never passed over in silence."""
        self._inodes_by_entry: dict[Entry, dict[tuple[int, int], str]] = {}
        self.unreadable: dict[str, Unreadable] = {}
        """Matched files that cannot be opened (no permission, say), and directories of the
        entries that cannot be looked at, by path.  They are named in the log, the status,
        the lag report and the metrics, and tried at every rescan."""
        self.let_go = LetGoPolicy(config.rotate_wait_s, config.rotated_grace_s)
        self.abandoned = AbandonedBytes()
        self.multi = False
        """Set by the daemon: whether positions are kept across installations."""
        self.unsaved_sources = False
        """A source was found since the state was last saved.  Saved without waiting for
        an ack: a file rotated away while a gateway is down, then the client restarted, is
        found again by the inode the state holds; unsaved, it was lost (its new name matched
        no glob)."""

    def __iter__(self) -> Iterator[TailedFile]:
        return iter(list(self.files.values()))

    def live(self) -> list[TailedFile]:
        return [t for t in self.files.values() if t.phase is not Phase.DONE]

    def _entry_going_on(
        self,
        entry_path: str,
        paths: tuple[str, ...],
        inode: tuple[int, int],
        log_type: str,
    ) -> tuple[Entry | None, Entry | None]:
        """(the entry a known source goes on under, the first entry that matches its file).

        An entry matches the file if it is spelled as the one the source was found by, if its
        path or glob matches one of ``paths`` (where the file is, where it was found), or if
        what it matches now holds the file's ``inode`` (a directory named through a symlink):
        ``*.log`` edited to ``*.log*`` or ``./*.log``, a relative path given as an absolute
        one, a glob as the names a shell expanded it to, all match the same files.  The
        spelling is not part of the source: compared as a string, every such edit took the
        files for gone and shipped them again from their start under new ids, into the same
        topic.  The source goes on under the first matching entry of its log type (its topic),
        whatever its codec (the gateway keeps each chunk's codec, and a seqno is a byte offset
        whatever the codec); None if there is none.
        """
        matching: Entry | None = None
        for entry in sorted(self.config.entries, key=lambda e: e.path != entry_path):
            if (
                entry.path != entry_path
                and not any(_matches(entry, p) for p in paths)
                and inode not in self._matched_inodes(entry)
            ):
                continue
            if matching is None:
                matching = entry
            if entry.log_type == log_type:
                return entry, matching
        return None, matching

    def _matched_inodes(self, entry: Entry) -> dict[tuple[int, int], str]:
        """The path of every file ``entry`` matches now, by (dev, inode); listed once per
        pass (:meth:`resume_from_state`, :meth:`discover`, :meth:`apply_config`)."""
        inodes = self._inodes_by_entry.get(entry)
        if inodes is None:
            inodes = {(c.dev, c.ino): c.path for c in expand([entry])}
            self._inodes_by_entry[entry] = inodes
        return inodes

    # -- finding files --------------------------------------------------------------------------
    def resume_from_state(
        self, installations: list[str], census: Callable[[TailedFile, str], None]
    ) -> None:
        """Reopen the sources of the state file, following files rotated while we were down.

        ``census(tailed, installation)`` is called for a source whose newest data may be
        further along at ``installation`` than the state says (the previous run did not
        stop cleanly).
        """
        self._resume_with = (installations, census)
        self._stopped_since = self.state.saved_at
        self._inodes_by_entry.clear()
        for pos in list(self.state.sources.values()):
            self._resume(pos, self.unreadable)
        self._ship_rotated_while_stopped()
        self._heads.clear()
        self.unreadable.update(self.not_shipped)

    def _resume(self, pos: SourcePosition, unreadable: dict[str, Unreadable]) -> TailedFile | None:
        """Reopen one source of the state file; None if it is gone, or held (``on_hold``,
        and its path in ``unreadable``)."""
        installations, census = self._resume_with
        entry, matching = self._entry_going_on(
            pos.entry_path, (pos.path, pos.first_path), (pos.dev, pos.ino), pos.log_type
        )
        identity = FileIdentity(pos.dev, pos.ino, pos.fingerprint)
        renamed = False
        try:
            found = self._open_identity(pos.path, identity) if entry is not None else None
            draining = pos.draining
            if found is None and entry is not None:
                moved = self._find_rotated(pos.path, pos.first_path, entry, pos.dev, pos.ino)
                if moved is not None:
                    found = self._open_identity(moved, identity)
                    draining = True
                    renamed = found is not None and moved != pos.path
                else:  # its directory was moved (renamed) where the entry matches it now
                    moved = self._matched_inodes(entry).get((pos.dev, pos.ino))
                    found = None if moved is None else self._open_identity(moved, identity)
        except OSError as exc:
            error = exc.strerror or str(exc)
            if (pos.dev, pos.ino) not in self.on_hold:
                log.warning(
                    "cannot open %s to resume source %s (%s); its position (%d) is kept and "
                    "it is resumed there once it can be read",
                    display_path(pos.path),
                    pos.source_id,
                    error,
                    pos.acked,
                )
            self.on_hold[(pos.dev, pos.ino)] = pos
            unreadable[pos.path] = self._still_unreadable(
                pos.path,
                pos.log_type,
                error,
                pos.acked,
                _size_of(pos.path, pos.dev, pos.ino, pos.size),
                errno_name(exc),
            )
            return None
        self.on_hold.pop((pos.dev, pos.ino), None)
        if found is not None and os.fstat(found[0]).st_size < pos.acked:
            os.close(found[0])  # shorter than what was acknowledged: truncated, same first line
            found = None
        truncated = None
        if found is None and entry is not None:
            truncated = self._truncated_while_stopped(pos)
            if truncated is not None:
                copy = self._copy_of(pos, entry, *truncated)
                if copy is not None:
                    fd, copy_path, identity = copy
                    found, draining = (fd, copy_path), True
                    self._retire_truncated(pos)
        if entry is not None and (found is None or renamed or truncated is not None):
            self._stopped_rotations.append((pos, entry))
        if found is None:
            if truncated is not None:
                reason = "truncated"  # said by _copy_of
            elif entry is None and _still_there(pos):
                log.warning(
                    "source %s (%s) is unconfigured since the last run: %s; positions up to "
                    "%d were acked",
                    pos.source_id,
                    display_path(pos.path),
                    _why_unconfigured(pos.log_type, matching),
                    pos.acked,
                )
                reason = "unconfigured"
            else:
                log.warning(
                    "source %s is gone since the last run; positions up to %d were acked",
                    pos.source_id,
                    pos.acked,
                )
                reason = "gone"
            if pos.doubts:
                log.error(
                    "source %s: bytes %s were in flight to installations that went down "
                    "and can no longer be checked: they may be lost",
                    pos.source_id,
                    ", ".join(f"{s}..{e} ({n})" for n, s, e in pos.doubts),
                )
            self._retire_position(pos, reason, pos.size, pos.path)
            return None
        assert entry is not None  # found is looked for only with an entry
        if entry.path != pos.entry_path:
            log.info(
                "source %s (%s) is now matched by entry %s (it was by %s): it goes on as the "
                "same source",
                pos.source_id,
                display_path(found[1]),
                entry.path,
                pos.entry_path,
            )
        fd, path = found
        tailed = self.new_file(
            entry, fd, path, pos.first_path, identity, pos.generation, pos.source_id
        )
        if draining:
            tailed.phase = Phase.DRAINING
            tailed.rotated_at = time.monotonic()
            self.counters.rotations += 1
        doubts = [Doubt.from_list(raw) for raw in pos.doubts]
        # Said with one installation left too (it was not: the usual end of an installation
        # removed for good is the other one left alone in the servers).
        for doubt in doubts:
            if doubt.installation not in installations:
                log.error(
                    "source %s: bytes %d..%d were in flight to installation %s, which is "
                    "no longer configured: they may be lost",
                    pos.source_id,
                    doubt.start,
                    doubt.end,
                    doubt.installation,
                )
        if not self.multi:
            return tailed
        plan = tailed.handover
        plan.frontier = pos.acked
        plan.installation = pos.installation
        for doubt in doubts:
            if doubt.installation in installations:
                plan.add_doubt(doubt)
        if pos.installation in installations and not self.state.clean:
            census(tailed, pos.installation)
        return tailed

    def _open_identity(self, path: str, identity: FileIdentity) -> tuple[int, str] | None:
        """The file at ``path`` if it is this one; raises OSError if it exists but cannot
        be opened (then whether it is this one is not known)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        st = os.fstat(fd)
        same_inode = (st.st_dev, st.st_ino) == (identity.dev, identity.ino)
        if same_inode and read_fingerprint(fd, final=True) == identity.fingerprint:
            return fd, path
        os.close(fd)
        return None

    def _find_rotated(
        self, path: str, first_path: str, entry: Entry, dev: int, ino: int
    ) -> str | None:
        """Where the file (``dev``, ``ino``) last seen at ``path`` is now: in the directory of
        ``path``, or renamed away by rotation to its entry's ``olddir`` (logrotate's), if any.

        Its own directory is read strictly (one that exists but cannot be read raises
        OSError: whether the file is there cannot be known); an olddir that cannot be read
        is not looked in.
        """
        moved = find_inode(os.path.dirname(path), dev, ino, strict=True)
        if moved is not None or not entry.olddir:
            return moved
        for directory in rotated_dirs(os.path.dirname(first_path), entry.olddir):
            if directory != os.path.dirname(path):
                moved = find_inode(directory, dev, ino)
                if moved is not None:
                    return moved
        return None

    # -- rotated while the client was stopped ---------------------------------------------------
    def _truncated_while_stopped(self, pos: SourcePosition) -> tuple[str, int] | None:
        """(path, size now) of the file of ``pos`` if it is still at its path, by its inode,
        with other bytes than the source shipped: shorter than what was acknowledged, or
        another first line (a copytruncate, or a truncation, while the client was stopped).

        Only at its path: copytruncate keeps it, and the inode under another name is
        rather a freed inode given to another file (ext4 hands them out again at once:
        ``rm app.log.1; gzip app.log`` may give ``app.log.gz`` the inode of ``app.log.1``).
        """
        try:
            fd = os.open(pos.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (pos.dev, pos.ino) or not stat.S_ISREG(st.st_mode):
                return None
            if st.st_size < pos.acked or read_fingerprint(fd, final=True) != pos.fingerprint:
                return pos.path, st.st_size
            return None
        finally:
            os.close(fd)

    def _copy_of(
        self, pos: SourcePosition, entry: Entry, truncated_path: str, size_now: int
    ) -> tuple[int, str, FileIdentity] | None:
        """The copy a copytruncate made of the file of ``pos`` while the client was stopped,
        open, with its identity; None (said in the log, and named as not shipped) when there
        is none, it is compressed, or which file it is cannot be told.

        The copy is in the same directory or in an ``olddir`` of its entry, whatever its name
        (an entry's glob need not match it: its bytes after the acknowledged offset belong to
        this source), has the source's
        first line, and at least the bytes the source had when last seen (``pos.size``; a
        copy made after the stop holds at least those).  Several such files are one copy
        and its copies when each is the start of the longest (the longest is read); else,
        or when they do not even agree on where the acknowledged data ends (a line's end),
        the client does not guess.  Files whose identity is known (tailed, in the state or
        let go before) are not copies made while it was stopped.
        """
        directories = rotated_dirs(os.path.dirname(pos.path), entry.olddir)
        least = max(pos.acked, pos.size)
        known = self._known_identities()
        known.update((r.dev, r.ino, r.fingerprint) for r in self.state.retired)
        plain: list[tuple[int, int, str, FileIdentity]] = []  # (size, fd, path, identity)
        compressed: list[tuple[str, str, int | None]] = []  # (path, compressor, bytes held)
        paths: list[str] = []
        for directory in directories:
            try:
                with os.scandir(directory) as it:
                    paths.extend(sorted(e.path for e in it if e.is_file(follow_symlinks=False)))
            except OSError:
                continue
        for path in paths:
            head = self._head_of(path)
            if head is None or head[1] != pos.fingerprint:
                continue  # the first line of each file is read once per pass, not per source
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
            except OSError:
                continue
            kept = False
            try:
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino)
                if not stat.S_ISREG(st.st_mode) or key in self.by_inode:
                    continue
                if key == (pos.dev, pos.ino):
                    continue
                kind = compression_of(fd)
                if kind:
                    if compressed_fingerprint(fd, kind) == pos.fingerprint:
                        compressed.append((path, kind, decompressed_size(fd, kind)))
                    continue
                if st.st_size < least or read_fingerprint(fd, final=True) != pos.fingerprint:
                    continue
                identity = FileIdentity(st.st_dev, st.st_ino, pos.fingerprint)
                if identity.key in known:
                    continue
                plain.append((st.st_size, fd, path, identity))
                kept = True
            finally:
                if not kept:
                    os.close(fd)
        if len(plain) > 1 and pos.acked:
            # Chunks end at a line's end (but for a line over max_line_bytes): of several,
            # one without a line's end where the acked data ends is not this source's copy.
            at_line_end = [c for c in plain if os.pread(c[1], 1, pos.acked - 1) == b"\n"]
            if at_line_end:
                for size, fd, path, identity in plain:
                    if (size, fd, path, identity) not in at_line_end:
                        os.close(fd)
                plain = at_line_end
        plain.sort(key=lambda c: (-c[0], c[2]))
        shown = display_path(pos.path)
        owed = (
            f"bytes {pos.acked}..{pos.size} (and whatever followed them before the truncation)"
            if pos.size > pos.acked
            else f"what followed byte {pos.acked} before the truncation, if anything"
        )
        if plain and all(holds_prefix(plain[0][1], fd, size) for size, fd, _, _ in plain[1:]):
            size, fd, path, identity = plain[0]
            for _, other, _, _ in plain[1:]:
                os.close(other)
            log.warning(
                "source %s (%s) was truncated while the client was stopped (size now %d; "
                "%d bytes were acked); its copy %s (%d bytes, the same first line) is read "
                "from there as the same source, then let go",
                pos.source_id,
                shown,
                size_now,
                pos.acked,
                display_path(path),
                size,
            )
            return fd, path, identity
        for _, fd, _, _ in plain:
            os.close(fd)
        if plain:
            names = ", ".join(display_path(c[2]) for c in sorted(plain, key=lambda c: c[2]))
            log.error(
                "source %s (%s) was truncated while the client was stopped, and %s all start "
                "with its first line but differ: which one is its copy cannot be told, so %s "
                "of it are not shipped",
                pos.source_id,
                shown,
                names,
                owed,
            )
            for _, _, path, _ in plain:
                self._not_shipped(
                    path,
                    pos.log_type,
                    f"may be the copy of {shown} (truncated while the client was stopped), "
                    f"but so may {names}: its bytes after {pos.acked} are not shipped",
                )
        elif any(held is None or held > pos.acked for _, _, held in compressed):
            held = max((h for _, _, h in compressed if h is not None), default=None)
            if held is not None and held > pos.acked:
                owed = f"bytes {pos.acked}..{held}"
            log.error(
                "source %s (%s) was truncated while the client was stopped, and its copy %s "
                "is compressed: %s of it are not shipped",
                pos.source_id,
                shown,
                ", ".join(f"{display_path(p)} ({kind})" for p, kind, _ in compressed),
                owed,
            )
            for path, kind, _ in compressed:
                self._not_shipped(
                    path,
                    pos.log_type,
                    f"a {kind}-compressed copy of {shown} (truncated while the client was "
                    f"stopped): {owed} of it are not shipped",
                )
        elif compressed:
            log.info(
                "source %s (%s) was truncated while the client was stopped; its compressed "
                "copy %s holds nothing after the %d bytes acked",
                pos.source_id,
                shown,
                ", ".join(display_path(p) for p, _, _ in compressed),
                pos.acked,
            )
        else:
            (log.error if pos.size > pos.acked else log.warning)(
                "source %s (%s) was truncated while the client was stopped (size now %d) and "
                "no copy of it is in %s: %s of it are not shipped; its new contents are "
                "shipped as a new source",
                pos.source_id,
                shown,
                size_now,
                " or ".join(display_path(d) for d in directories),
                owed,
            )
        return None

    def _head_of(self, path: str) -> tuple[str, str | None] | None:
        """(compressor or "", fingerprint of its first line, decompressed) of the regular
        file at ``path``, None if it is not one or cannot be read; kept for the pass (by
        inode, size and time), so that a directory's files are read once for all the
        sources truncated in it."""
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._heads:
            return self._heads[key]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            kind = compression_of(fd)
            fingerprint = (
                compressed_fingerprint(fd, kind) if kind else read_fingerprint(fd, final=True)
            )
        finally:
            os.close(fd)
        self._heads[key] = kind, fingerprint
        return kind, fingerprint

    def _retire_truncated(self, pos: SourcePosition) -> None:
        """Record that the file of ``pos`` was truncated while its source goes on from its
        copy: new contents with the same first line get the next generation (``_known_as``)."""
        self.state.retired.append(_retired(pos, "truncated", pos.size, pos.path))

    def _known_identities(self) -> set[tuple[int, int, str]]:
        """The identities of the files tailed, of the state's sources and of those held."""
        known = {t.identity.key for t in self.files.values()}
        known.update((p.dev, p.ino, p.fingerprint) for p in self.state.sources.values())
        known.update((p.dev, p.ino, p.fingerprint) for p in self.on_hold.values())
        return known

    def _not_shipped(self, path: str, log_type: str, why: str) -> None:
        """Name ``path`` as a file whose lines are not shipped, for the rest of the run (its
        size is not shown: that of a compressed file, or of a copy, is not what it owes)."""
        self.not_shipped[path] = Unreadable(path, log_type, why, time.time())

    def _ship_rotated_while_stopped(self) -> list[TailedFile]:
        """Ship the files rotated from the name of a source while the client was stopped,
        which no entry matches (see :meth:`_rotated_while_stopped`), in the source's directory
        and in its entry's ``olddir``."""
        scans, self._stopped_rotations = self._stopped_rotations, []
        # (directory, name) of each original -> its entry and log type
        originals: dict[tuple[str, str], tuple[Entry, str]] = {}
        for pos, entry in scans:
            originals.setdefault(os.path.split(pos.first_path), (entry, pos.log_type))
        # each directory to look through -> the originals whose rotated files may be there,
        # by name (an absolute olddir may be shared by the logs of several directories)
        looked: dict[str, dict[str, list[str]]] = {}
        for (directory, original), (entry, _) in originals.items():
            for where in rotated_dirs(directory, entry.olddir):
                owners = looked.setdefault(where, {}).setdefault(original, [])
                if directory not in owners:
                    owners.append(directory)
        rotated: dict[tuple[str, str], list[str]] = {}
        for where, names in looked.items():
            try:
                with os.scandir(where) as it:
                    listed = sorted(e.name for e in it)
            except OSError:
                continue
            for name in listed:
                rotated_of = rotated_from(name, names)
                if rotated_of is None:
                    continue
                path = os.path.join(where, name)
                owners = names[rotated_of]
                if len(owners) == 1:
                    rotated.setdefault((owners[0], rotated_of), []).append(path)
                elif self._unseen_rotation(path) is not None:
                    self._cannot_tell_whose(path, rotated_of, owners, originals)
        found: list[TailedFile] = []
        for (directory, name), paths in rotated.items():
            entry, log_type = originals[(directory, name)]
            found.extend(self._rotated_while_stopped(directory, name, paths, entry, log_type))
        return found

    def _cannot_tell_whose(
        self,
        path: str,
        original: str,
        owners: list[str],
        originals: dict[tuple[str, str], tuple[Entry, str]],
    ) -> None:
        """``path``, in an olddir shared by the logs named ``original`` of the directories
        ``owners``, rotated while the client was stopped: which one's cannot be told, so it
        is not shipped (said, and named)."""
        logs = " or ".join(display_path(os.path.join(d, original)) for d in owners)
        why = (
            f"rotated from {logs} while the client was stopped (an olddir they share): which "
            f"one's cannot be told, so its lines are not shipped"
        )
        log.error("%s %s", display_path(path), why)
        self._not_shipped(path, originals[(owners[0], original)][1], why)

    def _unseen_rotation(self, path: str) -> os.stat_result | None:
        """``path``'s ``lstat`` if it may be a file rotated while the client was stopped: a
        regular file no entry matches (a file an entry matches is the entries' to find, as it
        always was), not named already, not tailed, modified after the state's last save
        (the coarse clock of file times allowed for); else None."""
        if path in self.not_shipped or any(_matches(e, path) for e in self.config.entries):
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_mtime < self._stopped_since - 1.0
            or (st.st_dev, st.st_ino) in self.by_inode
        ):
            return None
        return st

    def _rotated_while_stopped(
        self, directory: str, original: str, paths: list[str], entry: Entry, log_type: str
    ) -> list[TailedFile]:
        """The files of ``paths`` (named ``original`` of ``directory`` with a rotation suffix,
        in ``directory`` or an olddir of ``entry``) rotated while the client was stopped and
        never seen by it, tailed from their start (oldest first) as draining files, let go
        once read.

        Several rotations while the client is stopped leave files it never saw between the
        source it knew (found by its inode) and the file at the source's name now: with the
        usual glob (``*.log``) no entry matches their names, and their lines were lost
        without a word.  Such a file is ``original`` with a rotation suffix (``.2``, ``.0``,
        ``-20261127``, or before its extension: ``app.2.log``), in its directory or in an
        ``olddir`` of its entry, matched by no entry (a file an entry matches is the entries' to
        find, as it always was), a regular file, modified after the state was last saved
        (the last moment the client is known to have run), of an identity (device, inode,
        first line) the client does not know.

        What could ship a line twice, and why it does not:

        - the file was shipped before under its own identity (rotated away in the last
          moments before a crash, after the last save): its source id is made from that
          identity, so the gateway's last seqno resumes it where the log ends;
        - it is a file the client knows (tailed, in the state, held): skipped by identity;
          one let go after rotation goes on only if it grew since (``_known_as``);
        - it is a copy of a file shipped before (logrotate's ``copy``, a copytruncate's
          copy, a backup), a new inode with the same bytes: a file with the first line of
          a source tailed now is shipped only if it is not the start of that source's file
          (nor that file its start); one whose first line is only that of sources that
          cannot be compared (let go, held) is not shipped but named as an error;
        - two such files are copies of each other: the shorter one, the start of the
          longer, is not shipped;
        - an old rotated file (kept by ``rotate N``) or a copy restored from a backup with
          its old time: modified before the state's last save, so not taken.

        A compressed one, or one that cannot be read, is not shipped: it is named as an
        error in the log and shown as unreadable (``--status``, metrics) for the run.
        """
        known = self._known_identities()
        comparable = [t for t in self.files.values() if t.fd >= 0 and t.phase is not Phase.DONE]
        retired_keys = {(r.dev, r.ino, r.fingerprint) for r in self.state.retired}
        unsure = {r.fingerprint: r.source_id for r in self.state.retired}
        unsure.update((p.fingerprint, p.source_id) for p in self.on_hold.values())
        stopped = f"rotated from {original} while the client was stopped"
        directories = set(rotated_dirs(directory, entry.olddir))
        candidates: list[tuple[int, int, str, FileIdentity, int]] = []
        for path in paths:
            st = self._unseen_rotation(path)
            if st is None:
                continue
            shown = display_path(path)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
            except OSError as exc:
                why = f"{stopped}; it cannot be read ({exc.strerror}): not shipped"
                log.error("%s %s", shown, why)
                self._not_shipped(path, log_type, why)
                continue
            kind = compression_of(fd)
            fingerprint = None if kind else read_fingerprint(fd, final=True)
            identity = FileIdentity(st.st_dev, st.st_ino, fingerprint or "")
            twin = None
            if fingerprint is not None and identity.key not in retired_keys:
                twin = self._twin(fd, st.st_size, comparable)
            why = ""
            if kind:
                why = self._compressed_owes(path, fd, kind, stopped, directories)
            elif fingerprint is None or identity.key in known:
                pass  # empty, or a file the client knows: nothing to say
            elif identity.key in retired_keys:
                # let go before: it goes on only if it grew since (``_known_as``)
                candidates.append((st.st_mtime_ns, st.st_size, path, identity, fd))
                continue
            elif twin is not None and twin[1] == "copy":
                log.info(
                    "%s (%s) is a copy of %s, shipped as source %s: not shipped again",
                    shown,
                    stopped,
                    display_path(twin[0].path),
                    twin[0].source_id,
                )
            elif twin is not None and twin[1] == "holds":
                why = (
                    f"{stopped}; it holds the lines of {display_path(twin[0].path)} (source "
                    f"{twin[0].source_id}) and more: not shipped, they would be twice"
                )
            elif twin is None and fingerprint in unsure:
                why = (
                    f"{stopped}; it starts with the first line of source {unsure[fingerprint]}, "
                    f"shipped before, and may be a copy of it: not shipped"
                )
            else:
                candidates.append((st.st_mtime_ns, st.st_size, path, identity, fd))
                continue
            os.close(fd)
            if why:
                log.error("%s %s", shown, why)
                self._not_shipped(path, log_type, why)
        found: list[TailedFile] = []
        for _, size, path, identity, fd in sorted(candidates):
            longer = next(
                (
                    c
                    for c in candidates
                    if c[3].fingerprint == identity.fingerprint
                    and c[2] != path
                    and c[1] >= size
                    and holds_prefix(c[4], fd, size)
                    and (c[1], c[2]) > (size, path)
                ),
                None,
            )
            known_as = None if longer is not None else self._known_as(identity, size, log_type)
            if known_as is None:
                if longer is not None:
                    log.info(
                        "%s (%s) is the start of %s: shipped with it",
                        display_path(path),
                        stopped,
                        display_path(longer[2]),
                    )
                continue
            tailed = self._found(
                entry, fd, path, os.path.join(directory, original), identity, known_as
            )
            tailed.phase = Phase.DRAINING
            tailed.rotated_at = time.monotonic()
            self.counters.rotations += 1
            found.append(tailed)
            log.warning(
                "%s was %s (modified %s, after the client's last save at %s) and no entry "
                "matches its name: shipping it from its start as source %s, then letting it go",
                display_path(path),
                stopped,
                time.strftime("%H:%M:%S", time.localtime(os.fstat(fd).st_mtime)),
                time.strftime("%H:%M:%S", time.localtime(self._stopped_since)),
                tailed.source_id,
            )
        for _, _, _, _, fd in candidates:
            if not any(t.fd == fd for t in found):
                os.close(fd)
        return found

    def _compressed_owes(
        self, path: str, fd: int, kind: str, stopped: str, directories: set[str]
    ) -> str:
        """Why the compressed file at ``path`` (open as ``fd``), rotated while the client was
        stopped, is not shipped; "" when it holds only bytes shipped before (its first line is
        that of one source last seen in ``directories``, the log's and its olddirs, of which
        at least as many bytes were acknowledged as it holds: logrotate's ``compress``
        without ``delaycompress``)."""
        why = f"{stopped} and compressed ({kind}): its lines are not shipped"
        fingerprint = compressed_fingerprint(fd, kind)
        records: list[SourcePosition | RetiredSource] = [
            *self.state.sources.values(),
            *self.on_hold.values(),
            *self.state.retired,
        ]
        positions = [
            (r.source_id, r.acked)
            for r in records
            if r.fingerprint == fingerprint and os.path.dirname(r.path) in directories
        ]
        if fingerprint is None or len({source_id for source_id, _ in positions}) != 1:
            return why
        source_id, acked = positions[0][0], max(acked for _, acked in positions)
        held = decompressed_size(fd, kind)
        if held is not None and held <= acked:
            log.info(
                "%s (%s and compressed) holds only the first %d bytes of source %s, shipped",
                display_path(path),
                stopped,
                held,
                source_id,
            )
            return ""
        shown = "" if held is None else f" bytes {acked}..{held} of"
        return f"{stopped} and compressed ({kind}):{shown} source {source_id} not shipped"

    def _twin(
        self, fd: int, size: int, comparable: list[TailedFile]
    ) -> tuple[TailedFile, str] | None:
        """A tailed file with the same first line as the open file ``fd`` (``size`` bytes),
        and how they relate: ``copy`` (``fd`` is its start, or all of it), ``holds`` (it is
        the start of ``fd``), ``differs``; None if no tailed file has that first line."""
        fingerprint = read_fingerprint(fd, final=True)
        twin: tuple[TailedFile, str] | None = None
        for tailed in comparable:
            if tailed.identity.fingerprint != fingerprint:
                continue
            try:
                other = os.fstat(tailed.fd).st_size
            except OSError:
                continue
            if size <= other and holds_prefix(tailed.fd, fd, size):
                return tailed, "copy"
            if size > other and holds_prefix(fd, tailed.fd, other):
                return tailed, "holds"
            twin = tailed, "differs"
        return twin

    def discover(self) -> list[TailedFile]:
        """Pick up files matching the entries that are not tailed yet; return them."""
        found: list[TailedFile] = []
        self.waiting_paths.clear()
        # Rebuilt by each rescan; self.unreadable keeps the last one's until the end, so
        # that an error already said is not said again.
        unreadable: dict[str, Unreadable] = {}
        self._inodes_by_entry.clear()
        for pos in list(self.on_hold.values()):
            resumed = self._resume(pos, unreadable)
            if resumed is not None:
                found.append(resumed)
        found.extend(self._ship_rotated_while_stopped())
        self._heads.clear()
        open_files, budget = self._descriptors()
        unreachable: list[Unreachable] = []
        shipped_before: dict[tuple[int, int], int] | None = None
        # A file let go because no entry matched it, put back before its last requests were
        # answered: found now, it would be a new source, its lines twice.  Once let go, the
        # next rescan takes it up as the same source (``_known_as``).
        letting_go = {
            (t.identity.dev, t.identity.ino)
            for t in self.files.values()
            if t.phase is Phase.CLOSING and t.retire_reason == "unconfigured"
        }
        for cand in expand(self.config.entries, unreachable):
            key = (cand.dev, cand.ino)
            if key in self.by_inode or key in self.on_hold or key in letting_go:
                continue
            self.watcher.watch(os.path.dirname(cand.path))
            try:
                if open_files >= budget:
                    # Every file tailed holds a descriptor; taking the last ones would leave
                    # none for the gateways' connections, and nothing would ship at all.
                    raise OSError(
                        errno.EMFILE,
                        f"{open_files} files are open, the most this process may hold beside "
                        f"its connections (raise ulimit -n, LimitNOFILE in the unit)",
                    )
                fd = os.open(cand.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # gone since it was matched: nothing to say
                    if shipped_before is None:
                        shipped_before = self._retired_acked()
                    acked = shipped_before.get((cand.dev, cand.ino), 0)
                    unreadable[cand.path] = self._unreadable(
                        cand.path, cand.entry.log_type, exc, acked, cand.size
                    )
                continue
            st = os.fstat(fd)
            fingerprint = read_fingerprint(fd)
            if (st.st_dev, st.st_ino) != (cand.dev, cand.ino) or fingerprint is None:
                os.close(fd)
                self.waiting_paths.add(cand.path)
                continue
            identity = FileIdentity(cand.dev, cand.ino, fingerprint)
            known = self._known_as(identity, st.st_size, cand.entry.log_type)
            if known is None:
                os.close(fd)
                continue
            tailed = self._found(cand.entry, fd, cand.path, cand.path, identity, known)
            found.append(tailed)
            open_files += 1
        tailed_paths = (
            {t.path for t in self.files.values() if t.phase is not Phase.DONE}
            if unreachable
            else set()
        )
        for miss in unreachable:
            if miss.path in tailed_paths:
                continue  # read through its descriptor; named by refresh_all (path_error)
            unreadable.setdefault(
                miss.path, self._unreadable(miss.path, miss.entry.log_type, miss.error, 0, None)
            )
        unreadable.update(self.not_shipped)
        self.unreadable = unreadable
        return found

    def _retired_acked(self) -> dict[tuple[int, int], int]:
        """Where each retired source's acknowledged data ended, by (dev, inode): what a
        rotated file that became unreadable still owes is its size less this."""
        return {(r.dev, r.ino): r.acked for r in self.state.retired}

    def _descriptors(self) -> tuple[int, int]:
        """(files open now, how many files may be open): the limit of open descriptors less
        a reserve for connections, the state and status files, inotify and the like."""
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
        reserve = min(max(64, soft // 8), soft // 2)
        return sum(1 for t in self.files.values() if t.fd >= 0), soft - reserve

    def _unreadable(
        self, path: str, log_type: str, exc: OSError, acked: int, size: int | None
    ) -> Unreadable:
        """A matched file that cannot be opened: said once per error, never skipped silently
        (a file the client has no permission on would otherwise never be shipped, unseen)."""
        error = exc.strerror or str(exc)
        known = self.unreadable.get(path)
        if known is None or known.error != error:
            log.warning(
                "cannot read %s: %s; it is not shipped until it can be read (tried again every "
                "%.0f s)",
                display_path(path),
                error,
                self.config.rescan_interval_s,
            )
        return self._still_unreadable(path, log_type, error, acked, size, errno_name(exc))

    def _still_unreadable(
        self, path: str, log_type: str, error: str, acked: int, size: int | None, code: str
    ) -> Unreadable:
        """``path``'s entry of :attr:`unreadable`, keeping since when if the error is the same."""
        known = self.unreadable.get(path)
        since = known.since if known is not None and known.error == error else time.time()
        return Unreadable(path, log_type, error, since, acked, size, code)

    def follow_renames(self, moves: list[tuple[str, str]], now: float) -> None:
        """Files renamed away from a matched path that we had not picked up yet (rotated
        faster than we looked) are read from their new name, to their end."""
        for old_path, new_path in moves:
            entry = next((e for e in self.config.entries if _matches(e, old_path)), None)
            if entry is None:
                continue
            try:
                fd = os.open(new_path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            st = os.fstat(fd)
            fingerprint = read_fingerprint(fd, final=True)
            if (st.st_dev, st.st_ino) in self.by_inode or fingerprint is None:
                os.close(fd)
                continue
            identity = FileIdentity(st.st_dev, st.st_ino, fingerprint)
            known = self._known_as(identity, st.st_size, entry.log_type)
            if known is None:
                os.close(fd)
                continue
            tailed = self._found(entry, fd, new_path, old_path, identity, known)
            tailed.phase = Phase.DRAINING
            tailed.rotated_at = now
            self.counters.rotations += 1
            log.info("%s was renamed to %s before it was picked up; reading it", old_path, new_path)

    def _found(
        self,
        entry: Entry,
        fd: int,
        path: str,
        first_path: str,
        identity: FileIdentity,
        known: tuple[int, RetiredSource | None],
    ) -> TailedFile:
        generation, retired = known
        if retired is None:
            return self.new_file(entry, fd, path, first_path, identity, generation)
        tailed = self.new_file(entry, fd, path, first_path, identity, generation, retired.source_id)
        if self.multi:
            tailed.handover.frontier = retired.acked
        return tailed

    def _known_as(
        self, identity: FileIdentity, size: int, log_type: str
    ) -> tuple[int, RetiredSource | None] | None:
        """The generation a newly found file gets, and the retired source it continues.

        None when it is a file already let go that has not grown since: it is skipped.  A file
        let go after rotation that grew since (its writer kept appending) is the same source
        again: it continues from where the gateway holds it.  So is a file let go because no
        entry matched it any more (an entry left out for a run, or removed by a reload) once
        an entry of the same log type matches it again.  The same identity after a
        truncation or deletion (inode reused, same first line) is new content: it gets the
        next generation so its seqnos start afresh.
        """
        generation = 0
        latest: RetiredSource | None = None
        for retired in self.state.retired:
            if (retired.dev, retired.ino, retired.fingerprint) != identity.key:
                continue
            generation = max(generation, retired.generation + 1)
            latest = retired
        if latest is not None and latest.reason == "rotated" and size >= latest.size:
            if size == latest.size:
                return None
            self.abandoned.forget(identity.dev, identity.ino)
            log.info(
                "a rotated file let go before grew again; shipping it on as %s", latest.source_id
            )
            return latest.generation, latest
        if (
            latest is not None
            and latest.reason == "unconfigured"
            and latest.log_type == log_type
            and size >= latest.size
        ):
            log.info(
                "%s is matched by an entry again; shipping it on as %s",
                display_path(latest.path),
                latest.source_id,
            )
            return latest.generation, latest
        for tailed in self.files.values():
            if tailed.identity == identity:
                generation = max(generation, tailed.generation + 1)
        return generation, None

    def new_file(
        self,
        entry: Entry,
        fd: int,
        path: str,
        first_path: str,
        identity: FileIdentity,
        generation: int,
        source_id: str | None = None,
    ) -> TailedFile:
        if source_id is None:
            source_id = make_source_id(self.config.host, identity, generation)
        tailed = TailedFile(
            entry=entry,
            fd=fd,
            path=path,
            first_path=first_path,
            identity=identity,
            generation=generation,
            source_id=source_id,
            host=self.config.host,
            chunk_bytes=self.config.chunk_bytes,
            max_line_bytes=self.config.max_line_bytes,
            multiline_timeout_s=self.config.multiline_timeout_s,
        )
        self.files[source_id] = tailed
        self.by_inode[(identity.dev, identity.ino)] = tailed
        self.unsaved_sources = True
        self.watcher.watch(os.path.dirname(path))
        log.info("tailing %s as source %s", path, source_id)
        return tailed

    # -- watching -------------------------------------------------------------------------------
    def refresh_all(self, now: float, *, watched_too: bool = True) -> None:
        """Look at every file again (see ``TailedFile.refresh``) and act on what changed.

        ``watched_too=False``: only the files whose changes inotify may not report: those
        renamed away (the writer may go on writing them in a directory not watched) and
        those whose directory is not watched.  The others are looked at on their events.
        """
        watcher = self.watcher
        for tailed in list(self.files.values()):
            if tailed.phase in (Phase.CLOSING, Phase.DONE):
                continue
            if (
                not watched_too
                and tailed.phase is Phase.ACTIVE
                and tailed.path_error is None
                and watcher.watching(os.path.dirname(tailed.path))
            ):
                continue
            try:
                change = tailed.refresh(now)
            except OSError as exc:
                self._cannot_look_at(tailed, exc)
                continue
            if tailed.path_error is not None:
                log.info("%s can be looked at again; its rotation is noticed again", tailed.path)
                tailed.path_error = None
            if change == "rotated":
                tailed.phase = Phase.DRAINING
                tailed.rotated_at = now
                self.counters.rotations += 1
                # The rotated file keeps its place in by_inode: if a glob matches its new
                # name, it is still this source and not a new file.
                try:
                    moved = self._find_rotated(
                        tailed.path,
                        tailed.first_path,
                        tailed.entry,
                        tailed.identity.dev,
                        tailed.identity.ino,
                    )
                except OSError:
                    moved = None
                if moved is None and _deleted(tailed.fd):
                    # not "rotated away": an operator looking for the file would look for it
                    log.info(
                        "%s was deleted; reading it to its end through its open descriptor",
                        tailed.path,
                    )
                else:
                    log.info(
                        "%s was rotated away%s; reading it as long as it grows",
                        tailed.path,
                        f" to {moved}" if moved else "",
                    )
                if moved is not None:
                    tailed.path = moved
                self.discover()
            elif change == "truncated":
                self.on_truncated(tailed)

    def _cannot_look_at(self, tailed: TailedFile, exc: OSError) -> None:
        """Its path cannot be looked at (its directory lost search permission): said once
        when it starts, once when it ends, and shown until then (status, lag report,
        metrics).  Its open descriptor is still read, and a truncation still noticed; a
        rotation is not, until the path can be looked at again."""
        error = exc.strerror or str(exc)
        if tailed.path_error is not None and tailed.path_error[0] == error:
            return
        tailed.path_error = PathError(error, time.time(), errno_name(exc))
        log.warning(
            "cannot stat %s: %s; reading on through its open descriptor, but a rotation is "
            "not noticed until it can be looked at again",
            tailed.path,
            error,
        )

    def on_truncated(self, tailed: TailedFile) -> None:
        """The bytes after our position are not the ones we were reading: a new source.

        With copytruncate this is where the window shows: lines appended after our last read
        and before the truncation are only in the copy, and lines written between the copy
        and the truncation are nowhere.  No tailer can ship them; rename rotation has no such
        window.  What we read before the truncation is still sent under the old source.
        """
        self.counters.truncations += 1
        try:
            size_now = str(os.fstat(tailed.fd).st_size)
        except OSError:
            size_now = "unknown"
        log.warning(
            "%s was truncated or replaced at byte %d (size now %s); shipping its new contents "
            "as a new source",
            tailed.path,
            tailed.read_pos,
            size_now,
        )
        self.close_source(tailed, "truncated")
        self.discover()

    def close_source(self, tailed: TailedFile, reason: str) -> None:
        """Read no more of ``tailed``; send what was read, then let it go (``reason``)."""
        tailed.phase = Phase.CLOSING
        tailed.retire_reason = reason
        key = (tailed.identity.dev, tailed.identity.ino)
        if self.by_inode.get(key) is tailed:
            del self.by_inode[key]

    # -- reading --------------------------------------------------------------------------------
    def read_all(self, now: float) -> None:
        counters = self.counters
        room = self.config.memory_bytes - counters.buffered
        per_file_cap = 2 * self.config.request_bytes
        for tailed in self.files.values():
            if room <= 0:
                break
            if not tailed.wants_read():
                continue
            held = tailed.pending_bytes + tailed.in_flight_bytes
            budget = min(room, per_file_cap - held)
            if budget <= 0:
                continue
            chunks_before = len(tailed.pending)
            try:
                cut = tailed.read(budget, now)
            except OSError as exc:
                log.warning("cannot read %s: %s", tailed.path, exc)
                continue
            if tailed.entry.codec != "raw":
                # Compress while earlier chunks are on the wire, not when the request is made.
                for index in range(chunks_before, len(tailed.pending)):
                    chunk = tailed.pending[index]
                    chunk.encoded = self.compressors.submit(
                        compress, tailed.entry.codec, chunk.data
                    )
                    chunk.encoded_with = tailed.entry.codec
            if cut:
                if not counters.first_read_at:
                    counters.first_read_at = time.time()
                room -= cut
                counters.buffered += cut
                counters.read_bytes += cut
                counters.last_activity = now

    # -- letting go -----------------------------------------------------------------------------
    def let_go_of_quiet_files(self, now: float) -> None:
        for tailed in list(self.files.values()):
            if tailed.phase is Phase.DRAINING and tailed.session_ready:
                if tailed.handover.doubts or tailed.read_limit is not None:
                    continue  # bytes of it may still have to be sent: keep it open
                if not self.let_go.quiet_enough(tailed.fd, now - tailed.quiet_since()):
                    continue
                if tailed.read_pos < tailed.size and tailed.idle:
                    # The writer moved on: a last line without its newline is sent as is.
                    cut = tailed.read(tailed.size - tailed.read_pos + 1, now, final=True)
                    self.counters.buffered += cut
                    self.counters.read_bytes += cut
                if tailed.read_pos >= tailed.size and tailed.idle:
                    st = os.fstat(tailed.fd)
                    tailed.retire_reason = "rotated" if st.st_nlink > 0 else "deleted"
                    self.retire(tailed)
            elif tailed.phase is Phase.CLOSING and tailed.idle:
                self.retire(tailed)

    def retire(self, tailed: TailedFile) -> None:
        log.info(
            "letting go of %s (%s) at byte %d", tailed.path, tailed.retire_reason, tailed.settled
        )
        for doubt in tailed.handover.doubts:
            log.error(
                "%s: bytes %d..%d were in flight to %s when it went down and the file is %s: "
                "they may be lost",
                tailed.path,
                doubt.start,
                doubt.end,
                doubt.installation,
                tailed.retire_reason,
            )
        retired = self.counters.retired
        retired[tailed.retire_reason] = retired.get(tailed.retire_reason, 0) + 1
        pos = self.position_of(tailed)
        self._retire_position(pos, tailed.retire_reason, tailed.size, tailed.path)
        if tailed.retire_reason == "rotated":
            self.abandoned.watch(
                tailed.path, tailed.identity.dev, tailed.identity.ino, tailed.size, time.monotonic()
            )
        key = (tailed.identity.dev, tailed.identity.ino)
        if self.by_inode.get(key) is tailed:
            del self.by_inode[key]
        del self.files[tailed.source_id]
        tailed.close()
        self.on_retired()

    def _retire_position(self, pos: SourcePosition, reason: str, size: int, path: str) -> None:
        self.state.sources.pop(pos.source_id, None)
        self.state.retired.append(_retired(pos, reason, size, path))

    def check_abandoned(self, now: float) -> None:
        """Count bytes written to rotated files after they were let go (never silently lost)."""
        entries = self.config.entries
        self.abandoned.check(now, lambda path: any(_matches(e, path) for e in entries))

    def prune_retired(self) -> None:
        horizon = time.time() - _RETIRED_KEEP_S
        kept = [r for r in self.state.retired if r.retired_at >= horizon]
        self.state.retired = kept[-_RETIRED_KEEP_COUNT:]

    # -- positions ------------------------------------------------------------------------------
    def position_of(self, tailed: TailedFile) -> SourcePosition:
        plan = tailed.handover
        return SourcePosition(
            source_id=tailed.source_id,
            entry_path=tailed.entry.path,
            first_path=tailed.first_path,
            path=tailed.path,
            dev=tailed.identity.dev,
            ino=tailed.identity.ino,
            fingerprint=tailed.identity.fingerprint,
            generation=tailed.generation,
            log_type=tailed.entry.log_type,
            codec=tailed.entry.codec,
            acked=tailed.settled,
            size=tailed.size,
            pending_since=tailed.pending_since,
            draining=tailed.phase is Phase.DRAINING,
            installation=plan.installation,
            doubts=[d.as_list() for d in plan.doubts],
        )

    def sync_state_positions(self) -> None:
        """Copy acked positions into the state.  Only acked positions: never ahead of the log."""
        for tailed in self.files.values():
            if tailed.phase is Phase.DONE:
                continue
            known = self.state.sources.get(tailed.source_id)
            if not tailed.session_ready and known is not None and not self.multi:
                # Not asked yet: acked is not known in this run; keep what the state says.
                continue
            self.state.sources[tailed.source_id] = self.position_of(tailed)

    # -- configuration --------------------------------------------------------------------------
    def apply_config(self, config: PushConfig) -> None:
        """A reloaded configuration: a file still matched by an entry of its log type goes on
        as the same source, however the entry's path is spelled now and whatever its codec; the
        others are closed (what was read is still sent) and, if an entry still matches
        them, found again under it as new sources."""
        self.config = config
        self.let_go = LetGoPolicy(config.rotate_wait_s, config.rotated_grace_s)
        self._inodes_by_entry.clear()
        for tailed in list(self.files.values()):
            if tailed.phase in (Phase.CLOSING, Phase.DONE):
                continue
            old = tailed.entry
            entry, matching = self._entry_going_on(
                old.path,
                (tailed.path, tailed.first_path),
                (tailed.identity.dev, tailed.identity.ino),
                old.log_type,
            )
            if entry is not None:
                if entry.path != old.path:
                    log.info(
                        "%s is now matched by entry %s (it was by %s): it goes on as source %s",
                        tailed.path,
                        entry.path,
                        old.path,
                        tailed.source_id,
                    )
                if entry.codec != old.codec:
                    log.info(
                        "%s: entry %s gives it codec %s (it was %s): it goes on as source %s",
                        tailed.path,
                        entry.path,
                        entry.codec,
                        old.codec,
                        tailed.source_id,
                    )
                tailed.use_entry(entry)
                continue
            log.info(
                "%s: %s; closing its source %s",
                tailed.path,
                _why_unconfigured(old.log_type, matching),
                tailed.source_id,
            )
            self.counters.buffered -= tailed.drop_pending()
            self.close_source(tailed, "unconfigured")

    def close(self) -> None:
        for tailed in self.files.values():
            if tailed.fd >= 0:
                os.close(tailed.fd)


def _retired(pos: SourcePosition, reason: str, size: int, path: str) -> RetiredSource:
    """The state's record of a source let go (``reason``) at ``size`` bytes of ``path``."""
    return RetiredSource(
        source_id=pos.source_id,
        dev=pos.dev,
        ino=pos.ino,
        fingerprint=pos.fingerprint,
        generation=pos.generation,
        reason=reason,
        retired_at=time.time(),
        size=size,
        path=path,
        acked=pos.acked,
        log_type=pos.log_type,
    )


def _deleted(fd: int) -> bool:
    """Whether the open file has no name left (its last link was removed)."""
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return False
