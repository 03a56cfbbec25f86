"""Directory entries that survive a power cut.

A new file or directory is reachable after a power cut only once its parent directory was
fsynced after the entry appeared (an fsync of the file itself does not promise that).  The
store creates its directories and database files through these two functions.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(path: Path) -> None:
    """Make the entries of ``path`` (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directories(path: Path) -> bool:
    """Create ``path`` and its missing parents durably; True if anything was created."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    if not missing:
        return False
    path.mkdir(parents=True, exist_ok=True)
    for created in reversed(missing):
        fsync_directory(created.parent)
    return True
