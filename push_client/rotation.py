"""When a rotated file is let go, and what is written to it afterwards.

A writer that keeps its descriptor after a rename rotation goes on appending to the renamed
file until it reopens its log, which can take minutes (a daemon that reopens on SIGHUP, a
logger that checks its path once a minute).  So a file renamed away is read for as long as it
grows, and let go only when it has been quiet for ``rotated_grace_s`` (5 minutes by default).
A deleted file can only be written through descriptors opened before, which writers close
soon: it is let go once read to its end and quiet for ``rotate_wait_s`` (2 s).

Whatever is appended to a renamed file after it was let go is not shipped.  That loss is never
silent: the file stays watched (by ``stat``, a while longer) and every byte it grows by is
counted (``logbroker_push_abandoned_bytes_total``) and logged.

Rotations while the client is stopped leave files it never saw beside the source it knew:
the copy of a copytruncate, the files rotated in between by several rename rotations.  The
helpers at the end tell those files apart (rotated names, compressed files, copies); what is
done with them is ``FileSet``'s (``push_client.files``).
"""

from __future__ import annotations

import bz2
import glob
import gzip
import logging
import lzma
import os
import re
import zlib
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any, BinaryIO

import zstandard

from push_client.discovery import find_inode
from push_client.identity import FINGERPRINT_BYTES, fingerprint_of

log = logging.getLogger("logbroker.push")

WATCH_AFTER_LET_GO_S = 3600.0
CHECK_EVERY_S = 5.0


class LetGoPolicy:
    """How long a rotated file must be quiet before it is let go."""

    def __init__(self, rotate_wait_s: float, rotated_grace_s: float) -> None:
        self.rotate_wait_s = rotate_wait_s
        self.rotated_grace_s = rotated_grace_s

    def quiet_enough(self, fd: int, quiet_for_s: float) -> bool:
        """Whether a rotated file (open as ``fd``) quiet for ``quiet_for_s`` may be let go."""
        if quiet_for_s < self.rotate_wait_s:
            return False
        deleted = os.fstat(fd).st_nlink == 0
        return deleted or quiet_for_s >= self.rotated_grace_s


@dataclass
class _Watched:
    path: str
    dev: int
    ino: int
    size: int
    until: float


class AbandonedBytes:
    """Renamed files that were let go, watched for late writes nobody will ship."""

    def __init__(self) -> None:
        self.total = 0
        self._watched: dict[tuple[int, int], _Watched] = {}
        self._next_check = 0.0

    def watch(self, path: str, dev: int, ino: int, size: int, now: float) -> None:
        self._watched[(dev, ino)] = _Watched(path, dev, ino, size, now + WATCH_AFTER_LET_GO_S)

    def forget(self, dev: int, ino: int) -> None:
        """The file is tailed again (a glob matched it): its bytes are shipped after all."""
        self._watched.pop((dev, ino), None)

    def check(self, now: float, matched: Callable[[str], bool]) -> None:
        """Count what the watched files grew by; ``matched(path)``: an entry's glob matches
        the path, so the file is picked up again and what it grew by is shipped after all."""
        if now < self._next_check or not self._watched:
            return
        self._next_check = now + CHECK_EVERY_S
        for key, item in list(self._watched.items()):
            size = _size_of(item)
            if size is None or now >= item.until:
                del self._watched[key]
                continue
            if size > item.size and matched(item.path):
                del self._watched[key]
                continue
            if size > item.size:
                grown = size - item.size
                self.total += grown
                log.error(
                    "%d bytes were written to %s after it was let go (quiet for the rotated "
                    "grace); they are not shipped: raise rotated_grace_s or make the writer "
                    "reopen its log sooner",
                    grown,
                    item.path,
                )
            item.size = max(item.size, size)


def _size_of(item: _Watched) -> int | None:
    """The watched file's size now, following one more rename in its directory."""
    for path in (item.path, find_inode(os.path.dirname(item.path), item.dev, item.ino)):
        if path is None:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (item.dev, item.ino):
            item.path = path
            return st.st_size
    return None


# -- rotated while the client was stopped -------------------------------------------------------
_ROTATED_SUFFIX = re.compile(r"[._-][0-9][0-9._-]*(\.(gz|bz2|xz|zst|Z))?")
"""What rotation appends to a log's name: ``.1``, ``.0`` (logrotate's ``start 0``),
``-20261127``, ``.2026-11-27``, ``-20261127-1764230000``, each possibly followed by the
compressor's extension."""
_NUMBERING = re.compile(r"[._-][0-9][0-9._-]*")
_COMPRESSED_EXTENSION = re.compile(r"\.(gz|bz2|xz|zst|Z)")

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\xfd7zXZ\x00", "xz"),
)


def rotated_from(name: str, originals: Container[str]) -> str | None:
    """The name among ``originals`` that ``name`` is with a rotation suffix, the longest;
    None if none.

    The suffix follows the name (``app.log.2``, ``app.log.0``, ``app.log-20261127``,
    ``app.log.1.gz`` are ``app.log``'s), or, with logrotate's ``extension``, comes before the
    name's last extension (``app.1.log``, ``app-20261127.log``, ``app.1.log.gz``).  Looked up
    by the places a suffix may start, so that a directory is listed once for all the sources
    of it (thousands, at a restart after a clean-up) and not once each.
    """
    for start in range(len(name) - 2, 0, -1):
        if (
            name[start] in "._-"
            and name[start + 1].isdigit()
            and name[:start] in originals
            and _ROTATED_SUFFIX.fullmatch(name, start) is not None
        ):
            return name[:start]
    compressed = _COMPRESSED_EXTENSION.search(name)
    plain = name[: compressed.start()] if compressed and compressed.end() == len(name) else name
    stem, dot, extension = plain.rpartition(".")
    if not dot or not extension or extension.isdigit():
        return None
    for start in range(len(stem) - 2, 0, -1):
        original = f"{stem[:start]}.{extension}"
        if (
            stem[start] in "._-"
            and stem[start + 1].isdigit()
            and original in originals
            and _NUMBERING.fullmatch(stem, start) is not None
        ):
            return original
    return None


def rotated_dirs(directory: str, olddirs: tuple[str, ...]) -> list[str]:
    """Where the rotated files of a log of ``directory`` may be: ``directory`` itself, then
    each of an entry's ``olddirs`` (logrotate's ``olddir``: relative to ``directory`` unless
    absolute; a glob names every directory it matches), those that exist."""
    found = [directory]
    for olddir in olddirs:
        named = os.path.expanduser(olddir)
        if glob.has_magic(named):
            matched = sorted(glob.glob(os.path.join(glob.escape(directory), named)))
        else:
            matched = [os.path.join(directory, named)]
        for path in matched:
            path = os.path.normpath(path)
            if path not in found and os.path.isdir(path):
                found.append(path)
    return found


def compression_of(fd: int) -> str:
    """The compressor whose magic number starts the open file ("" for a plain file)."""
    head = os.pread(fd, 6, 0)
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[3:4] != b"0":
        return "bzip2"
    return next((name for magic, name in _MAGIC if head.startswith(magic)), "")


_OPENERS: dict[str, Callable[[BinaryIO], Any]] = {
    "gzip": lambda raw: gzip.GzipFile(fileobj=raw),
    "bzip2": bz2.BZ2File,
    "xz": lzma.LZMAFile,
    "zstd": lambda raw: zstandard.ZstdDecompressor().stream_reader(raw),
}
_DECOMPRESS_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error, zstandard.ZstdError)


def _decompressed(fd: int, kind: str, limit: int | None) -> tuple[bytes, int] | None:
    """(its first ``FINGERPRINT_BYTES`` bytes, how many bytes it holds, read up to ``limit``)
    of the open compressed file once decompressed; None if it cannot be."""
    head = b""
    size = 0
    try:
        with os.fdopen(os.dup(fd), "rb") as raw, _OPENERS[kind](raw) as stream:
            raw.seek(0)
            while limit is None or size < limit:
                block = stream.read(FINGERPRINT_BYTES if size < FINGERPRINT_BYTES else 1 << 20)
                if not block:
                    break
                if len(head) < FINGERPRINT_BYTES:
                    head += block[: FINGERPRINT_BYTES - len(head)]
                size += len(block)
    except _DECOMPRESS_ERRORS:
        return None
    return head, size


def compressed_fingerprint(fd: int, kind: str) -> str | None:
    """The fingerprint of what the open compressed file starts with once decompressed (None
    when it cannot be decompressed): a compressed copy of a source is still named as one."""
    found = _decompressed(fd, kind, FINGERPRINT_BYTES)
    return None if found is None else fingerprint_of(found[0], final=True)


def decompressed_size(fd: int, kind: str) -> int | None:
    """How many bytes the open compressed file holds (read through once, in blocks); None
    if it cannot be decompressed: which bytes of a source it holds, to name them."""
    found = _decompressed(fd, kind, None)
    return None if found is None else found[1]


def holds_prefix(longer_fd: int, shorter_fd: int, length: int) -> bool:
    """Whether the first ``length`` bytes of both open files are the same (one is a copy of
    the other, or of its beginning)."""
    block = 1 << 20
    offset = 0
    while offset < length:
        want = min(block, length - offset)
        a = os.pread(longer_fd, want, offset)
        if len(a) != want or a != os.pread(shorter_fd, want, offset):
            return False
        offset += want
    return True
