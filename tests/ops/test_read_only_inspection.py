"""``audit`` and ``topics list``/``describe`` only read a store: they open it read-only, so a
store on a read-only file system can be inspected, and a store on a writable one is left
byte for byte and mtime for mtime as it was (SQLite's empty ``-wal``/``-shm``
reader files aside)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.audit.test_audit_windows_cli import publish
from tests.conftest import REPO, logbroker_cmd
from tests.ops.test_audit_and_topics_cli import write_admitted

INSPECTIONS = (
    ("audit",),
    ("topics", "list"),
    ("topics", "describe", "dc1.access"),
    ("audit", "--windows"),
)


def inspect(
    data_dir: Path, command: tuple[str, ...], tmp: Path
) -> subprocess.CompletedProcess[str]:
    name, *rest = command
    extra = ["--db", str(tmp / "audit.db")] if "--windows" in rest else []
    return subprocess.run(
        logbroker_cmd(name, "--data-dir", str(data_dir), *rest, *extra),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def make_store(data_dir: Path) -> None:
    """A store holding a topic's records and an audit window of it."""
    write_admitted(data_dir, "src-a", [10, 20, 30])
    publish(data_dir, "gateway", "gw-1", 30)


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """The store's own files under ``root``: mtime and bytes.

    SQLite's ``-wal`` and ``-shm`` files of a WAL database are left out: a reader needs the
    ``-shm`` index and makes it (with an empty ``-wal``) where it may; they hold no data.
    Directories are left out with them (making those files changes their mtime).
    """
    return {
        str(path.relative_to(root)): (path.stat().st_mtime_ns, path.read_bytes())
        for path in root.rglob("*")
        if path.is_file() and not path.name.endswith(("-wal", "-shm"))
    }


def sidecars(root: Path) -> dict[str, int]:
    """SQLite's ``-wal`` files under ``root`` and their sizes: a reader leaves them empty."""
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*-wal")}


@contextlib.contextmanager
def read_only_view(source: Path, target: Path) -> Iterator[Path]:
    """``source`` seen through a read-only bind mount (as a file system the kernel remounted
    read-only after an error, or a snapshot mounted for inspection)."""
    target.mkdir()
    bound = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip(f"no bind mount here: {bound.stderr.decode().strip()}")
    try:
        ro = subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(target)], capture_output=True, check=False
        )
        if ro.returncode != 0:
            pytest.skip(f"no read-only remount here: {ro.stderr.decode().strip()}")
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=False)


def test_audit_and_topics_read_a_store_on_a_read_only_file_system(tmp_path: Path) -> None:
    make_store(tmp_path / "fs" / "store")
    with read_only_view(tmp_path / "fs", tmp_path / "ro") as ro:
        assert not os.access(ro / "store", os.W_OK)
        for command in INSPECTIONS:
            done = inspect(ro / "store", command, tmp_path)
            assert done.returncode == 0, (command, done.stdout + done.stderr)
            if command[0] == "topics":
                assert "dc1.access" in done.stdout and "3" in done.stdout
            elif "--windows" not in command:
                assert "audit: OK" in done.stdout


def test_inspecting_a_store_changes_no_byte_and_no_mtime_under_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    make_store(store)
    before = tree(store)
    for command in INSPECTIONS[:2]:  # describe opens the store as list does
        done = inspect(store, command, tmp_path)
        assert done.returncode == 0, (command, done.stdout + done.stderr)
        assert tree(store) == before, command
        assert set(sidecars(store).values()) <= {0}, command
