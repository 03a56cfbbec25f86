"""Power cuts, replayed: what the files would hold if the power went at any point of a run.

A run traced with ``powercut_shim.c`` (``LD_PRELOAD``) leaves a journal of every change made
to the files under some root directories and every sync.  :class:`Disk` replays the journal
on a model of a file system that keeps only what was synced:

* a file's contents survive as of its last ``fsync``/``fdatasync`` (a file never synced is
  empty), whatever was written after;
* a directory's entries (files created, renamed, removed; directories made) survive as of the
  directory's last ``fsync``; an entry never synced is gone, and with it its whole subtree.

That is the least a POSIX file system promises, and what ext4 and XFS give in their worse
cases.  :func:`power_cuts` walks a journal and yields the disk as a power cut just before each
sync would leave it (between two syncs nothing more becomes durable, and the latest such point
has seen the most acknowledgements), with the acknowledgements the traced programs recorded by
then (``K`` records, see :func:`mark`).  ``drop_sync`` replays the same run as if the program
had not made some of its syncs: a test proves it would notice a missing sync that way.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

SHIM_SOURCE = Path(__file__).with_name("powercut_shim.c")
_SYNCS = (b"S", b"D", b"A")


def build_shim(cache_dir: Path) -> Path:
    """Compile the shim with gcc (once per source version) and return the library's path."""
    digest = hashlib.sha256(SHIM_SOURCE.read_bytes()).hexdigest()[:12]
    library = cache_dir / f"powercut-{digest}.so"
    if not library.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        building = library.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(
            ["gcc", "-O2", "-shared", "-fPIC", "-o", str(building), str(SHIM_SOURCE), "-ldl"],
            check=True,
            capture_output=True,
        )
        os.replace(building, library)
    return library


def traced_env(library: Path, journal: Path, roots: list[Path]) -> dict[str, str]:
    """The environment of a process whose changes under ``roots`` go to ``journal``."""
    return {
        **os.environ,
        "LD_PRELOAD": str(library),
        "POWERCUT_LOG": str(journal),
        "POWERCUT_ROOTS": ":".join(str(r) for r in roots),
    }


def mark(journal_fd: int, text: str) -> None:
    """Record an acknowledgement in the journal, after what it acknowledges (one write)."""
    if "\n" in text or "\t" in text:
        raise ValueError("a mark is one line without tabs")
    os.write(journal_fd, f"K\t{text}\n".encode())


@dataclass(frozen=True, slots=True)
class Record:
    op: bytes
    fields: tuple[str, ...]
    data: bytes = b""


def read_journal(path: Path) -> list[Record]:
    raw = path.read_bytes()
    records: list[Record] = []
    pos = 0
    while pos < len(raw):
        end = raw.index(b"\n", pos)
        op, *fields = raw[pos:end].split(b"\t")
        pos = end + 1
        data = b""
        if op == b"W":
            length = int(fields[2])
            data = raw[pos : pos + length]
            if len(data) != length:
                raise ValueError("the journal ends inside a write")
            pos += length
        records.append(Record(op, tuple(f.decode() for f in fields), data))
    return records


@dataclass(eq=False)
class _File:
    name: str  # where it was created: what a dropped sync is chosen by
    volatile: bytearray = field(default_factory=bytearray)
    durable: bytes = b""


@dataclass(eq=False)
class _Dir:
    path: str
    volatile: dict[str, _File | _Dir] = field(default_factory=dict)
    durable: dict[str, _File | _Dir] = field(default_factory=dict)


SyncFilter = Callable[[str], bool]
"""Given the path of a synced file (as created) or directory: True drops that sync."""


class Disk:
    """The model file system of the traced roots (which must be empty when tracing starts)."""

    def __init__(self, roots: list[Path], drop_sync: SyncFilter | None = None) -> None:
        self._roots = {str(r): _Dir(str(r)) for r in roots}
        self._files: dict[str, _File] = {}  # by inode number, as last bound
        self._dirs: list[_Dir] = list(self._roots.values())
        self._drop = drop_sync or (lambda _path: False)

    def _parent(self, path: str) -> tuple[_Dir, str]:
        for root_path, root in self._roots.items():
            if path.startswith(root_path + "/"):
                *parts, name = path[len(root_path) + 1 :].split("/")
                directory = root
                for part in parts:
                    entry = directory.volatile[part]
                    if not isinstance(entry, _Dir):
                        raise ValueError(f"{path}: {part} is not a directory")
                    directory = entry
                return directory, name
        raise ValueError(f"{path} is not under a traced root")

    def _lookup(self, path: str) -> _File | _Dir:
        if path in self._roots:
            return self._roots[path]
        parent, name = self._parent(path)
        return parent.volatile[name]

    def apply(self, record: Record) -> None:
        op, f = record.op, record.fields
        if op == b"C":
            parent, name = self._parent(f[1])
            created = _File(f[1])
            parent.volatile[name] = created
            self._files[f[0]] = created
        elif op == b"O":
            entry = self._lookup(f[1])
            if not isinstance(entry, _File):
                raise ValueError(f"{f[1]} opened as a file is a directory")
            self._files[f[0]] = entry
        elif op == b"W":
            content = self._files[f[0]].volatile
            offset = int(f[1])
            if len(content) < offset:
                content.extend(bytes(offset - len(content)))
            content[offset : offset + len(record.data)] = record.data
        elif op == b"T":
            content = self._files[f[0]].volatile
            size = int(f[1])
            if len(content) > size:
                del content[size:]
            else:
                content.extend(bytes(size - len(content)))
        elif op == b"S":
            synced = self._files[f[0]]
            if not self._drop(synced.name):
                synced.durable = bytes(synced.volatile)
        elif op == b"D":
            directory = self._lookup(f[0])
            if not isinstance(directory, _Dir):
                raise ValueError(f"{f[0]} synced as a directory is a file")
            if not self._drop(f[0]):
                directory.durable = dict(directory.volatile)
        elif op == b"R":
            old_parent, old_name = self._parent(f[0])
            new_parent, new_name = self._parent(f[1])
            new_parent.volatile[new_name] = old_parent.volatile.pop(old_name)
        elif op in (b"U", b"X"):
            parent, name = self._parent(f[0])
            del parent.volatile[name]
        elif op == b"M":
            parent, name = self._parent(f[0])
            made = _Dir(f[0])
            parent.volatile[name] = made
            self._dirs.append(made)
        elif op == b"A":
            for known in self._files.values():
                known.durable = bytes(known.volatile)
            for directory in self._dirs:
                directory.durable = dict(directory.volatile)
        elif op != b"K":
            raise ValueError(f"unknown journal record {op!r}")

    def materialize(self, into: Path) -> dict[Path, Path]:
        """Write what survives the cut under ``into``; returns each root's new place.

        SQLite's ``-shm`` files are left out: they are rebuilt from the WAL on open, and
        their contents are written through memory maps, which the shim does not see.
        """
        placed: dict[Path, Path] = {}
        for i, (root_path, root) in enumerate(self._roots.items()):
            target = into / f"root{i}"
            target.mkdir(parents=True)
            _write_tree(root, target)
            placed[Path(root_path)] = target
        return placed


def _write_tree(directory: _Dir, target: Path) -> None:
    for name, entry in directory.durable.items():
        if isinstance(entry, _Dir):
            (target / name).mkdir()
            _write_tree(entry, target / name)
        elif not name.endswith("-shm"):
            (target / name).write_bytes(entry.durable)


@dataclass(frozen=True)
class PowerCut:
    """The disk as a cut just before journal record ``index`` leaves it, and what was acked."""

    index: int
    marks: tuple[str, ...]
    disk: Disk


def power_cuts(
    records: list[Record],
    roots: list[Path],
    *,
    drop_sync: SyncFilter | None = None,
    every: int = 1,
) -> Iterator[PowerCut]:
    """The disk at a cut before every ``every``-th sync of the run, and at its end.

    The same :class:`Disk` object is yielded each time, moved on: use it before the next.
    """
    disk = Disk(roots, drop_sync)
    marks: list[str] = []
    syncs = 0
    for index, record in enumerate(records):
        if record.op in _SYNCS:
            if syncs % every == 0:
                yield PowerCut(index, tuple(marks), disk)
            syncs += 1
        elif record.op == b"K":
            marks.append(record.fields[0])
        disk.apply(record)
    yield PowerCut(len(records), tuple(marks), disk)
